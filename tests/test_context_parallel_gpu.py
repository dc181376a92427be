"""Context parallelism on several GPUs over NCCL: the packed ring, the all-to-all (Ulysses) and
their product against float64 attention, torch.compile and CUDA graph capture of a step, one
process per GPU under torchrun (the checks live in cp_gpu_worker.py). World 1 runs on one GPU: the
GPU path of every scheme (each document whole on its rank), compile and capture, with no exchange."""

from pathlib import Path

import pytest
import torch

from helpers import run_on_gpus

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("world", [1, 2, 4])
def test_context_parallel_on_gpus_matches_float64_reference(world):
    if torch.cuda.device_count() < world:
        pytest.skip("needs a GPU" if world == 1 else f"needs {world} GPUs")
    run_on_gpus(Path(__file__).with_name("cp_gpu_worker.py"), world, "all context-parallel checks passed")
