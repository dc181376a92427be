#!/usr/bin/env bash
# Runs on the GPU machine from the repository root with a library built elsewhere:
# GPU tests, then optional benchmarks. Results go to $OUT (or ./gpu_out).
# Usage: scripts/gpu_check.sh [tests|bench|all|ring|bars]
#   bars: the Hopper speed bars (benchmarks/check_bars.py) from a forward and a backward run of
#   benchmarks/bench_attention.py with every peer, the two on separate GPUs where there are two.
#   ring: on a machine of several GPUs, the multi-GPU tests (device guard, NCCL ring with every
#   variant, ALiBi's offsets) and benchmarks/bench_ring.py over every GPU, full causal and a 4k
#   window at RING_TOKENS (default 32768) tokens per GPU -> $OUT/ring.json.
#   default: the source package python/fattn (with a carried python/fattn/libfattn.so)
#   FATTN_WHEEL=dist/fattn-...whl: pip-installs that wheel (--no-deps) into a scratch
#   folder and tests it instead, proving a wheel built elsewhere works with this torch.
#   tests on several GPUs: one pytest per GPU over its share of the test files (the two-GPU tests
#   first, over all of them); GPU_SPLIT=0 runs one pytest over the whole suite instead.
#   BENCH_PASSES (default "forward backward"): any of forward, backward (bench_attention.py,
#   extra flags in BENCH_ARGS) and decode (bench_decode.py -> $OUT/decode.json, flags in DECODE_ARGS),
#   e.g. BENCH_PASSES=decode scripts/gpu_check.sh bench
set -o pipefail
OUT=${OUT:-$PWD/gpu_out}; mkdir -p "$OUT"
if [[ -n ${FATTN_WHEEL:-} ]]; then
  rm -rf /tmp/fattn_wheel_site
  python3 -m pip install -q --no-deps --no-index --target /tmp/fattn_wheel_site "$FATTN_WHEEL" || exit 1
  export PYTHONPATH=/tmp/fattn_wheel_site:$PWD${PYTHONPATH:+:$PYTHONPATH}
  python3 -c "import fattn; assert fattn.__file__.startswith('/tmp/fattn_wheel_site'), fattn.__file__"
else
  export PYTHONPATH=$PWD/python:$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
