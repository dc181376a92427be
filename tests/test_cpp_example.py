"""The CMake package and the LibTorch C++ example, built from scratch by
scripts/build_cpp_example.sh into a temporary folder and run on CPU."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import check_stable_abi

pytestmark = pytest.mark.slow  # the slow tier (-m slow): builds the CMake package and the C++ example

ROOT = Path(__file__).resolve().parent.parent
BATCH, PROMPT, STEPS = 2, 37, 5  # as in examples/cpp/main.cpp
PAGE_SIZE, PAGES_PER_SEQ, NUM_PAGES, APPEND_QUERIES = 16, 3, 8, 16  # its paged KV cache


def _missing_tool():
    if shutil.which("cmake") is None:
        return "cmake not found"
    compilers = [os.environ["CXX"]] if os.environ.get("CXX") else ["c++", "g++", "clang++"]
    if not any(shutil.which(c.split()[0]) for c in compilers):
        return f"no C++ compiler found (tried {', '.join(compilers)})"
    return None


@pytest.fixture(scope="module")
def cpp_build(tmp_path_factory):
    """One run of the script: (its output, the build folder)."""
    missing = _missing_tool()
    if missing:
        pytest.skip(f"C++ example needs cmake and a C++ compiler: {missing}")
    out = tmp_path_factory.mktemp("cmake")
    env = dict(os.environ, PYTHON=sys.executable, FATTN_CMAKE_BUILD=str(out))
    # The kernels do not matter on CPU: the narrow grid of CI, built from aot_build's cache.
    env.setdefault("FATTN_CUDA_ARCHS", "80;90")
    env.setdefault("FATTN_HEAD_DIMS", "64")
    run = subprocess.run([str(ROOT / "scripts" / "build_cpp_example.sh")], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
    assert run.returncode == 0, f"build_cpp_example.sh failed ({run.returncode}):\n{run.stdout[-6000:]}"
    return run.stdout, out


def test_example_decodes_and_matches_the_libtorch_reference(cpp_build):
    output, _ = cpp_build
    # CPU here and in CI; a CUDA LibTorch with a GPU runs it in bfloat16.
    device = re.search(r"^fattn decode example on (cpu \(float32\)|cuda \(bfloat16\))", output, re.MULTILINE)
    assert device, output[-3000:]
    tolerance = 1e-5 if device[1].startswith("cpu") else 2e-2
    # The cache is paged: a block_table row of distinct pages of the pool per sequence.
    cache = re.search(rf"^paged KV cache: {NUM_PAGES} pages of {PAGE_SIZE} tokens, block_table \[(.+)\]$",
                      output, re.MULTILINE)
    assert cache, output[-3000:]
    rows = [[int(p) for p in row.split(",")] for row in re.findall(r"\[([\d, ]+)\]", cache[1])]
    pages = [p for row in rows for p in row]
    assert len(rows) == BATCH and all(len(row) == PAGES_PER_SEQ for row in rows), cache[0]
    assert len(set(pages)) == len(pages) and all(0 <= p < NUM_PAGES for p in pages), cache[0]
    # prefill: fattn::forward; append: fattn::decode writing the prompt into the pages (with
    # its last queries); decode s: fattn::decode appending one token in place.
    expected = [("prefill", PROMPT, PROMPT), ("append", APPEND_QUERIES, PROMPT)]
    expected += [(f"decode {s}", 1, PROMPT + s) for s in range(1, STEPS + 1)]
    for label, q_len, kv_len in expected:
        pattern = rf"^{label}\s+q_len={q_len}\s+kv_len={kv_len}\s+max\|out-ref\|=(\S+) max\|lse-ref\|=(\S+) ok$"
        match = re.search(pattern, output, re.MULTILINE)
        assert match, f"no passing check line for {label!r} in:\n{output[-3000:]}"
        assert max(float(match[1]), float(match[2])) <= tolerance
    assert "MISMATCH" not in output
    assert "all steps match the LibTorch reference" in output


def test_install_tree_is_a_cmake_package(cpp_build):
    _, out = cpp_build
    prefix = out / "cmake-install"
    for path in ["lib/libfattn.so", "include/fattn/fattn.h", "lib/cmake/fattn/fattnConfig.cmake",
                 "lib/cmake/fattn/fattnConfigVersion.cmake", "lib/cmake/fattn/fattnTargets.cmake"]:
        assert (prefix / path).is_file(), f"{path} missing from the installed tree"
    # The imported target carries the include folder, so consumers need no include path.
    targets = (prefix / "lib/cmake/fattn/fattnTargets.cmake").read_text()
    assert re.search(r'INTERFACE_INCLUDE_DIRECTORIES "\$\{_IMPORT_PREFIX\}/include"', targets)
    # One version for the wheel and the CMake package.
    version = re.search(r'^version = "(.+)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)[1]
    assert f'set(PACKAGE_VERSION "{version}")' in (prefix / "lib/cmake/fattn/fattnConfigVersion.cmake").read_text()


def test_library_keeps_to_the_stable_abi(cpp_build):
    # The same contract as the pip build's library (tests/test_library.py).
    _, out = cpp_build
    check_stable_abi(out / "cmake-install" / "lib" / "libfattn.so")
