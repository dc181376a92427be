#!/usr/bin/env bash
# Builds a release into dist/: the full-grid wheel (portable toolchain), the source
# distribution and SHA256SUMS, and runs every check on them:
#   scripts/check_wheel.py with auditwheel (glibc ceiling <= 2.28, no libstdc++/libgcc_s,
#   tag = ceiling, size <= 60 MB), a wheel built from the sdist, the PTX ISA of the
#   kernels, and the wheel installed in a fresh venv: info, demo and the CPU tests.
#
# Usage: PYTHON=/path/to/python scripts/build_release.sh
# PYTHON (default python3) needs torch, triton==3.6.0, ziglang==0.17.1, build and
# setuptools; auditwheel and the test venv are made under a temporary folder. About
# 9 minutes on 2 cores with a cold kernel cache (FATTN_AOT_CACHE, default build/aot_cache).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
start=$(date +%s)
step() { echo; echo "=== $* ($(( $(date +%s) - start ))s)"; }

for knob in FATTN_CUDA_ARCHS FATTN_HEAD_DIMS FATTN_PTX_ARCHS FATTN_TOOLCHAIN CXX; do
  if [ -n "${!knob:-}" ]; then
    echo "error: $knob is set; a release holds the full grid, linked by the portable toolchain" >&2
    exit 1
  fi
done
# Absolute, so that the wheel built from the unpacked sdist reads the same cache.
export FATTN_AOT_CACHE=${FATTN_AOT_CACHE:-$PWD/build/aot_cache}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

step "source distribution and wheel (full grid, zig c++)"
rm -rf dist
"$PYTHON" -m build --sdist --no-isolation
"$PYTHON" -m build --wheel --no-isolation
wheel=$(ls dist/fattn-*.whl)
sdist=$(ls dist/fattn-*.tar.gz)

step "check the wheel, with auditwheel"
python3 -m venv "$work/audit"
"$work/audit/bin/pip" install -q auditwheel
"$PYTHON" scripts/check_wheel.py "$wheel" --auditwheel "$work/audit/bin/auditwheel"
"$PYTHON" scripts/ptx_isa.py

step "a wheel from the source distribution (same kernels: from the cache)"
mkdir "$work/sdist"
tar xzf "$sdist" -C "$work/sdist"
(cd "$work/sdist"/fattn-* && "$PYTHON" -m build --wheel --no-isolation --outdir "$work/sdist/dist")
"$PYTHON" scripts/check_wheel.py "$work/sdist/dist"/fattn-*.whl

step "the wheel in a fresh venv: info, demo, CPU tests"
torch_version=$("$PYTHON" -c "import torch; print(torch.__version__.split('+')[0])")
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q "torch==$torch_version" triton==3.6.0 pytest "numpy<2.3"
"$work/venv/bin/pip" install -q --no-deps "$wheel"
(cd "$work" && "$work/venv/bin/python" -m fattn info && "$work/venv/bin/python" -m fattn demo)
# Run from the tree for the tests' files; fattn itself comes from the venv (python/ is
# not on its path). The C++ example builds from source, not from the wheel.
"$work/venv/bin/python" -m pytest tests -q -p no:cacheprovider -k "not cpp_example"

step "SHA256SUMS"
(cd dist && sha256sum fattn-* > SHA256SUMS && cat SHA256SUMS)
ls -l dist
echo "release built and checked in $(( $(date +%s) - start ))s"
