"""Runs a worker script on `world` GPUs, one process per GPU under torchrun, NVLink multicast off."""

import os
import subprocess
import sys


def run_on_gpus(worker, world: int, done: str, timeout: int = 900) -> None:
    """Fails with the output's tail unless every rank exits 0 and prints `done`."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={world}", str(worker)]
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    print(result.stdout[-6000:])
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]
    assert result.stdout.count(done) == world, result.stdout[-6000:]
