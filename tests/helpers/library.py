"""The stable-ABI contract of a built libfattn.so, wherever it was built (the pip build,
the CMake package): what it links and which symbols it takes from torch; and the kernel
variants it holds."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

# tests/data/torch_2_11_exports.txt: the C shim symbols (aoti_torch_*, torch_*) that torch
# 2.11's libtorch_cpu.so exports, read off torch 2.11.0+cu130 on the GPU machine.
TORCH_2_11_EXPORTS = Path(__file__).resolve().parent.parent / "data" / "torch_2_11_exports.txt"
# The driver is opened at run time (no cudart); torch's C++ and Python libraries would tie
# the library to one torch build.
FORBIDDEN_LIBRARIES = ("libcudart", "libcuda.", "libtorch_cuda", "libc10", "libtorch_python", "libtorch.")
SYSTEM_SYMBOL_VERSIONS = ("GLIBC_", "GLIBCXX_", "CXXABI_", "GCC_")


def needed_libraries(library) -> list[str]:
    dynamic = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[(.+)\]", dynamic)


def symbols_torch_2_11_lacks(library) -> list[str]:
    """Undefined symbols of `library` that are neither weak, nor versioned libc/libstdc++/libgcc
    symbols, nor exported by torch 2.11."""
    exports = set(TORCH_2_11_EXPORTS.read_text().split())
    undefined = subprocess.run(["nm", "-D", "--undefined-only", str(library)], capture_output=True, text=True,
                               check=True).stdout
    foreign = []
    for line in undefined.splitlines():
        kind, name = line.split()[-2:]
        base, _, version = name.partition("@")
        if kind.lower() == "w" or version.startswith(SYSTEM_SYMBOL_VERSIONS):
            continue
        if base not in exports:
            foreign.append(name)
    return foreign


def check_stable_abi(library) -> None:
    """torch_cpu is the only torch library linked, and every symbol taken from torch is one
    that torch 2.11 exports."""
    needed = needed_libraries(library)
    assert "libtorch_cpu.so" in needed, needed
    assert not any(n.startswith(FORBIDDEN_LIBRARIES) for n in needed), needed
    foreign = symbols_torch_2_11_lacks(library)
    assert not foreign, f"symbols torch 2.11 does not export: {foreign}"


def skip_without_ptx(arch, *kernels) -> None:
    """Skips the calling test unless the loaded library embeds the sm_`arch` PTX of every one of
    `kernels` (FATTN_PTX_ARCHS at build time: by default only the newest arch other than sm_90)."""
    import fattn
    import pytest

    rows = fattn.build_info()["kernels"]
    missing = [k for k in kernels if not any(r["kernel"] == k and r["arch"] == int(arch) and r["ptx_size"]
                                             for r in rows)]
    if missing:
        pytest.skip(f"this build has no sm_{arch} PTX for {', '.join(missing)} (FATTN_PTX_ARCHS)")


def score_mod(name: str) -> int:
    """The SCORE_MOD value of a score-modifier variant's name (triton_src/variants.py), as the
    build's table stores it."""
    import sys

    root = str(Path(__file__).resolve().parents[2])
    if root not in sys.path:  # a test's subprocess (racecheck_hopper_calls.py) runs from tests/
        sys.path.insert(0, root)
    from triton_src.variants import score_mod_value

    return score_mod_value(name)


def hopper_variants(function: str, constants: dict) -> list[dict]:
    """The build's bf16 sm_90 variants (fattn.build_info entries) of kernel function `function`
    whose constants include `constants`: 16-bit inputs unless `constants` names an FP8 flag value.
    SCORE_MOD is a variant's name (triton_src/variants.py)."""
    import fattn

    if "SCORE_MOD" in constants:
        constants = dict(constants, SCORE_MOD=score_mod(constants["SCORE_MOD"]))
    fp8 = constants.get("FP8", 0)
    return [e for e in fattn.build_info()["kernels"]
            if e["function"] == function and e["arch"] == 90 and e["dtype"] == "bf16"
            and e["constants"].get("FP8", 0) == fp8
            and all(e["constants"].get(k) == v for k, v in constants.items())]
