"""Context parallelism on several GPUs over NCCL: the packed ring, the all-to-all (Ulysses) and
their product against float64 attention, torch.compile and CUDA graph capture of a step, one
process per GPU under torchrun (the checks live in cp_gpu_worker.py). World 1 runs on one GPU: the
GPU path of every scheme (each document whole on its rank), compile and capture, with no exchange."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu



@pytest.mark.parametrize("world", [1, 2, 4])
def test_context_parallel_on_gpus_matches_float64_reference(world):
    if torch.cuda.device_count() < world:
        pytest.skip("needs a GPU" if world == 1 else f"needs {world} GPUs")
    worker = Path(__file__).with_name("cp_gpu_worker.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={world}", str(worker)]
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    print(result.stdout[-6000:])
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]
    assert result.stdout.count("all context-parallel checks passed") == world
