"""The build-time compiler: grid expansion, knobs, cache, shared-memory limits, emitted table."""

import dataclasses
import hashlib
import itertools
import json
import os
import re
import struct
import subprocess
import time
from pathlib import Path

import pytest

from aot_build import grid
from aot_build.__main__ import build
from aot_build.compiler import BuildError, compile_variant
from triton_src.variants import score_mod_value

# SCORE_MOD's values as the variants carry them (triton_src/variants.py names them).
PLAIN, SOFTCAP_ALIBI, BIAS_DROPOUT, ALIBI_ONLY, BIAS_TMA = (
    score_mod_value(name) for name in ("plain", "softcap_alibi", "bias_dropout", "alibi_only", "bias_tma"))

pytestmark = pytest.mark.slow  # the slow tier (-m slow): compiles kernel grids

ELF_MACHINE_CUDA = 190


def test_default_grid_covers_every_arch_dtype_bucket_and_flag():
    variants = grid.expand(env={})
    config = grid.load_config()
    expected = 0
    for name, kcfg in config["kernels"].items():
        per_kernel = 0
        # A kernel without head-dim buckets is built once per arch and dtype, as bucket 0.
        for arch, bucket, *flags in itertools.product([75, 80, 86, 89, 90], kcfg.get("head_dim_buckets", [0]),
                                                      *kcfg["flags"].values()):
            flags = dict(zip(kcfg["flags"], flags))
            for dtype in kcfg["dtypes"]:
                def left_out(arch):
                    return any(arch in e.get("archs", [arch]) and bucket in e.get("buckets", [bucket])
                               and dtype in e.get("dtypes", [dtype])
                               and all(flags[f] in (want if isinstance(want, list) else [want])
                                       for f, want in e["flags"].items())
                               for e in kcfg.get("exclude", []))
                # sm_89 builds only what sm_86 lacks (configs.json served_by).
                per_kernel += 0 if left_out(arch) or (arch == 89 and not left_out(86)) else 1
        assert sum(v.kernel == name for v in variants) == per_kernel, name
        expected += per_kernel
    assert len(variants) == expected
    # sm_75 builds no wide decoding tile (configs.json "exclude"): 2 dtypes x 4 buckets x PAGED x WIDE 1/2;
    # the FP8 caches' (KV_FP8 1, 2) only on sm_89 and sm_90, the decoding tile, both head-dim codes;
    # PAGE_TILES for the 16-bit paged caches: the decoding tile on every arch, the wide ones where built.
    assert sum(v.kernel == "attn_decode_split" for v in variants) == (4 * 2 * 4 * 2 * 3 - 2 * 4 * 2 * 2
                                                                      + 2 * 2 * 4 * 2 * 2 * 2 + 4 * 2 * 4
                                                                      + 3 * 2 * 4 * 2)
    page_tiles = [v for v in variants if v.constant_dict.get("PAGE_TILES")]
    assert {(v.constant_dict["PAGED"], v.constant_dict["WIDE"], v.constant_dict["KV_FP8"]) for v in page_tiles} == {
        (True, 0, 0), (True, 1, 0), (True, 2, 0)}
    fp8 = [v for v in variants if v.constant_dict.get("KV_FP8", 0) != 0]
    assert {v.arch for v in fp8} == {89, 90} and {v.kernel for v in fp8} == {"attn_decode_split", "kv_append"}
    # sm_89 holds the FP8 variants alone: everything else on an 8.9 GPU runs sm_86's cubins.
    assert {v.kernel for v in variants if v.arch == 89} == {"attn_fwd", "attn_decode_split", "kv_append",
                                                           "fp8_transpose_v"}
    assert all(v.constant_dict.get("FP8", 0) or v.constant_dict.get("KV_FP8", 0) or v.kernel == "fp8_transpose_v"
               for v in variants if v.arch == 89)
    assert all(v.constant_dict.get("WIDE", 0) == 0 for v in fp8)
    # The large families build only the padded head-dim code (it serves exact dims too, the
    # chooser falls back to it: common/kernel_choice.h); the small ones both, and so does the
    # decode split for FP8 caches (the exact-dim code's loads are wider: configs.json).
    large = {"attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq", "attn_decode_split"}
    assert {v.constant_dict["PAD_D"] for v in variants if v.kernel in large and v not in fp8} == {True}
    bucketed = [v for v in variants if v.kernel not in large and v.kernel not in ("segment_spans", "fp8_transpose_v")]
    assert {v.constant_dict["PAD_D"] for v in bucketed} == {False, True}
    # segment_spans reads int32 ids alone: no head dim, one variant per arch.
    spans = [v for v in variants if v.kernel == "segment_spans"]
    assert len(spans) == 4 and all("BLOCK_D" not in v.constant_dict for v in spans)
    assert grid.expand(env={"FATTN_CUDA_ARCHS": "all"}) == variants
    assert {v.arch for v in variants} == {75, 80, 86, 89, 90}
    assert {v.kernel for v in variants} == {"attn_fwd", "attn_bwd_preprocess", "attn_bwd_dkdv", "attn_bwd_dq",
                                            "segment_spans", "attn_merge", "attn_decode_split", "attn_decode_merge",
                                            "kv_append", "rotate_queries", "fp8_transpose_v"}
    # FP8's V^T kernel: once per arch with FP8 tensor cores.
    assert [v.arch for v in variants if v.kernel == "fp8_transpose_v"] == [89, 90]
    assert len({(v.kernel, v.arch, v.dtype, v.constants) for v in variants}) == len(variants)


def test_knobs_narrow_the_grid():
    variants = grid.expand(env={"FATTN_CUDA_ARCHS": "80;sm_90", "FATTN_HEAD_DIMS": "80,64"})
    assert {v.arch for v in variants} == {80, 90}
    # head dim 80 is served by the 128 bucket, and on sm_90 by attn_fwd's and attn_bwd_dkdv's 96
    # bucket (the Hopper kernels' alone), 64 by its own; the head dims do not narrow a kernel
    # without buckets.
    assert {v.constant_dict.get("BLOCK_D") for v in variants} == {64, 96, 128, None}
    assert {(v.arch, v.implementation) for v in variants if v.constant_dict.get("BLOCK_D") == 96} \
        == {(90, "attn_fwd_sm90"), (90, "attn_bwd_dkdv_sm90")}
    assert {v.arch for v in variants if v.kernel == "attn_fwd" and v.constant_dict["BLOCK_D"] == 128} == {80, 90}
    assert {v.arch for v in variants if v.kernel == "segment_spans"} == {80, 90}


@pytest.mark.parametrize("env", [{"FATTN_CUDA_ARCHS": "70"}, {"FATTN_CUDA_ARCHS": "eighty"},
                                 {"FATTN_HEAD_DIMS": "512"}])
def test_bad_knobs_are_errors(env):
    with pytest.raises(grid.GridError):
        grid.expand(env=env)