# A test still running after this many seconds gets every thread's Python stack in the log
# (pytest's faulthandler_timeout): a stalled kernel then names its test and call instead of
# showing only as the time limit.
stall=(-o "faulthandler_timeout=${TEST_STALL_S:-600}")
if ! python3 -c "import pytest" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
nvidia-smi -L
python3 -m fattn info | tee "$OUT/info.txt"
what=${1:-all}
if [[ $what == tests || $what == all ]]; then
  torch_lib=$(python3 -c "import torch, os; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))")
  nm -D --defined-only "$torch_lib/libtorch_cpu.so" | awk '{print $3}' | grep -E '^(aoti_torch_|torch_)' \
    | sed 's/@.*//' | sort -u > "$OUT/torch_exports.txt"
  gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
  if (( gpus > 1 )) && [[ ${GPU_SPLIT:-1} != 0 ]]; then
    # The suite takes over 5 minutes on one GPU: with several, the tests that need two GPUs run
    # first over all of them, then one pytest per GPU: the last GPU takes the compute-sanitizer
    # runs of test_hardening_gpu.py (over 3 minutes alone), the others the remaining files with GPU
    # tests, dealt out largest first to the GPU with the fewest bytes of tests so far.
    # gpu_tests.log holds each part's log in turn.
    multi=(tests/test_multi_gpu.py tests/test_ring_gpu.py)
    python3 -m pytest "${multi[@]}" -q -m gpu -p no:cacheprovider "${stall[@]}" ${PYTEST_ARGS:-} > "$OUT/gpu_tests_multi.log" 2>&1
    failed=$?
    mapfile -t groups < <(python3 - "$gpus" "${multi[@]}" <<'PY'
import sys
from pathlib import Path
gpus, skip = int(sys.argv[1]), set(sys.argv[2:])
sanitizer = "tests/test_hardening_gpu.py"
files = sorted((f for f in Path("tests").glob("test_*.py")
                if str(f) not in skip | {sanitizer} and "mark.gpu" in f.read_text()), key=lambda f: -f.stat().st_size)
groups, load = [[] for _ in range(gpus - 1)], [0] * (gpus - 1)
for f in files:
    i = load.index(min(load))
    groups[i].append(str(f))
    load[i] += f.stat().st_size
print(*(" ".join(g) for g in groups + [[sanitizer]]), sep="\n")
PY
)
    pids=()
    for i in "${!groups[@]}"; do
      CUDA_VISIBLE_DEVICES=$i python3 -m pytest ${groups[$i]} -q -m gpu -p no:cacheprovider "${stall[@]}" ${PYTEST_ARGS:-} \
        > "$OUT/gpu_tests_gpu$i.log" 2>&1 &
      pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
    for f in "$OUT/gpu_tests_multi.log" "$OUT"/gpu_tests_gpu*.log; do
      echo "=== $(basename "$f")"; cat "$f"; rm "$f"
    done > "$OUT/gpu_tests.log"
    grep -E "^=== |(passed|failed|skipped|error).* in [0-9.]+s" "$OUT/gpu_tests.log"
    (( failed == 0 )) || echo "gpu_check: GPU tests failed (see $OUT/gpu_tests.log)"
  else
    python3 -m pytest tests -q -m gpu -p no:cacheprovider "${stall[@]}" ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/gpu_tests.log"
  fi
fi
if [[ $what == bench || $what == all ]]; then
  for pass in ${BENCH_PASSES:-forward backward}; do
    if [[ $pass == decode ]]; then
      python3 benchmarks/bench_decode.py --out "$OUT/decode.json" ${DECODE_ARGS:-} 2>&1 | tee "$OUT/bench_decode.log"
    else
      python3 benchmarks/bench_attention.py --pass $pass --out "$OUT/$pass.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench_$pass.log"
    fi
  done
fi
if [[ $what == bars ]]; then
  # The Hopper speed bars: forward and backward over head dims 64, 128 and 256 with every peer
  # (FlexAttention's compiles make each pass minutes long), on two GPUs at once where there are
  # two, then benchmarks/check_bars.py over both runs -> $OUT/bars.log: every bar set, the
  # peers' one (the faster of FlashAttention-4 and cuDNN per row) included; without
  # flash-attn-4 installed its rows read missing.
  gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
  pids=()
  for pass in forward backward; do
    gpu=0; [[ $pass == backward ]] && (( gpus > 1 )) && gpu=1
    CUDA_VISIBLE_DEVICES=$gpu python3 benchmarks/bench_attention.py --pass $pass --head-dims 64,128,256 \
      --out "$OUT/$pass.json" ${BENCH_ARGS:-} > "$OUT/bench_$pass.log" 2>&1 &
    pids+=($!)
    (( gpus > 1 )) || wait "${pids[-1]}"
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  python3 benchmarks/check_bars.py --bars all "$OUT/forward.json" "$OUT/backward.json" 2>&1 | tee "$OUT/bars.log"
fi
if [[ $what == ring ]]; then
  gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1  # no NVLink multicast
  python3 -m pytest -q -m gpu -p no:cacheprovider "${stall[@]}" tests/test_multi_gpu.py tests/test_ring_gpu.py \
    tests/test_alibi_offset.py ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/ring_gpu_tests.log"
  python3 -m torch.distributed.run --nproc-per-node="$gpus" benchmarks/bench_ring.py --windows=-1,4096 \
    --tokens "${RING_TOKENS:-32768}" --out "$OUT/ring.json" 2>&1 | tee "$OUT/bench_ring.log"
fi
