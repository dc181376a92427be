#!/usr/bin/env bash
# Runs flash-attn's own tests/test_flash_attn.py against fattn on a GPU machine, with flash-attn's
# names bound to fattn's functions (flash_attn/ here) and a sample of its items (sample.py).
# Usage: scripts/flash_attn_upstream/run.sh TEST_FILE [EVERY] [pytest args...]
#   TEST_FILE: flash-attn's tests/test_flash_attn.py (fetched from github.com/Dao-AILab/flash-attention)
#   EVERY: keep one item in EVERY of each test function (default 40)
# Needs pytest, einops and, for several workers (-n), pytest-xdist; fattn from python/ (its built
# library beside it) or installed. With -n, workers share out the GPUs (FATTN_UPSTREAM_GPUS).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
test_file=$(realpath "$1"); every=${2:-40}; shift $(( $# < 2 ? $# : 2 ))
repo=$(cd "$here/../.." && pwd)
export PYTHONPATH=$here:$repo/python${PYTHONPATH:+:$PYTHONPATH}
export FATTN_UPSTREAM_GPUS=${FATTN_UPSTREAM_GPUS:-$(python3 -c "import torch; print(torch.cuda.device_count())")}
cd "$(dirname "$test_file")"
exec python3 -m pytest "$test_file" -p sample --sample-every "$every" -q -p no:cacheprovider "$@"
