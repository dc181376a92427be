"""The built library: stable-ABI symbols only, no Triton at run time, build info."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fattn
from helpers import check_stable_abi

ROOT = Path(__file__).resolve().parent.parent


def test_library_keeps_to_the_stable_abi():
    # Links torch_cpu and no CUDA runtime or torch C++ library; takes only symbols torch
    # 2.11 exports, so one build serves every torch from 2.11 on.
    check_stable_abi(fattn.library_path())


def test_system_needs_match_the_toolchain():
    # Every build is read the same way (build_support/elf.py, as scripts/check_wheel.py
    # does); what it may need depends on the toolchain that linked it.
    from build_support import elf

    library = fattn.library_path()
    toolchain = fattn.build_info().get("toolchain")
    ceiling, runtimes = elf.glibc_ceiling(library), elf.compiler_runtimes(library)
    if toolchain == "zig":  # the portable wheel: manylinux_2_28 at most, no compiler runtime
        assert ceiling <= (2, 28) and not runtimes, elf.describe(library)
    elif toolchain == "gcc":
        # A development build links the system's C++ runtime: libstdc++, libgcc_s or both (a
        # linker that drops unreferenced libraries, Ubuntu's default, kept only libgcc_s on the
        # H200 machine's g++).
        assert runtimes, elf.describe(library)


def test_import_and_run_without_triton():
    code = (
        "import sys; sys.modules['triton'] = None\n"  # any `import triton` now raises ImportError
        "import torch, fattn\n"
        "q = torch.randn(1, 5, 2, 16)\n"
        "out = fattn.flash_attn_func(q, q, q, causal=True)\n"
        "assert out.shape == q.shape\n"
        "assert sys.modules['triton'] is None\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


def test_info_command_lists_the_build():
    result = subprocess.run([sys.executable, "-m", "fattn", "info"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    archs = sorted({k["arch"] for k in fattn.build_info()["kernels"]})
    assert "attn_fwd" in result.stdout
    for arch in archs:
        assert f"sm_{arch}" in result.stdout


def test_build_info_matches_generated_manifest():
    manifest_path = ROOT / "build" / "generated" / "manifest.json"
    if not manifest_path.exists():
        pytest.skip("no source-tree build (testing an installed wheel)")
    manifest = json.loads(manifest_path.read_text())
    info = fattn.build_info()
    if len(info["kernels"]) != len(manifest["kernels"]) and os.environ.get("FATTN_LIBRARY"):
        pytest.skip("FATTN_LIBRARY points at a library from another build")
    assert info["triton_version"] == manifest["triton_version"]
    assert len(info["kernels"]) == len(manifest["kernels"])
    for got, want in zip(info["kernels"], manifest["kernels"]):
        for key in ("kernel", "arch", "dtype", "function", "shared", "num_warps", "cubin_size", "ptx_size",
                    "constants", "global_scratch_size"):
            assert got[key] == want[key], (key, got, want)
        assert got["params"] == [name for name, _ in want["params"]]


def test_module_load_counts_are_exported_and_zero_without_cuda_calls():
    # The counters the GPU thread test reads (tests/test_hardening_gpu.py): exported by every
    # build, and untouched by CPU calls, which load no module. In a fresh process: the counts are
    # the process's, and a test run may have made CUDA calls in this one before (a GPU suite in
    # the same pytest worker).
    code = (
        "import torch, fattn\n"
        "from fattn._library import module_loads\n"
        "q = torch.randn(1, 5, 2, 16)\n"
        "fattn.flash_attn_func(q, q, q)\n"
        "print(module_loads())\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert ast.literal_eval(result.stdout.strip().splitlines()[-1]) == {"attempts": 0, "functions": 0}, result.stdout


def test_the_forward_picks_its_looping_kernel_by_the_tuned_crossovers():
    # The op's rule (csrc/attention/query_tile_programs.h) reads the crossovers tuning/tune_tile_loop.py
    # wrote into aot_build/tuned/sm<arch>.json, through the kernel table: each flips at its row.
    from fattn import _library as library

    tuned = {}
    for path in (ROOT / "aot_build" / "tuned").glob("sm*.json"):
        data = json.loads(path.read_text())
        for bucket, entry in data.get("tile_loop", {}).get("kernels", {}).get("attn_fwd", {}).items():
            tuned[(data["arch"], int(bucket))] = entry
    assert tuned, "no tuned TILE_LOOP crossovers"
    assert {(r["arch"], r["bucket"]) for r in fattn.build_info()["tile_loop"]} == set(tuned)
    from tuning.tune_tile_loop import NEVER as never

    for (arch, bucket), entry in tuned.items():
        for right_edge, key in ((False, "from_rows"), (True, "from_rows_right_edge")):
            rows = entry[key]
            assert library.prefers_tile_loop(arch, bucket, rows, False, right_edge) == (rows < never)
            assert not library.prefers_tile_loop(arch, bucket, rows - 1, False, right_edge) or rows == 1
        # Packed sequences: attn_fwd at d64, the looping kernel above, whatever the length.
        assert library.prefers_tile_loop(arch, bucket, 1 << 20, True, False) == (bucket > 64)
    # Without a tuned row the op asks for the looping kernel (the build's only one there, or the
    # fallback takes the other).
    assert library.prefers_tile_loop(90, 96, 1, False, True) and library.prefers_tile_loop(80, 64, 1, False, False)


def test_the_jit_launch_copy_of_the_programs_rule_matches_the_op():
    # benchmarks/revision_ab.py launches the looping forward with the op's programs per (head,
    # batch), written again in Python: it must give what the library's rule gives.
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from revision_ab import op_programs
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from fattn import _library as library

    for tiles in (1, 2, 3, 4, 5, 8, 22, 32, 64, 128):
        for pairs in (1, 16, 64, 128, 512, 4096):
            for sms in (1, 78, 132):
                for heavy in (False, True):
                    assert op_programs(tiles, pairs, heavy, sms) == library.query_tile_programs(tiles, pairs, sms, heavy), \
                        (tiles, pairs, sms, heavy)


def test_host_maps_stop_where_they_measured_faster():
    # The op's rule (csrc/attention/host_maps.h), which the tuner and the GPU tests read
    # through the library: host-made maps ran faster at 1k and 2k query rows and slower at d128 4k
    # (docs/notes/tuning.md T39, T40), so the limit lies between.
    from fattn import _library as library

    assert 2048 <= library.host_maps_up_to_rows() < 4096
    # The backward's own limit, no shorter than the forward's: its programs loop over every query
    # tile, so the setup the maps save weighs less per program, not more (tuning.md T41).
    assert library.backward_host_maps_up_to_rows() >= library.host_maps_up_to_rows()