def test_served_arch_builds_only_what_the_serving_arch_lacks(tmp_path):
    # configs.json served_by: with sm_86 in the build, sm_89 gets the variants whose lookup key
    # (kernel, dtype, bucket, flags) sm_86 has none of, the FP8 ones; built alone, everything.
    def keyed(variants, arch):
        return {(v.kernel, v.dtype, v.constants) for v in variants if v.arch == arch}

    both = grid.expand(env={"FATTN_CUDA_ARCHS": "86;89"})
    alone = grid.expand(env={"FATTN_CUDA_ARCHS": "89"})
    sm86 = grid.expand(env={"FATTN_CUDA_ARCHS": "86"})
    assert keyed(both, 86) == keyed(sm86, 86)
    assert keyed(both, 89) == keyed(alone, 89) - {(k, d, c) for k, d, c in keyed(sm86, 86)}
    assert keyed(both, 89) and all(dict(c).get("FP8", 0) or dict(c).get("KV_FP8", 0) or k == "fp8_transpose_v"
                                   for k, _, c in keyed(both, 89))
    assert len(alone) == len(sm86) + len(keyed(both, 89))
    assert grid.served_archs(grid.load_config(), [86, 89, 90]) == {89: 86}
    assert grid.served_archs(grid.load_config(), [89, 90]) == {}

    # An sm_89 tile that differs from sm_86's would never be built: a build error.
    config = json.loads(grid.CONFIG_PATH.read_text())
    config["kernels"]["attn_merge"]["configs"]["89"] = {"default": {"BLOCK_M": 32, "num_warps": 2, "num_stages": 1}}
    with pytest.raises(grid.GridError, match=r"attn_merge sm89 .* differs from attn_merge sm86 .*served_by"):
        grid.expand(config, {"FATTN_CUDA_ARCHS": "86;89"})
    assert any(v.arch == 89 and v.kernel == "attn_merge" for v in grid.expand(config, {"FATTN_CUDA_ARCHS": "89"}))
    config["served_by"] = {"86": {"arch": 89}}
    with pytest.raises(grid.GridError, match="served_by: sm86 by sm89"):
        grid.expand(config, {"FATTN_CUDA_ARCHS": "86;89"})


def test_ptx_archs_knob():
    every = [75, 80, 86, 89, 90]
    # By default only the PTX a GPU newer than every cubin can run: the newest arch but sm_90,
    # and not one that another arch serves (sm_89 beside sm_86 holds FP8 variants alone).
    assert grid.ptx_archs(every, {}) == [89]
    assert grid.ptx_archs(every, {}, {89: 86}) == [86]
    assert grid.ptx_archs([80, 90], {"FATTN_PTX_ARCHS": "newest"}) == [80]
    assert grid.ptx_archs([90], {}) == []
    assert grid.ptx_archs(every, {"FATTN_PTX_ARCHS": "all"}) == every
    assert grid.ptx_archs(every, {"FATTN_PTX_ARCHS": "none"}) == []
    assert grid.ptx_archs(every, {"FATTN_PTX_ARCHS": "sm_75,80"}) == [75, 80]
    for bad in ("86", "eighty", ""):
        with pytest.raises(grid.GridError, match="FATTN_PTX_ARCHS"):
            grid.ptx_archs([80, 90], {"FATTN_PTX_ARCHS": bad})


def test_tuned_tiles_fill_the_grid_and_may_not_repeat_configs_json(tmp_path):
    # The tuner's file supplies a (kernel, arch, bucket) tile that configs.json leaves out; one
    # that both files give is refused, so each tile is written once.
    tuned = {"arch": 80, "kernels": {"attn_fwd": {"64": {"chosen": {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 2,
                                                                   "num_stages": 1}}}}}
    (tmp_path / "sm80.json").write_text(json.dumps(tuned))
    with pytest.raises(grid.GridError, match="both configs.json and sm80.json"):
        grid.load_config(tuned_dir=tmp_path)
    base = json.loads(grid.CONFIG_PATH.read_text())
    del base["kernels"]["attn_fwd"]["configs"]["80"]["64"]
    (tmp_path / "configs.json").write_text(json.dumps(base))
    config = grid.load_config(tmp_path / "configs.json", tuned_dir=tmp_path)
    variants = [v for v in grid.expand(config, {"FATTN_CUDA_ARCHS": "80", "FATTN_HEAD_DIMS": "64"})
                if v.kernel == "attn_fwd"]
    assert variants and all(v.constant_dict["BLOCK_M"] == 32 and v.num_warps == 2 for v in variants)
    # The shipped tuned file covers what configs.json leaves out for sm90.
    shipped = grid.load_config()
    assert all(str(b) in shipped["kernels"][k]["configs"]["90"] for k in ("attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq")
               for b in (32, 64, 128, 256))


def test_tuned_tile_loop_crossovers_reach_the_kernel_table(tmp_path):
    # tuning/tune_tile_loop.py's crossovers (aot_build/tuned/sm<arch>.json "tile_loop") go through load_config to
    # the table's TileLoopRows, one per (arch, bucket); only a family with a TILE_LOOP flag takes them.
    from aot_build import emit

    tuned = {"arch": 90, "kernels": {}, "tile_loop": {"kernels": {"attn_fwd": {
        "64": {"from_rows": 4000, "from_rows_right_edge": 8000}, "128": {"from_rows": 1, "from_rows_right_edge": 768}}}}}
    (tmp_path / "sm90.json").write_text(json.dumps(tuned))
    config = grid.load_config(tuned_dir=tmp_path)
    assert emit.tile_loop_rows(config) == [
        {"arch": 90, "bucket": 64, "from_rows": 4000, "from_rows_right_edge": 8000},
        {"arch": 90, "bucket": 128, "from_rows": 1, "from_rows_right_edge": 768}]
    table = emit._table_cpp([], tmp_path / "kernels.bin", "3.6.0", config)
    assert "{90, 64, 4000, 8000}," in table and "size_t tile_loop_rows_size() { return 2; }" in table
    tuned["tile_loop"]["kernels"] = {"attn_bwd_dq": {"64": {"from_rows": 1, "from_rows_right_edge": 1}}}
    (tmp_path / "sm90.json").write_text(json.dumps(tuned))
    with pytest.raises(grid.GridError, match="attn_bwd_dq, which has no TILE_LOOP flag"):
        grid.load_config(tuned_dir=tmp_path)
    # The shipped file has a row for every bucket the grid builds both ways on sm_90.
    from tuning.tune_tile_loop import buckets_built_both_ways

    shipped = grid.load_config()
    assert sorted(int(b) for b in shipped["tile_loop"]["90"]["attn_fwd"]) == buckets_built_both_ways(90) == [64, 128]


def test_the_tile_loop_crossover_rule():
    from tuning.tune_tile_loop import NEVER, crossover

    # Faster from 4096 on: between the last length it lost at and that one (geometric mean,
    # rounded up to a multiple of 64); faster everywhere: from the first row; slower at the
    # longest: never; a win below a loss does not count.
    assert crossover([(512, 0.9), (1024, 0.95), (2048, 0.99), (4096, 1.05), (8192, 1.08), (16384, 1.02)]) == 2944
    assert crossover([(1024, 1.2), (512, 1.1)]) == 1
    assert crossover([(512, 1.1), (1024, 0.9)]) == NEVER
    assert crossover([(512, 1.1), (1024, 0.9), (2048, 1.01)]) == 1472
    assert crossover([]) == NEVER


def test_every_arch_and_bucket_has_a_config():
    # Shared memory is checked for real at build time; here the config file itself is
    # kept honest: every (kernel, arch, bucket) with a variant of the family's own kernel resolves
    # to a tile config (attn_fwd's 96 and 192 and attn_bwd_dkdv's 96 buckets have the Hopper
    # implementations' alone).
    config = grid.load_config()
    # One arch at a time: built with sm_86, sm_89 holds only the FP8 variants (served_by).
    built = {(v.kernel, v.arch, v.constant_dict.get("BLOCK_D", 0))
             for arch in config["archs"] for v in grid.expand(config, env={"FATTN_CUDA_ARCHS": str(arch)})
             if not v.implementation}
    for name, kcfg in config["kernels"].items():
        for arch in config["archs"]:
            for bucket in grid.selected_buckets(kcfg, env={}):
                if (name, arch, bucket) not in built:
                    assert (name, bucket) in {("attn_fwd", 96), ("attn_fwd", 192), ("attn_bwd_dkdv", 96)} or (
                        name == "fp8_transpose_v" and arch < 89), (name, arch, bucket)
                    continue
                tile = grid._tile_config(name, kcfg, arch, bucket)
                assert tile["num_warps"] in (1, 2, 4, 8) and tile["num_stages"] >= 1
    assert config["shared_memory_limit"]["75"] == 64 * 1024


