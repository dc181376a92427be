"""The built library: stable-ABI symbols only, no Triton at run time, build info."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fattn

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parent.parent


def _undefined_symbols(path):
    out = subprocess.run(["nm", "-D", "--undefined-only", str(path)], capture_output=True, text=True, check=True)
    symbols = []
    for line in out.stdout.splitlines():
        kind, name = line.split()[-2:]
        if kind.lower() == "w":  # weak: may stay unresolved
            continue
        symbols.append(name)
    return symbols


def test_undefined_symbols_are_exported_by_torch_2_11():
    # tests/data/torch_2_11_exports.txt: the C shim symbols (aoti_torch_*, torch_*) that
    # torch 2.11's libtorch_cpu.so exports, read off torch 2.11.0+cu130 on the GPU machine.
    # Anything else we import must be a versioned libc/libstdc++/libgcc symbol.
    exports = set((DATA / "torch_2_11_exports.txt").read_text().split())
    missing = []
    for name in _undefined_symbols(fattn.library_path()):
        base, _, version = name.partition("@")
        if version.startswith(("GLIBC_", "GLIBCXX_", "CXXABI_", "GCC_")):
            continue
        if base not in exports:
            missing.append(name)
    assert not missing, f"symbols torch 2.11 does not export: {missing}"


def test_library_needs_no_cuda_runtime_or_torch_cxx_libraries():
    out = subprocess.run(["readelf", "-d", str(fattn.library_path())], capture_output=True, text=True, check=True)
    needed = [line.split("[")[1].rstrip("]") for line in out.stdout.splitlines() if "(NEEDED)" in line]
    assert not any(n.startswith(("libcudart", "libcuda.", "libtorch_cuda", "libc10", "libtorch_python")) for n in needed), needed


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
