"""build_support/: the development grid, the toolchain choice, the manylinux tag."""

import pytest

from aot_build import grid
from build_support import dev_grid, elf, toolchain

ARCHS = [75, 80, 86, 89, 90]
FLAGS = {"portable_glibc": ["2.28"], "portable_version_script": ["csrc/libfattn.map"], "portable_link_options": ["-s"]}


def test_knobs_set_by_hand_win():
    assert dev_grid.choose({"FATTN_CUDA_ARCHS": "90"}, ARCHS, gpus=[("A100", 80)], log=None) == {}
    assert dev_grid.choose({"FATTN_HEAD_DIMS": "128"}, ARCHS, gpus=[], log=None) == {}


def test_visible_gpus_pick_their_archs_every_head_dim():
    lines = []
    chosen = dev_grid.choose({}, ARCHS, gpus=[("H100", 90), ("A10", 86), ("Orin", 87)], log=lines.append)
    assert chosen == {"FATTN_CUDA_ARCHS": "86;90"}  # 8.7 runs sm_86's cubins
    assert "86;90" in lines[0]


def test_no_gpu_gives_the_minimal_set_and_says_how_to_get_all():
    lines = []
    assert dev_grid.choose({}, ARCHS, gpus=[], log=lines.append) == dev_grid.MINIMAL
    assert "FATTN_CUDA_ARCHS=all" in lines[-1]


def test_a_gpu_outside_the_grid_is_named_and_falls_back_to_the_minimal_set():
    lines = []
    assert dev_grid.choose({}, ARCHS, gpus=[("B200", 100)], log=lines.append) == dev_grid.MINIMAL
    assert "sm_100" in lines[0]


def test_all_selects_every_arch_and_bucket():
    config = grid.load_config()
    assert grid.selected_archs(config, {"FATTN_CUDA_ARCHS": "all"}) == sorted(config["archs"])
    kernel = next(iter(config["kernels"].values()))
    assert grid.selected_buckets(kernel, {"FATTN_HEAD_DIMS": "all"}) == kernel["head_dim_buckets"]


def test_toolchain_defaults():
    assert toolchain.choose(FLAGS, wheel=False, env={}).name == "gcc"
    assert toolchain.choose(FLAGS, wheel=True, env={"CXX": "clang++"}).cxx == ["clang++"]
    assert toolchain.choose(FLAGS, wheel=False, env={"FATTN_TOOLCHAIN": "gcc"}).cxx == ["g++"]
    with pytest.raises(toolchain.ToolchainError, match="expected zig or gcc"):
        toolchain.choose(FLAGS, wheel=True, env={"FATTN_TOOLCHAIN": "msvc"})


def test_wheels_default_to_zig_for_glibc_2_28():
    try:
        chosen = toolchain.choose(FLAGS, wheel=True, env={})
    except toolchain.ToolchainError as e:  # no ziglang here: the error must say how to get it
        assert toolchain.ZIGLANG in str(e)
        return
    assert chosen.name == "zig" and chosen.cxx[-1].endswith("-linux-gnu.2.28")
    assert any(o.startswith("-Wl,--version-script=") for o in chosen.link_options)


@pytest.mark.parametrize("ceiling, tag", [((2, 16), "manylinux_2_17_x86_64"), ((2, 17), "manylinux_2_17_x86_64"),
                                          ((2, 18), "manylinux_2_24_x86_64"), ((2, 28), "manylinux_2_28_x86_64"),
                                          ((2, 29), "manylinux_2_31_x86_64"), ((2, 34), "manylinux_2_34_x86_64")])
def test_tag_rounds_the_ceiling_up_to_a_manylinux_policy(monkeypatch, ceiling, tag):
    monkeypatch.setattr(elf, "glibc_ceiling", lambda path: max(ceiling, (2, 17)))
    assert elf.manylinux_tag("unused", "x86_64") == tag


def test_warm_links_an_empty_library_with_the_toolchains_link_options(tmp_path):
    # CI warms zig's runtime this way, ahead of the wheel; g++ stands in for zig here (the same
    # command, seconds instead of minutes), and a bad link option must fail the warm-up.
    gcc = toolchain.Toolchain("gcc", ["g++"], ["-s"])
    toolchain.warm(gcc, tmp_path)
    assert (tmp_path / "libempty.so").stat().st_size > 0
    with pytest.raises(toolchain.ToolchainError, match="empty library"):
        toolchain.warm(toolchain.Toolchain("gcc", ["g++"], ["-Wl,--no-such-option"]), tmp_path / "bad")