def test_flag_overrides_change_only_the_matching_variants():
    config = grid.load_config()
    env = {"FATTN_CUDA_ARCHS": "80;90", "FATTN_HEAD_DIMS": "64;128"}
    kcfg = config["kernels"]["attn_fwd"]
    kcfg["flag_overrides"] = []
    base = {(v.kernel, v.arch, v.dtype, v.constants): v for v in grid.expand(config, env)}
    kcfg["flag_overrides"] = [{"flags": {"SCORE_MOD": "bias_dropout"}, "archs": [80], "buckets": [64],
                               "set": {"num_stages": 1, "BLOCK_N": 32}}]
    changed = [v for v in grid.expand(config, env) if (v.kernel, v.arch, v.dtype, v.constants) not in base
               or base[(v.kernel, v.arch, v.dtype, v.constants)].num_stages != v.num_stages]
    assert changed and all(v.kernel == "attn_fwd" and v.arch == 80 and v.constant_dict["BLOCK_D"] == 64
                           and v.constant_dict["SCORE_MOD"] == BIAS_DROPOUT and v.num_stages == 1
                           and v.constant_dict["BLOCK_N"] == 32 for v in changed)
    assert len(changed) == 2  # fp16/bf16 (attn_fwd builds its padded code only)
    kcfg["flag_overrides"] = [{"flags": {"NO_SUCH_FLAG": True}, "set": {"num_stages": 1}}]
    with pytest.raises(grid.GridError, match="unknown flags"):
        grid.expand(config, env)


def test_exclude_leaves_out_only_the_matching_variants():
    config = grid.load_config()
    env = {"FATTN_CUDA_ARCHS": "75;80", "FATTN_HEAD_DIMS": "64"}
    kcfg = config["kernels"]["attn_decode_split"]
    others = [e for e in kcfg["exclude"] if e["flags"] != {"WIDE": [1, 2]}]  # the FP8 caches' entries
    kcfg["exclude"] = others
    every = grid.expand(config, env)
    kcfg["exclude"] = others + [{"flags": {"WIDE": [1, 2]}, "archs": [75]}]
    kept = grid.expand(config, env)
    gone = set(every) - set(kept)
    assert gone and all(v.kernel == "attn_decode_split" and v.arch == 75 and v.constant_dict["WIDE"] in (1, 2)
                        for v in gone)
    # dtypes x (contiguous, paged, paged by tiles) x WIDE 1/2 (the padded code only)
    assert len(gone) == 2 * 3 * 2
    kcfg["exclude"] = [{"flags": {"NO_SUCH_FLAG": 1}}]
    with pytest.raises(grid.GridError, match="exclude name unknown flags"):
        grid.expand(config, env)


def test_over_shared_memory_is_a_build_error(tmp_path):
    base = next(v for v in grid.expand(env={"FATTN_CUDA_ARCHS": "80", "FATTN_HEAD_DIMS": "256"})
                if v.kernel == "attn_fwd")
    constants = dict(base.constants, BLOCK_M=128, BLOCK_N=128)
    huge = dataclasses.replace(base, constants=tuple(sorted(constants.items())), num_stages=3)
    limit = grid.load_config()["shared_memory_limit"]["80"]
    with pytest.raises(BuildError, match=r"needs \d+ bytes of shared memory but sm80 allows 166912"):
        compile_variant(huge, limit, cache_dir=tmp_path)


def _cuobjdump():
    import shutil

    import triton

    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(bundled) if bundled.exists() else shutil.which("cuobjdump")


def _unpacked_images(row, blob, tmp_path):
    """(cubin bytes, ptx text) of a manifest row, extracting them from fatbinaries if packed;
    ptx is None for an arch whose PTX the build leaves out (FATTN_PTX_ARCHS)."""
    cubin_image = blob[row["cubin_offset"]:row["cubin_offset"] + row["cubin_size"]]
    ptx_image = blob[row["ptx_offset"]:row["ptx_offset"] + row["ptx_size"]] if row["ptx_size"] else None
    assert hashlib.sha256(cubin_image).hexdigest() == row["cubin_sha256"]
    if row["image_format"] == "none":
        assert ptx_image is None or ptx_image.endswith(b"\0")
        return cubin_image, None if ptx_image is None else ptx_image[:-1]
    images = [("elf", cubin_image)] + ([("ptx", ptx_image)] if ptx_image is not None else [])
    assert all(image[:4] == bytes.fromhex("50ed55ba") for _, image in images), "not a fatbinary"
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump to open fatbinaries")
    out = []
    for kind, image in images:
        work = tmp_path / f"{row['cubin_offset']}_{kind}"
        work.mkdir()
        (work / "image.fatbin").write_bytes(image)
        subprocess.run([tool, f"-x{kind}", "all", "image.fatbin"], cwd=work, check=True, capture_output=True)
        extracted = [p for p in work.iterdir() if p.name != "image.fatbin"]
        assert len(extracted) == 1, f"{kind} fatbinary holds {len(extracted)} images"
        out.append(extracted[0].read_bytes())
    assert hashlib.sha256(out[0]).hexdigest() == row["raw_cubin_sha256"], "packed cubin differs from the compiled one"
    assert len(out[0]) == row["raw_cubin_size"]
    return out[0], out[1] if len(out) > 1 else None


def _check_outputs(out_dir, manifest, tmp_path):
    blob = (out_dir / "kernels.bin").read_bytes()
    assert len(blob) == manifest["blob_size"]
    table = (out_dir / "kernel_table.cpp").read_text()
    assert f"size_t kernel_table_size() {{ return {len(manifest['kernels'])}; }}" in table
    for row in manifest["kernels"]:
        cubin, ptx = _unpacked_images(row, blob, tmp_path)
        assert cubin[:4] == b"\x7fELF" and struct.unpack_from("<H", cubin, 18)[0] == ELF_MACHINE_CUDA
        assert struct.unpack_from("<I", cubin, 48)[0] & 0xFF == row["arch"], "cubin built for another arch"
        assert row["function"].encode() + b"\0" in cubin, "kernel symbol missing from its cubin"
        # The C++ table carries the same offsets and launch metadata as the manifest.
        maps = f"kMaps{manifest['kernels'].index(row)}" if row["maps"] else "nullptr"
        entry_tail = (f"{row['shared']}, {row['global_scratch_size']}, {row['global_scratch_align']}, "
                      f"{row['profile_scratch_size']}, {maps}, {len(row['maps'])}, {row['cubin_offset']}u, "
                      f"{row['cubin_size']}u, {row['ptx_offset']}u, {row['ptx_size']}u, \"{row['function']}\"}},")
        assert entry_tail in table
        assert (ptx is not None) == (row["arch"] in manifest["ptx_archs"])
        if ptx is None:
            continue
        assert f".entry {row['function']}(".encode() in ptx
        assert f".target sm_{row['arch']}".encode() in ptx
        # Every runtime parameter plus Triton's two scratch pointers appears in the PTX entry; a
        # host-made map (the row's `maps`, sm_90's `_maps` forms) is nine: the CUtensorMap, its
        # shape's four int32 and its strides' four int64
        # (test_the_host_maps_variants_compile_to_the_launchers_abi).
        entry = ptx[ptx.index(b".entry"):ptx.index(b")", ptx.index(b".entry"))]
        assert entry.count(b".param") == len(row["params"]) + 8 * len(row["maps"]) + 2


