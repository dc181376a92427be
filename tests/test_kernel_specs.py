"""Kernel specs are the one source of each kernel's runtime signature: the spec must match the
kernel, the generated C++ launchers must follow the spec, and an op that fills a launcher
wrongly must fail the C++ build, not the first launch."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="the kernel specs live beside the Triton kernels")

from aot_build import emit, grid, launchers  # noqa: E402
from triton_src import KERNELS  # noqa: E402
from triton_src.forward import attn_fwd  # noqa: E402
from triton_src.spec import KernelSpec, f32, i32, tensor  # noqa: E402
from triton_src.variants import SCORE_MODS, score_mod_name, score_mod_value  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def test_every_configured_kernel_has_a_spec_and_the_reverse():
    assert set(KERNELS) == set(grid.load_config()["kernels"])


def test_spec_that_disagrees_with_its_kernel_is_rejected():
    with pytest.raises(TypeError, match=r"attn_fwd: the spec declares runtime parameters"):
        KernelSpec(attn_fwd, [tensor("Q"), tensor("K"), tensor("V"), i32("seqlen_q"), f32("qk_scale")])


def test_spec_launch_names_missing_and_unknown_arguments():
    spec = KERNELS["attn_merge"]
    with pytest.raises(TypeError, match=r"missing arguments \['Lses'.*unknown arguments \['Lsez'\]"):
        spec.launch((1,), Outs=None, Lsez=None)


@pytest.fixture(scope="module")
def header():
    return emit._launchers_h(grid.load_config())


def _struct_fields(header: str, struct: str) -> list[str]:
    body = header[header.index(f"struct {struct} {{"):]
    return re.findall(r"\s(\w+);", body[:body.index("};")])


def test_launcher_args_follow_each_spec_in_order(header):
    for name, spec in KERNELS.items():
        body = header[header.index(f"struct {name} {{"):]
        args = body[body.index("struct Args {"):body.index("};")]
        fields = re.findall(r"\s(\w+);", args)
        assert fields == [item.name for item in spec.items], name
        for g in spec.groups:
            assert _struct_fields(header, g.struct) == [p.name for p in g.params], g.name
        # The launch hands cuLaunchKernel every parameter in the kernel's order, groups unfolded;
        # a kernel with map-able tensors has a second form for the variants that take maps, each
        # map-able tensor's pointer then replaced by its map's nine parameters (Triton's ABI).
        launch = header[header.index(f"inline void launch_{name}("):]
        launch = launch[:launch.index("\n}")]
        maps_form, _, pointers_form = launch.rpartition("    return;\n  }") if spec.maps else ("", "", launch)
        slots = [path.removesuffix(".value").split(".")[-1] for path in re.findall(r"\(&([\w.]+)\)", pointers_form)]
        assert slots == [p.name for p in spec.params], name
        if spec.maps:
            want = []
            for p in spec.params:
                if p in spec.maps:
                    want += [f"map_{p.name}.map", *(f"map_{p.name}.{field}[{d}]" for field in ("shape", "strides")
                                                   for d in range(4))]
                else:
                    want.append(p.name)
            slots = [path.removesuffix(".value").split(".")[-1] if not path.startswith("map_") else path
                     for path in re.findall(r"\(&([\w.\[\]]+)\)", maps_form)]
            assert slots == want, name


def test_attention_kernels_take_the_shared_groups():
    # What the forward and both backward passes read alike is one group each, not a copy per kernel.
    from triton_src import arguments

    shared = {arguments.SEQUENCES, arguments.SHAPE, arguments.WINDOW, arguments.ALIBI, arguments.SEGMENTS,
              arguments.SCORES, arguments.BIAS, arguments.DROPOUT}
    for name in ("attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq"):
        assert shared <= set(KERNELS[name].groups), name
    assert {arguments.WINDOW, arguments.SCORES, arguments.SINKS} <= set(KERNELS["attn_decode_split"].groups)


def test_groups_taken_out_of_the_agreed_order_or_twice_are_rejected():
    from triton_src import arguments
    from triton_src.spec import f32_tensor, strides

    spec = KERNELS["attn_fwd"]
    own = [p for p in spec.items if not hasattr(p, "rank")]
    groups = list(spec.groups)
    swapped = groups[:2] + [groups[3], groups[2]] + groups[4:]
    with pytest.raises(TypeError, match=r"the agreed order is \[.*'window', 'alibi'"):
        KernelSpec(attn_fwd, own + swapped)
    with pytest.raises(TypeError, match=r"\['stride_lseb', 'stride_lseh'\] named twice"):
        KernelSpec(attn_fwd, own + [*strides("lse", "bh", aligned=False)] + groups)
    assert arguments.WINDOW.struct == "WindowArgs" and f32_tensor("Lse").is_pointer


def test_table_flag_keys_match_the_launchers_packing(header):
    # attn_fwd's flags_key packs SCORE_MOD in byte 0, TILE_LOOP in byte 1, FP8 in byte 2, HOST_MAPS in
    # byte 3 and the derived PAD_D after them.
    cfg = grid.load_config()["kernels"]["attn_fwd"]
    plain, alibi_only = score_mod_value("plain"), score_mod_value("alibi_only")
    base = {"SCORE_MOD": plain, "TILE_LOOP": 0, "FP8": 0, "HOST_MAPS": 0, "PAD_D": 0}
    assert launchers.flags_key(cfg, {**base, "SCORE_MOD": alibi_only}) == alibi_only
    assert launchers.flags_key(cfg, {**base, "TILE_LOOP": 1}) == 256
    assert launchers.flags_key(cfg, {**base, "FP8": 2}) == 2 << 16
    assert launchers.flags_key(cfg, {**base, "HOST_MAPS": 1}) == 1 << 24
    assert launchers.flags_key(cfg, {**base, "PAD_D": 1}) == 1 << 32
    assert ("(uint64_t(f.SCORE_MOD.value) << 0) | (uint64_t(f.TILE_LOOP.value) << 8) | (uint64_t(f.FP8.value) << 16) "
            "| (uint64_t(f.HOST_MAPS.value) << 24) | (uint64_t(pad_d) << 32)") in header


MERGE_CALL = """
#include "kernel_launchers.h"
void call(const fattn::runtime::Variant<fattn::kernels::attn_merge>& v) {
  fattn::kernels::launch_attn_merge(v, {1, 1, 1}, {
      .Outs = nullptr, .Lses = nullptr, .Out = nullptr, .Lse = nullptr,
      .stride_ps = 0, .stride_pb = 0, .stride_pq = 0, .stride_ph = 0, .stride_ob = 0, .stride_oq = 0,
      .stride_oh = 0, .num_splits = 1, .seqlen_q = 1, .num_heads = 1%s});
}
"""


def _compile_against(tmp_path, header, source):
    """g++ on `source` with the generated header; no warning flags: a missing argument must be a
    hard error of the types themselves."""
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("no g++")
    (tmp_path / "kernel_launchers.h").write_text(header)
    src = tmp_path / "call.cpp"
    src.write_text(source)
    return subprocess.run([cxx, "-std=c++20", f"-I{tmp_path}", f"-I{ROOT / 'csrc'}", "-c", str(src), "-o",
                           str(tmp_path / "call.o")], capture_output=True, text=True)


FORWARD_CALL = """
#include "kernel_launchers.h"
void call(const fattn::runtime::Variant<fattn::kernels::attn_fwd>& v, fattn::kernels::attn_fwd::Args a) {
  fattn::kernels::attn_fwd::Args b{%s};
  fattn::kernels::launch_attn_fwd(v, {1, 1, 1}, b);
}
"""


@pytest.mark.parametrize("fill, ok", [
    ("a", True),
    ("a.Q, a.K", False),  # the rest left out: every own argument and group is Required
])
def test_a_group_cannot_be_left_out(tmp_path, header, fill, ok):
    run = _compile_against(tmp_path, header, FORWARD_CALL % fill)
    assert (run.returncode == 0) == ok, run.stderr


@pytest.mark.parametrize("tail, error", [
    (", .head_dim = 64", None),
    ("", r"attn_merge::Args|Required"),
    (", .head_dimm = 64", r"head_dimm|attn_merge::Args"),
])
def test_a_wrongly_filled_launcher_fails_the_build(tmp_path, header, tail, error):
    run = _compile_against(tmp_path, header, MERGE_CALL % tail)
    if error is None:
        assert run.returncode == 0, run.stderr
    else:
        assert run.returncode != 0 and re.search(error, run.stderr), run.stderr


FLAGS_CALL = """
#include "kernel_launchers.h"
uint64_t key() { return fattn::kernels::attn_fwd::flags_key(%s, false); }
"""


@pytest.mark.parametrize("flags, ok", [
    ("{.SCORE_MOD = fattn::kernels::score_mod::kSoftcapAlibi, .TILE_LOOP = false, .FP8 = 0, .HOST_MAPS = false}", True),
    ("{.SCORE_MOD = fattn::kernels::score_mod::kSoftcapAlibi, .TILE_LOOP = false, .FP8 = 0}", False),
    ("{.SCORE_MOD = fattn::kernels::score_mod::kSoftcapAlibi, .TILE_LOOP = false}", False), ("{}", False)])
def test_flags_cannot_be_left_out(tmp_path, header, flags, ok):
    run = _compile_against(tmp_path, header, FLAGS_CALL % flags)
    assert (run.returncode == 0) == ok, run.stderr


def test_every_implementation_keeps_its_familys_contract():
    from triton_src import IMPLEMENTATIONS

    config = grid.load_config()["kernels"]
    used = set()
    for family, kcfg in config.items():
        for impl in kcfg.get("implementations", []):
            spec = IMPLEMENTATIONS[impl["kernel"]]
            used.add(impl["kernel"])
            assert spec.params == KERNELS[family].params, impl["kernel"]
            assert spec.constexprs == KERNELS[family].constexprs, impl["kernel"]
            assert spec.kernel.fn.__module__ == impl["source"], impl["kernel"]
    assert used == set(IMPLEMENTATIONS), "an implementation configs.json never builds"


def test_the_python_launch_gives_fewer_programs_only_to_kernels_that_loop():
    # tuning/launch.py's forward: `programs` shortens the grid's first axis; a kernel whose programs
    # run one query tile each would leave the others unwritten, so it is refused before a launch.
    import torch

    from triton_src.forward import ATTN_FWD
    from triton_src.forward_sm90 import ATTN_FWD_SM90
    from tuning import launch

    q = torch.zeros(1, 256, 2, 64)
    tiles = launch.Tiles(128, 128, 4, 1)
    with pytest.raises(ValueError, match="attn_fwd runs one query tile per program"):
        launch.forward(q, q, q, tiles, spec=ATTN_FWD, programs=1)
    with pytest.raises(ValueError, match="attn_fwd_sm90 takes one or more"):
        launch.forward(q, q, q, tiles, spec=ATTN_FWD_SM90, programs=0)


def test_the_python_launch_gives_maps_only_of_dense_tensors_to_kernels_that_take_them():
    # tuning/launch.py: `maps` turns a call into its HOST_MAPS variant's. A map covers a dense
    # [batch, seqlen, heads, head_dim] tensor, and a kernel with no map-able tensor has no such
    # variant: both are refused before a launch, for the forward and both backward passes.
    import torch

    from triton_src.backward import ATTN_BWD_PREPROCESS
    from triton_src.backward_dq_sm90 import ATTN_BWD_DQ_SM90
    from triton_src.backward_sm90 import ATTN_BWD_DKDV_SM90
    from tuning import launch

    q = torch.zeros(1, 256, 2, 64)
    lse = torch.zeros(1, 2, 256)
    tiles = launch.Tiles(64, 128, 4, 1)
    packed = launch.Packing(torch.tensor([0, 256], dtype=torch.int32), torch.tensor([0, 256], dtype=torch.int32),
                            256, 256)
    with pytest.raises(ValueError, match="attn_bwd_dkdv_sm90 takes maps of dense tensors"):
        launch.backward_dkdv(q[0], q[0], q[0], q[0], lse[0], lse[0], tiles, packing=packed,
                             spec=ATTN_BWD_DKDV_SM90, maps=True)
    with pytest.raises(ValueError, match="attn_bwd_dq_sm90 takes maps of dense tensors"):
        launch.backward_dq(q[0], q[0], q[0], q[0], lse[0], lse[0], tiles, packing=packed, spec=ATTN_BWD_DQ_SM90,
                           maps=True)
    with pytest.raises(ValueError, match="attn_bwd_preprocess takes none"):
        launch.forward(q, q, q, tiles, spec=ATTN_BWD_PREPROCESS, maps=True)


def test_score_mod_variants_are_named_in_one_table(header):
    # triton_src/variants.py names SCORE_MOD's values; configs.json spells them by name, grid.py
    # turns them into the kernels' integers, and the header gives C++ the same names.
    assert [m.value for m in SCORE_MODS] == list(range(len(SCORE_MODS)))  # the table keys' values, unchanged
    assert all(score_mod_name(score_mod_value(m.name)) == m.name for m in SCORE_MODS)
    for m in SCORE_MODS:
        assert f"  {m.cpp} = {m.value}," in header, m.cpp
    assert "namespace score_mod {\nenum Value : int64_t {" in header
    config = grid.load_config()
    assert config["kernels"]["attn_fwd"]["flags"]["SCORE_MOD"] == [m.name for m in SCORE_MODS]
    for bad in ("bias", 2):
        config["kernels"]["attn_bwd_dq"]["exclude"][0]["flags"]["SCORE_MOD"] = bad
        with pytest.raises(grid.GridError, match=r"attn_bwd_dq exclude SCORE_MOD: .*triton_src/variants.py names"):
            grid.expand(config, {"FATTN_CUDA_ARCHS": "90", "FATTN_HEAD_DIMS": "128"})


def test_no_score_mod_is_spelt_as_a_number():
    # Outside triton_src/variants.py the kernels compare SCORE_MOD with its named constexprs and
    # configs.json names the variants: a number (or SCORE_MOD's truth value) would be a variant
    # without a name again.
    numeric = re.compile(r"SCORE_MOD\s*(==|!=|<=|>=|<|>)\s*\d|\bif (not )?SCORE_MOD\s*:|SCORE_MOD\"\s*:\s*\[?\s*\d")
    sources = [p for p in (ROOT / "triton_src").glob("*.py") if p.name != "variants.py"]
    for path in sources + [ROOT / "aot_build" / "configs.json"]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            assert not numeric.search(line), f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
