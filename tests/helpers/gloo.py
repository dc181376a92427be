"""Runs a check on every rank of a gloo process group on the CPU, one process per rank; a rank's
failure fails the test with every failing rank's traceback."""

import os
import tempfile
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# Ranks fork from one server process that has imported torch and fattn once, instead of each
# importing them afresh (spawn): on the 2-core CI machine the ring and context-parallel files ran
# 177 s -> 105 s (slow tier) and 54 s -> 35 s (fast tier). The server is single-threaded when
# it forks (torch starts its thread pools on first use, not at import).
mp.set_forkserver_preload(["torch", "torch.distributed", "fattn"])


def _worker(rank, world, init_file, check, errors_dir):
    try:
        torch.set_num_threads(1)  # one thread per rank: the ranks share few cores, and wait on each other
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
        check(rank, world)
        dist.barrier()
    except BaseException:
        with open(os.path.join(errors_dir, f"rank{rank}.txt"), "w") as f:
            f.write(traceback.format_exc())
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn_gloo(world: int, check) -> None:
    """check(rank, world) on `world` processes; `check` must be a module-level function (it is
    pickled by name into each process)."""
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "init")
        try:
            mp.start_processes(_worker, args=(world, init_file, check, tmp), nprocs=world, join=True,
                               start_method="forkserver")
        except Exception:
            reports = [open(os.path.join(tmp, f)).read() for f in sorted(os.listdir(tmp)) if f.startswith("rank")]
            pytest.fail("\n".join(reports) or "a worker failed")