def test_tile_loop_variants_are_exactly_the_looping_kernels():
    # The forward op gives a variant fewer programs than query tiles only where its TILE_LOOP
    # flag is set: a kernel without the loop launched that way would leave tiles unwritten (each
    # kernel also asserts the value it takes), and one with it is built only so.
    from aot_build.signatures import kernel_spec
    from triton_src import IMPLEMENTATIONS, KERNELS

    looping = {name for name, spec in {**KERNELS, **IMPLEMENTATIONS}.items() if spec.loops_over_tiles}
    assert looping == {"attn_fwd_sm90"}
    variants = [v for v in grid.expand(env={"FATTN_CUDA_ARCHS": "all"}) if "TILE_LOOP" in v.constant_dict]
    assert {v.kernel for v in variants} == {"attn_fwd"}
    for v in variants:
        assert v.constant_dict["TILE_LOOP"] == kernel_spec(v.implementation or v.kernel).loops_over_tiles, v.label
    # The op's choice by length (csrc/attention/query_tile_programs.h) has two variants at d64 and
    # d128 on sm_90 without score modifications; the other buckets and score modifications have one.
    def on_sm90(loop):
        return {(v.constant_dict["BLOCK_D"], v.constant_dict["SCORE_MOD"], v.constant_dict["FP8"], v.dtype)
                for v in variants if v.arch == 90 and v.constant_dict["TILE_LOOP"] == loop}
    # FP8 inputs have both at d128 and d256 (with a softcap too: the looping kernel's FP8 variants
    # cover SCORE_MOD softcap_alibi where attn_fwd's do; attn_fwd takes the rows TMA cannot read).
    assert on_sm90(True) & on_sm90(False) == {(d, PLAIN, 0, dtype) for d in (64, 128) for dtype in ("fp16", "bf16")} | {
        (d, mod, fp8, "bf16") for d in (128, 256) for mod in (PLAIN, SOFTCAP_ALIBI) for fp8 in (1, 2)}


@pytest.fixture(scope="module")
def built_cache(tmp_path_factory):
    """(kernel cache, arch, head-dim bucket) for both packings. Where the environment names a
    kernel cache for a build of one bucket (CI: FATTN_AOT_CACHE, FATTN_CUDA_ARCHS "90",
    FATTN_HEAD_DIMS "64"), that build has compiled the raw cubins already: its sm_80 if it has one,
    else its first arch; else they compile once here, sm_80 at d32 (two minutes on two cores).
    Each packing's images are cached beside them. The cache's writes are atomic, so builds running
    beside this one may share it."""
    cache, archs, dims = (os.environ.get(k, "") for k in ("FATTN_AOT_CACHE", "FATTN_CUDA_ARCHS", "FATTN_HEAD_DIMS"))
    listed = [a.removeprefix("sm_") for a in re.split(r"[;, ]+", archs) if a]
    if cache and listed and all(a.isdigit() for a in listed) and dims.strip().isdigit():
        return Path(cache), "80" if "80" in listed else listed[0], dims.strip()
    return tmp_path_factory.mktemp("aot_cache"), "80", "32"


@pytest.mark.parametrize("packing", ["none", "fatbinary"])
def test_build_writes_consistent_table_and_hits_cache(tmp_path, packing, monkeypatch, built_cache):
    from aot_build import compress

    if packing == "fatbinary" and compress.mode({"FATTN_COMPRESS": "auto"}) != "fatbinary":
        pytest.skip("no fatbinary tool (CUDA toolkit) on PATH")
    cache, arch, head_dims = built_cache
    # The arch's PTX asked for by name: sm_90's is left out by default (test_ptx_archs_knob).
    env = {"FATTN_CUDA_ARCHS": arch, "FATTN_HEAD_DIMS": head_dims, "FATTN_COMPRESS": packing, "FATTN_PTX_ARCHS": arch}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "gen"
    first = build(out, jobs=2, cache_dir=cache, log=lambda m: None)
    table_mtime = (out / "kernel_table.cpp").stat().st_mtime_ns
    logs = []
    start = time.time()
    second = build(out, jobs=2, cache_dir=cache, log=logs.append)
    elapsed = time.time() - start
    assert len(first["kernels"]) == len(grid.expand(env=env))
    assert first == second
    assert first["image_format"] == packing
    assert any(f"{len(first['kernels'])} from cache" in line for line in logs), logs
    assert elapsed < 30, f"a cached rebuild took {elapsed:.1f}s"
    assert (out / "kernel_table.cpp").stat().st_mtime_ns == table_mtime, "unchanged table was rewritten"
    _check_outputs(out, first, tmp_path)
    if packing == "fatbinary":
        raw = sum(r["raw_cubin_size"] + r["raw_ptx_size"] for r in first["kernels"])
        assert first["blob_size"] < raw / 2, "compression saved less than half"
    assert first["ptx_archs"] == [int(arch)]
    # Without PTX: the same variants from the cache, no PTX image in the blob.
    monkeypatch.setenv("FATTN_PTX_ARCHS", "none")
    bare = build(tmp_path / "bare", jobs=2, cache_dir=cache, log=logs.append)
    assert any(f"{len(first['kernels'])} from cache" in line for line in logs[-1:]), logs
    assert bare["ptx_archs"] == [] and all(r["ptx_size"] == 0 for r in bare["kernels"])
    assert bare["blob_size"] < first["blob_size"] - sum(r["ptx_size"] for r in first["kernels"]) / 2
    (tmp_path / "bare_images").mkdir()
    _check_outputs(tmp_path / "bare", bare, tmp_path / "bare_images")


def test_a_gluon_kernel_compiles_ahead_of_time_through_the_build(tmp_path, monkeypatch):
    # The Hopper kernels may need Gluon (explicit warp specialization, barriers, async wgmma):
    # a @gluon.jit kernel goes through compile_variant like the Triton ones, on a machine with no
    # GPU, into a sm_90 cubin with the same launch ABI. (test_gluon_gpu.py runs it on Hopper.)
    from helpers.gluon_probe import build_probe

    artifact = build_probe(tmp_path, monkeypatch)
    assert artifact.cubin and "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16" in artifact.ptx
    assert artifact.meta["num_warps"] == 4 and artifact.meta["shared"] >= 2 * 64 * 64 * 2
    assert [p[0] for p in artifact.meta["params"]] == ["A", "B", "C", "stride_a", "stride_b", "stride_c"]


