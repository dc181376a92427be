#!/usr/bin/env bash
# From a clean clone: build and install libfattn with CMake, build the LibTorch example
# against the installed package, and run it (CPU here; CUDA when LibTorch sees a GPU).
#
#   PYTHON=python3 scripts/build_cpp_example.sh   # PYTHON must import torch and triton
#
# FATTN_CUDA_ARCHS / FATTN_HEAD_DIMS narrow the kernel grid as for the pip build.
# Outputs: build/cmake-lib (library build), build/cmake-install (the package),
# build/cmake-example (the program); FATTN_CMAKE_BUILD overrides the build/ part.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
mkdir -p "${FATTN_CMAKE_BUILD:-build}"
out=$(cd "${FATTN_CMAKE_BUILD:-build}" && pwd)
prefix="$out/cmake-install"
jobs=$(nproc 2>/dev/null || echo 2)
start=$(date +%s)
step() { echo; echo "=== $* ($(( $(date +%s) - start ))s)"; }

# Absolute paths, so that CMake records the interpreter of this venv, not a relative name.
python_exe=$("$PYTHON" -c "import sys; print(sys.executable)")
torch_dir=$("$PYTHON" -c "import torch, os; print(os.path.dirname(torch.__file__))")

step "configure libfattn (torch at $torch_dir, archs '${FATTN_CUDA_ARCHS:-all}', head dims '${FATTN_HEAD_DIMS:-all}')"
cmake -S . -B "$out/cmake-lib" -DPython3_EXECUTABLE="$python_exe" \
      -DTORCH_DIR="$torch_dir" -DCMAKE_INSTALL_PREFIX="$prefix" \
      -DFATTN_CUDA_ARCHS="${FATTN_CUDA_ARCHS:-}" -DFATTN_HEAD_DIMS="${FATTN_HEAD_DIMS:-}"

step "build libfattn (aot_build, then the C++ sources)"
cmake --build "$out/cmake-lib" --parallel "$jobs"

step "install into $prefix"
cmake --install "$out/cmake-lib"

step "configure the example against $prefix"
# --as-needed, as Ubuntu's linker does by default: the program only reaches fattn through
# the dispatcher, so this checks that <fattn/fattn.h> keeps libfattn.so linked.
cmake -S examples/cpp -B "$out/cmake-example" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$torch_dir/share/cmake;$prefix" \
      -DCMAKE_EXE_LINKER_FLAGS="-Wl,--as-needed"

step "build the example"
cmake --build "$out/cmake-example" --parallel "$jobs"

step "run the example"
"$out/cmake-example/fattn_decode_example"
step "done"
