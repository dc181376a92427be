"""The built library: stable-ABI symbols only, no Triton at run time, build info."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

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
    elif toolchain == "gcc":  # a development build links the system's libstdc++
        assert "libstdc++.so.6" in runtimes, elf.describe(library)


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
    # build, and untouched by CPU calls, which load no module.
    from fattn._library import module_loads

    q = torch.randn(1, 5, 2, 16)
    fattn.flash_attn_func(q, q, q)
    assert module_loads() == {"attempts": 0, "functions": 0}