def test_implementations_replace_only_the_variants_they_serve(tmp_path):
    # configs.json's "implementations": attn_fwd_sm90 (Gluon) is built in attn_fwd's place for
    # sm_90, buckets 128 and 256 with SCORE_MOD plain, softcap_alibi, alibi_only and bias_tma (a bias read by TMA)
    # and bucket 64 with SCORE_MOD plain, TILE_LOOP, with its own tiles (plain in 64 and 128 also with
    # HOST_MAPS, host-made maps); every other attn_fwd variant is the family's own.
    env = {"FATTN_CUDA_ARCHS": "80;90", "FATTN_HEAD_DIMS": "64;128;256"}
    every = [v for v in grid.expand(env=env) if v.kernel == "attn_fwd"]
    # FP8 inputs: the Hopper kernel at d128 and d256 (SCORE_MOD plain and softcap_alibi), e4m3 and e5m2, the
    # variant's dtype being the bf16 output.
    fp8_hopper = {(v.constant_dict["BLOCK_D"], v.constant_dict["SCORE_MOD"], v.constant_dict["FP8"], v.dtype)
                  for v in every if v.implementation and v.constant_dict["FP8"]}
    assert fp8_hopper == {(d, mod, fp8, "bf16") for d in (128, 256) for mod in (PLAIN, SOFTCAP_ALIBI) for fp8 in (1, 2)}
    variants = [v for v in every if not v.constant_dict["FP8"]]
    hopper = [v for v in variants if v.implementation]
    assert {(v.arch, v.constant_dict["BLOCK_D"], v.constant_dict["SCORE_MOD"], v.constant_dict["TILE_LOOP"], v.dtype)
            for v in hopper} == {(90, d, mod, True, dtype) for d in (64, 128, 256)
                                 for mod in (PLAIN, SOFTCAP_ALIBI, ALIBI_ONLY, BIAS_TMA)
                                 for dtype in ("fp16", "bf16") if d > 64 or mod == PLAIN}
    assert all(v.implementation == "attn_fwd_sm90" and v.source == "triton_src.forward_sm90" for v in hopper)
    assert {v.constant_dict["BLOCK_D"]: (v.constant_dict["BLOCK_M"], v.constant_dict["BLOCK_N"]) for v in hopper} == {
        64: (192, 128), 128: (128, 128), 256: (128, 64)}
    others = [v for v in variants if not v.implementation]
    assert len(others) == len(variants) - 18 - 4 and all(v.source == "triton_src.forward" for v in others)
    assert sum(bool(v.constant_dict["HOST_MAPS"]) for v in hopper) == 4
    # The table keys a variant by family, arch, dtype and constants: both kinds carry the same names.
    assert {tuple(n for n, _ in v.constants) for v in variants} == {tuple(n for n, _ in hopper[0].constants)}

    config = grid.load_config()
    config["kernels"]["attn_fwd"]["implementations"][0]["flags"] = {"NO_SUCH_FLAG": 1}
    with pytest.raises(grid.GridError, match="implementations name unknown flags"):
        grid.expand(config, env)


def test_the_hopper_dkdv_serves_only_its_measured_variants():
    # attn_bwd_dkdv_sm90 (Gluon) replaces attn_bwd_dkdv on sm_90 for the 64, 96 and 128 buckets
    # without score modifications, for softcap/ALiBi at 64 and 96 (at 128 its consumers spill, but
    # for ALiBi alone, SCORE_MOD alibi_only), for a bias read by TMA (SCORE_MOD bias_tma) from 64 to 128,
    # and in its wide-head form for both at 256; 128 keys per program up to d128, 64 at d256, so
    # the op's grid (seqlen_k / BLOCK_N) follows the variant's tile. The 96 bucket is the Hopper
    # kernel's alone: sm_80 builds none.
    env = {"FATTN_CUDA_ARCHS": "80;90", "FATTN_HEAD_DIMS": "32;64;96;128;256"}
    variants = [v for v in grid.expand(env=env) if v.kernel == "attn_bwd_dkdv"]
    hopper = [v for v in variants if v.implementation]
    assert {(v.arch, v.constant_dict["BLOCK_D"], v.constant_dict["SCORE_MOD"], v.dtype)
            for v in hopper if not v.constant_dict["ACCUMULATE_DQ"]} == {
        (90, d, mod, dtype) for d, mods in ((64, (PLAIN, SOFTCAP_ALIBI, ALIBI_ONLY, BIAS_TMA)),
                                            (96, (PLAIN, SOFTCAP_ALIBI, ALIBI_ONLY, BIAS_TMA)),
                                            (128, (PLAIN, ALIBI_ONLY, BIAS_TMA)), (256, (PLAIN, SOFTCAP_ALIBI)))
        for mod in mods for dtype in ("fp16", "bf16")}
    assert all(v.implementation == "attn_bwd_dkdv_sm90" and v.source == "triton_src.backward_sm90" for v in hopper)
    assert {v.constant_dict["BLOCK_D"]: (v.constant_dict["BLOCK_M"], v.constant_dict["BLOCK_N"], v.num_warps)
            for v in hopper if not v.constant_dict["ACCUMULATE_DQ"]} == {64: (64, 128, 4), 96: (64, 128, 4),
                                                                        128: (64, 128, 4), 256: (64, 64, 4)}
    assert all(v.source == "triton_src.backward" for v in variants if not v.implementation)
    assert {v.constant_dict["BLOCK_D"] for v in variants if v.arch == 80} == {32, 64, 128, 256}


def test_dq_is_accumulated_in_the_dkdv_pass_only_where_measured():
    # deterministic=False's dQ inside the dK/dV pass: the Hopper kernel at d64 with SCORE_MOD plain and softcap_alibi
    # (its 128-key form) and at d128 with SCORE_MOD softcap_alibi (the wide-head form: 64-key tiles); every
    # other variant has ACCUMULATE_DQ off, and the op falls back to it (choose_or), then launches
    # attn_bwd_dq.
    env = {"FATTN_CUDA_ARCHS": "all", "FATTN_HEAD_DIMS": "all"}
    variants = [v for v in grid.expand(env=env) if v.kernel == "attn_bwd_dkdv"]
    accumulating = [v for v in variants if v.constant_dict["ACCUMULATE_DQ"]]
    assert {(v.arch, v.constant_dict["BLOCK_D"], v.constant_dict["SCORE_MOD"], v.dtype) for v in accumulating} == {
        (90, d, mod, dtype) for d, mod in ((64, PLAIN), (64, SOFTCAP_ALIBI), (64, ALIBI_ONLY), (128, SOFTCAP_ALIBI))
        for dtype in ("fp16", "bf16")}
    assert all(v.implementation == "attn_bwd_dkdv_sm90" for v in accumulating)
    assert {v.constant_dict["BLOCK_D"]: v.constant_dict["BLOCK_N"] for v in accumulating} == {64: 128, 128: 64}
    without = {(v.arch, v.dtype, v.constant_dict["BLOCK_D"], v.constant_dict["SCORE_MOD"], v.constant_dict["HOST_MAPS"])
               for v in variants if not v.constant_dict["ACCUMULATE_DQ"]}
    # Every arch but sm_89 (sm_86's serve it: configs.json served_by), dtype, power-of-two bucket
    # and SCORE_MOD plain, softcap_alibi and bias_dropout, sm_90's 96 bucket for SCORE_MOD plain and softcap_alibi, and its 64, 96 and 128 buckets for
    # SCORE_MOD alibi_only (ALiBi without a softcap) and bias_tma (a bias read by TMA); and sm_90's
    # plain 64 and 128 buckets again with host-made maps (HOST_MAPS).
    assert len(without) == len(variants) - len(accumulating) == 4 * 2 * 4 * 3 + 2 * 2 + 3 * 2 + 3 * 2 + 2 * 2
    assert {(v.arch, v.constant_dict["BLOCK_D"], v.constant_dict["BLOCK_N"], v.implementation) for v in variants
            if v.constant_dict["SCORE_MOD"] == ALIBI_ONLY} == {(90, d, 128, "attn_bwd_dkdv_sm90") for d in (64, 96, 128)}


