"""Ring attention on several GPUs over NCCL, one process per GPU under torchrun
(skipped without 2 GPUs). The checks themselves live in ring_gpu_worker.py."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu


WORLDS = [w for w in (2, 4) if w <= torch.cuda.device_count()] or [2]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 or more GPUs")
@pytest.mark.parametrize("world", WORLDS)
def test_ring_on_gpus_matches_float64_reference(world):
    worker = Path(__file__).with_name("ring_gpu_worker.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={world}", str(worker)]
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    print(result.stdout[-4000:])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert result.stdout.count("all ring checks passed") == world