def test_dq_accumulation_compiles_to_bulk_tensor_reductions(tmp_path):
    # Each consumer warpgroup adds its keys' part of a query tile's dQ, all 64 float32 columns,
    # by two cp.reduce.async.bulk.tensor (a box spans at most 128 bytes of a row under the
    # swizzle); no scalar atomics; the dQ product reads the warpgroup's own K tile whole, so all
    # five products of a warpgroup are 64 x 64 x 64 (4 wgmmas of k16 each, 40 in the two
    # consumers) and none is a half-width 64 x 32 one (the form that waited for the other
    # warpgroup's dS^T); four Q/dO slots (16 KB each at d64) put the shared memory past 160 KB.
    variant = next(v for v in grid.expand(env={"FATTN_CUDA_ARCHS": "90", "FATTN_HEAD_DIMS": "64"})
                   if v.kernel == "attn_bwd_dkdv" and v.constant_dict["ACCUMULATE_DQ"] and v.dtype == "bf16"
                   and v.constant_dict["SCORE_MOD"] == PLAIN)
    artifact = compile_variant(variant, shared_limit=232448, cache_dir=tmp_path)
    assert artifact.meta["name"] == "attn_bwd_dkdv_sm90" and artifact.meta["num_warps"] == 12
    assert artifact.ptx.count("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add") == 4
    assert "atom.global" not in artifact.ptx and "red.global" not in artifact.ptx
    assert artifact.ptx.count("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16") == 40
    assert "wgmma.mma_async.sync.aligned.m64n32k16" not in artifact.ptx
    assert 160 * 1024 < artifact.meta["shared"] <= 232448
    # Its loops divide by the tile count (carrying the tile measured slower here, docs/notes/tuning.md T19).
    assert "div.u32" in artifact.ptx or "div.s32" in artifact.ptx


def test_dq_accumulation_in_the_wide_head_form_compiles(tmp_path):
    # d128 softcap/ALiBi: the wide-head form, each warpgroup reducing its 64 dQ columns in two
    # 32-column boxes; its 64 x 64 dQ half leaves the consumers without spills.
    variant = next(v for v in grid.expand(env={"FATTN_CUDA_ARCHS": "90", "FATTN_HEAD_DIMS": "128"})
                   if v.kernel == "attn_bwd_dkdv" and v.constant_dict["ACCUMULATE_DQ"] and v.dtype == "bf16")
    artifact = compile_variant(variant, shared_limit=232448, cache_dir=tmp_path)
    assert variant.constant_dict["BLOCK_N"] == 64 and variant.constant_dict["SCORE_MOD"] == SOFTCAP_ALIBI
    assert artifact.ptx.count("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add") == 4
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16" in artifact.ptx
    assert artifact.meta["shared"] <= 232448


def test_the_hopper_dkdv_96_bucket_runs_its_products_on_two_head_dim_pieces(tmp_path):
    # d96: 64 + 32 columns, each piece with its own TMA descriptors and loads (K and V for both
    # key halves: 8 two-dimensional; Q and dO: 4 three-dimensional) and products. Per consumer: S^T and dP^T are 64 x 64 over k = 64 + 32 (6
    # wgmmas of k16 each), dV and dK a 64 x 64 and a 64 x 32 accumulator each (4 + 4 wgmmas per
    # product): 40 of n64 and 16 of n32 in the two consumers, none as wide as the 128 bucket's n128.
    variant = next(v for v in grid.expand(env={"FATTN_CUDA_ARCHS": "90", "FATTN_HEAD_DIMS": "96"})
                   if v.kernel == "attn_bwd_dkdv" and v.constant_dict["BLOCK_D"] == 96 and v.dtype == "bf16"
                   and v.constant_dict["SCORE_MOD"] == PLAIN)
    artifact = compile_variant(variant, shared_limit=232448, cache_dir=tmp_path)
    assert artifact.meta["name"] == "attn_bwd_dkdv_sm90"
    assert artifact.ptx.count("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16") == 40
    assert artifact.ptx.count("wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16") == 16
    assert "m64n128k16" not in artifact.ptx
    assert artifact.ptx.count("cp.async.bulk.tensor.2d") == 8 and artifact.ptx.count("cp.async.bulk.tensor.3d") == 4


def test_alibi_alone_compiles_without_the_softcap(tmp_path):
    # SCORE_MOD alibi_only (ALiBi without a softcap), built for the Hopper dK/dV from d64 to d128, the
    # Hopper dQ at d128 and the Hopper forward from d96 on: the softcap's tanh.approx is gone
    # (SCORE_MOD softcap_alibi's dQ has one per score), ALiBi's distance stays (one abs.f32 per score), and the
    # d128 dK/dV variant is the 128-key form without dQ accumulation.
    env = {"FATTN_CUDA_ARCHS": "all", "FATTN_HEAD_DIMS": "all"}
    alibi = [v for v in grid.expand(env=env) if v.kernel in ("attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq")
             and v.constant_dict["SCORE_MOD"] == ALIBI_ONLY]
    assert {(v.kernel, v.arch, v.constant_dict["BLOCK_D"], v.implementation) for v in alibi} == {
        ("attn_bwd_dq", 90, 128, "attn_bwd_dq_sm90"), *(("attn_bwd_dkdv", 90, d, "attn_bwd_dkdv_sm90") for d in (64, 96, 128)),
        *(("attn_fwd", 90, d, "attn_fwd_sm90") for d in (96, 128, 192, 256))}
    for v in alibi:
        if v.dtype != "bf16" or v.constant_dict["BLOCK_D"] not in (128,):
            continue
        ptx = compile_variant(v, shared_limit=232448, cache_dir=tmp_path).ptx
        assert "tanh" not in ptx and ptx.count("abs.f32") >= 64, v.label
        if v.kernel == "attn_bwd_dkdv":
            assert v.constant_dict["BLOCK_N"] == 128 and not v.constant_dict["ACCUMULATE_DQ"], v.label


def test_the_hopper_dkdv_compiles_through_the_build(tmp_path):
    # As the forward below: the Gluon kernel under attn_bwd_dkdv's parameters, 12 warps, TMA
    # descriptors in global scratch; its key-side products are 64 x 64 (S^T, dP^T) and
    # 64 x 128 (dV, dK) wgmmas. At d128 its loops carry each iteration's (head, query tile)
    # instead of dividing the counter by the runtime tile count: no integer division at all.
    variant = next(v for v in grid.expand(env={"FATTN_CUDA_ARCHS": "90", "FATTN_HEAD_DIMS": "128"})
                   if v.kernel == "attn_bwd_dkdv" and v.implementation and v.dtype == "bf16")
    artifact = compile_variant(variant, shared_limit=232448, cache_dir=tmp_path)
    from triton_src import KERNELS

    assert artifact.meta["name"] == "attn_bwd_dkdv_sm90"
    assert [p[0] for p in artifact.meta["params"]] == [p.name for p in KERNELS["attn_bwd_dkdv"].params]
    assert artifact.meta["num_warps"] == 12 and artifact.meta["global_scratch_size"] > 0
    assert "setmaxnreg" in artifact.ptx and "cp.async.bulk.tensor.3d" in artifact.ptx
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16" in artifact.ptx
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16" in artifact.ptx
    assert variant.constant_dict["SCORE_MOD"] == PLAIN and not variant.constant_dict["ACCUMULATE_DQ"]
    assert "div.s32" not in artifact.ptx and "div.u32" not in artifact.ptx


def test_the_hopper_dq_compiles_through_the_build(tmp_path):
    # attn_bwd_dq's sm_90 implementation: the Gluon kernel under attn_bwd_dq's parameters, 12
    # warps; S and dP are 64 x 64 wgmmas (64-key tiles), dQ's product 64 x 128, and four K/V
    # stages fit sm_90's shared memory.
    variant = next(v for v in grid.expand(env={"FATTN_CUDA_ARCHS": "90", "FATTN_HEAD_DIMS": "128"})
                   if v.kernel == "attn_bwd_dq" and v.implementation and v.dtype == "bf16")
    artifact = compile_variant(variant, shared_limit=232448, cache_dir=tmp_path)
    from triton_src import KERNELS

    assert artifact.meta["name"] == "attn_bwd_dq_sm90"
    assert [p[0] for p in artifact.meta["params"]] == [p.name for p in KERNELS["attn_bwd_dq"].params]
    assert artifact.meta["num_warps"] == 12 and artifact.meta["global_scratch_size"] > 0
    assert "setmaxnreg" in artifact.ptx and "cp.async.bulk.tensor" in artifact.ptx
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16" in artifact.ptx
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16" in artifact.ptx
    assert 192 * 1024 < artifact.meta["shared"] <= 232448


def test_the_d256_dkdv_carries_its_tile_without_division(tmp_path):
    # d256 without score modifications, like d128 (test above): each iteration's (head, query
    # tile) comes from the last one's, no integer division in the kernel.
    variant = next(v for v in grid.expand(env={"FATTN_CUDA_ARCHS": "90", "FATTN_HEAD_DIMS": "256"})
                   if v.kernel == "attn_bwd_dkdv" and v.implementation and v.dtype == "bf16"
                   and v.constant_dict["SCORE_MOD"] == PLAIN)
    artifact = compile_variant(variant, shared_limit=232448, cache_dir=tmp_path)
    assert artifact.meta["name"] == "attn_bwd_dkdv_sm90" and variant.constant_dict["BLOCK_N"] == 64
    assert "div.s32" not in artifact.ptx and "div.u32" not in artifact.ptx


def test_the_wide_head_dkdv_fits_hopper_shared_memory(tmp_path):
    # d256: S and dP of 32 keys per warpgroup (64 x 32 wgmmas), dK and dV of half the head dim
    # (64 x 128), P^T and dS^T through shared memory; the whole kernel within sm_90's 227 KB.
    variant = next(v for v in grid.expand(env={"FATTN_CUDA_ARCHS": "90", "FATTN_HEAD_DIMS": "256"})
                   if v.kernel == "attn_bwd_dkdv" and v.implementation and v.dtype == "fp16"
                   and v.constant_dict["SCORE_MOD"] == SOFTCAP_ALIBI)
    artifact = compile_variant(variant, shared_limit=232448, cache_dir=tmp_path)
    assert artifact.meta["name"] == "attn_bwd_dkdv_sm90" and artifact.meta["num_warps"] == 12
    assert 200 * 1024 < artifact.meta["shared"] <= 232448
    assert "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16" in artifact.ptx
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16" in artifact.ptx


def test_the_d64_hopper_forward_compiles_with_three_consumer_warpgroups(tmp_path):
    # 192 query rows, three consumer warpgroups of 64 at 160 registers (setmaxnreg) and a
    # producer: 16 warps, each K/V slot released by three arrivals (docs/notes/tuning.md T18).
    variant = next(v for v in grid.expand(env={"FATTN_CUDA_ARCHS": "90", "FATTN_HEAD_DIMS": "64"})
                   if v.implementation == "attn_fwd_sm90" and v.dtype == "bf16" and not v.constant_dict["HOST_MAPS"])
    assert variant.constant_dict["BLOCK_M"] == 192
    artifact = compile_variant(variant, shared_limit=232448, cache_dir=tmp_path)
    assert artifact.meta["name"] == "attn_fwd_sm90" and artifact.meta["num_warps"] == 16
    assert "setmaxnreg.inc.sync.aligned.u32 \t160;" in artifact.ptx
    assert re.search(r"mbarrier\.init\.shared::cta\.b64 \[%r\d+\], 3;", artifact.ptx)
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16" in artifact.ptx
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16" in artifact.ptx


def test_the_hopper_forward_compiles_through_the_build(tmp_path):
    # Compiled on a machine with no GPU from the grid's own variant: the cubin's function is the
    # Gluon kernel, under attn_fwd's parameters; warp_specialize makes it 12 warps, and its TMA
    # descriptors live in Triton's global scratch, which the runtime allocates per launch.
    variant = next(v for v in grid.expand(env={"FATTN_CUDA_ARCHS": "90", "FATTN_HEAD_DIMS": "128"})
                   if v.implementation and v.dtype == "bf16" and v.constant_dict["SCORE_MOD"] == SOFTCAP_ALIBI)
    artifact = compile_variant(variant, shared_limit=232448, cache_dir=tmp_path)
    from triton_src import KERNELS

    assert artifact.meta["name"] == "attn_fwd_sm90"
    assert [p[0] for p in artifact.meta["params"]] == [p.name for p in KERNELS["attn_fwd"].params]
    assert artifact.meta["num_warps"] == 12 and artifact.meta["global_scratch_size"] > 0
    assert "setmaxnreg" in artifact.ptx and "cp.async.bulk.tensor" in artifact.ptx
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16" in artifact.ptx


def test_the_hopper_forward_reads_a_bias_by_tma_and_draws_dropout_once_per_eight_scores(tmp_path):
    # SCORE_MOD bias_tma (a bias that TMA can read, with dropout) at d128: the producer loads each key
    # tile's bias rows with more 2-D TMA loads, and the consumers read them from shared memory, so
    # the kernel has SCORE_MOD softcap_alibi's global loads and the dropout seed's alone (a load per score was
    # 3.4x slower). The dropout mask comes laid out as the score tile: one Philox call (20
    # mul.hi, fewer where constants fold) per 8 scores, 8 per thread for a 64 x 128 tile, in two
    # copies of the key loop (its first tile and the rest) per consumer warpgroup; a call per
    # score would be 8 times as many.
    variants = {v.constant_dict["SCORE_MOD"]: v for v in grid.expand(env={"FATTN_CUDA_ARCHS": "90",
                                                                           "FATTN_HEAD_DIMS": "128"})
                if v.kernel == "attn_fwd" and v.implementation and v.dtype == "bf16" and not v.constant_dict["FP8"]}
    bias, plain = (compile_variant(variants[m], shared_limit=232448, cache_dir=tmp_path) for m in (BIAS_TMA, SOFTCAP_ALIBI))
    assert bias.meta["name"] == "attn_fwd_sm90" and bias.meta["shared"] <= 232448
    assert bias.ptx.count("ld.global") == plain.ptx.count("ld.global") + 1
    assert bias.ptx.count("cp.async.bulk.tensor.2d") > plain.ptx.count("cp.async.bulk.tensor.2d")
    assert 0 < bias.ptx.count("mul.hi.u32") <= 2 * 2 * 8 * 20
    assert "mul.hi.u32" not in plain.ptx


def test_the_hopper_backward_reads_a_bias_by_tma_and_writes_d_bias_by_tma(tmp_path):
    # SCORE_MOD bias_tma in the Hopper dK/dV at d128: the producer loads each query tile's bias rows with
    # its Q and dO (one more 3-D TMA load), each consumer writes dS^T as d bias by 3-D TMA stores
    # of 32 float32 columns (two per warpgroup and query tile), and no score is loaded or stored
    # through a per-score global address: the global memory operations are SCORE_MOD alibi_only's, plus
    # the dropout seed's load. The Hopper dQ at d128 reads the bias as the forward does.
    env = {"FATTN_CUDA_ARCHS": "90", "FATTN_HEAD_DIMS": "128"}
    dkdv = {v.constant_dict["SCORE_MOD"]: v for v in grid.expand(env=env)
            if v.kernel == "attn_bwd_dkdv" and v.implementation and v.dtype == "bf16"
            and not v.constant_dict["ACCUMULATE_DQ"]}
    bias, alibi = (compile_variant(dkdv[m], shared_limit=232448, cache_dir=tmp_path) for m in (BIAS_TMA, ALIBI_ONLY))
    assert bias.meta["name"] == "attn_bwd_dkdv_sm90" and bias.meta["shared"] <= 232448
    load, store = "cp.async.bulk.tensor.3d.shared::cluster.global", "cp.async.bulk.tensor.3d.global.shared::cta"
    assert bias.ptx.count(load) == alibi.ptx.count(load) + 1
    assert bias.ptx.count(store) == 2 * 2 and store not in alibi.ptx
    assert bias.ptx.count("ld.global") == alibi.ptx.count("ld.global") + 1
    assert bias.ptx.count("st.global") == alibi.ptx.count("st.global")
    dq = next(v for v in grid.expand(env=env) if v.kernel == "attn_bwd_dq" and v.implementation
              and v.dtype == "bf16" and v.constant_dict["SCORE_MOD"] == BIAS_TMA)
    assert "cp.async.bulk.tensor.2d" in compile_variant(dq, shared_limit=232448, cache_dir=tmp_path).ptx


def test_fp8_conversions_round_once_on_sm89(tmp_path):
    # float32 to FP8 in the FP8 append (the cache's quantization) and in attn_fwd's P is one
    # cvt.rn.satfinite from float32 on every arch (triton_src/fp8.py to_fp8): Triton 3.6's cast on
    # sm_89 goes through float16 rounded toward zero, which put appended values one FP8 step from
    # the CPU implementation's on an sm_89 run.
    variants = grid.expand(env={"FATTN_CUDA_ARCHS": "86;89", "FATTN_HEAD_DIMS": "64"})
    chosen = [next(v for v in variants if v.arch == 89 and v.kernel == "kv_append" and v.dtype == "bf16"
                   and v.constant_dict["KV_FP8"] == fp8) for fp8 in (1, 2)]
    chosen.append(next(v for v in variants if v.arch == 89 and v.kernel == "attn_fwd" and v.constant_dict["FP8"] == 2))
    for v, cvt in zip(chosen, ("e4m3x2", "e5m2x2", "e4m3x2")):
        ptx = compile_variant(v, shared_limit=101376, cache_dir=tmp_path).ptx
        assert f"cvt.rn.satfinite.{cvt}.f32" in ptx, v.label
        assert "cvt.rz.f16.f32" not in ptx and not re.search(r"cvt\.rn\.satfinite\.e\dm\dx2\.f16x2", ptx), v.label


def test_host_made_maps_are_built_for_the_dense_calls_that_measured_faster():
    # HOST_MAPS (the 16-bit tensors as host-made TMA maps): plain scores in the Hopper kernels'
    # 64 and 128 buckets, both dtypes; the forward's looping kernel, the dK/dV kernel (with and
    # without dQ accumulated where the bucket has both), the dQ kernel at d128; nothing else
    # (configs.json says why).
    every = list(grid.expand(env={"FATTN_CUDA_ARCHS": "75;80;86;89;90", "FATTN_HEAD_DIMS": "all"}))
    maps = [v for v in every if v.constant_dict.get("HOST_MAPS")]
    assert {(v.arch, v.implementation, v.dtype, v.constant_dict["BLOCK_D"]) for v in maps} == {
        (90, implementation, dtype, bucket) for dtype in ("fp16", "bf16")
        for implementation, buckets in (("attn_fwd_sm90", (64, 128)), ("attn_bwd_dkdv_sm90", (64, 128)),
                                        ("attn_bwd_dq_sm90", (128,)))
        for bucket in buckets}
    assert len(maps) == 2 * (2 + 3 + 1)  # per dtype: d64 dK/dV with and without dQ accumulated
    assert all(v.constant_dict["SCORE_MOD"] == 0 and not v.constant_dict.get("FP8")
               and v.constant_dict.get("TILE_LOOP", True) for v in maps)
    # Each has its twin with the kernel's own descriptors, the form every other call runs.
    def without_maps(v):
        return (v.implementation, v.dtype, tuple((n, c) for n, c in v.constants if n != "HOST_MAPS"))

    twins = {without_maps(v) for v in every if v.implementation and not v.constant_dict.get("HOST_MAPS")}
    assert {without_maps(v) for v in maps} <= twins


# One bucket per kernel (each compile takes 10-20 s on CI's two cores): the forward and dQ kernels'
# at d128, where a box is two 64-column copies; the dK/dV kernel's at d64, one.
@pytest.mark.parametrize("kernel,head_dim", [("attn_fwd", "128"), ("attn_bwd_dkdv", "64"), ("attn_bwd_dq", "128")])
def test_the_host_maps_variants_compile_to_the_launchers_abi(tmp_path, kernel, head_dim):
    # A HOST_MAPS variant (those without dQ accumulated, whose float32 accumulator keeps the
    # descriptor its program makes): no descriptor made in the kernel (no tensormap.replace, no
    # global scratch), every TMA copy of them 4-D over [batch, seqlen, heads, head_dim], the
    # boxes the spec's map_rows say recorded for the kernel table (split by Triton into 64-column
    # boxes, a 128-byte swizzle's width); its function named apart (profiles tell the forms apart).
    # And the launch ABI: the PTX entry's parameters, in order, are what the generated launcher
    # passes (each map the 128-byte CUtensorMap, its shape's four int32, its strides' four int64),
    # then Triton's two scratch pointers; its twin with pointers, likewise.
    from aot_build import emit, launchers
    from triton_src import KERNELS

    spec = KERNELS[kernel]
    twins = {v.constant_dict["HOST_MAPS"]: v for v in grid.expand(env={"FATTN_CUDA_ARCHS": "90",
                                                                        "FATTN_HEAD_DIMS": head_dim})
             if v.kernel == kernel and v.implementation and v.dtype == "bf16" and v.constant_dict["SCORE_MOD"] == 0
             and not v.constant_dict.get("FP8") and not v.constant_dict.get("ACCUMULATE_DQ")}
    maps, own = (compile_variant(twins[flag], shared_limit=232448, cache_dir=tmp_path) for flag in (True, False))
    name = twins[True].implementation
    assert maps.meta["name"] == f"{name}_maps" and own.meta["name"] == name
    assert "tensormap.replace" not in maps.ptx and maps.meta["global_scratch_size"] == 0
    assert "cp.async.bulk.tensor.2d" not in maps.ptx and "cp.async.bulk.tensor.3d" not in maps.ptx
    assert maps.ptx.count("cp.async.bulk.tensor.4d") >= len(spec.maps)
    constants, block_d = twins[True].constant_dict, int(head_dim)
    boxes = [[1, spec.map_box(p, constants)[1], 1, min(block_d, 64)] for p in spec.maps]
    assert [m["block_size"] for m in maps.meta["maps"]] == boxes and own.meta["maps"] == []
    assert emit._map_box(maps.meta["maps"][0]) == f"{{{{1u, {boxes[0][1]}u, 1u, {min(block_d, 64)}u}}, 3, 9, 2}}"

    def entry_params(ptx: str) -> list[str]:
        entry = ptx[ptx.index(".entry"):]
        entry = entry[entry.index("(") + 1:entry.index(")")]
        return [" ".join(re.sub(rf"{name}(_maps)?_param_\d+", "", line).replace("[", " [").split()).rstrip(",")
                for line in entry.splitlines() if ".param" in line]

    for artifact, as_maps in ((maps, True), (own, False)):
        _, slots = launchers._slots(spec, as_maps)
        params = entry_params(artifact.ptx)
        assert len(params) == len(slots) + 2, (as_maps, len(params), len(slots))
        kinds = [("map" if "CUtensorMap" in s else "i32" if "int32_t" in s or "float" in s else "64")
                 for s in slots]
        for kind, param in zip(kinds, params):
            want = {"map": ".param .align 64 .b8 [128]", "i32": (".param .u32", ".param .f32")}.get(kind)
            if kind == "map":
                assert param == want, (kind, param)
            elif kind == "i32":
                assert param.startswith(want), (kind, param)
            else:
                assert param.startswith(".param .u64"), (kind, param)
