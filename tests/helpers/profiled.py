"""What a GPU call launched, read from the torch profiler: kernel names, and one kernel's grids."""

from __future__ import annotations

import json
import os
import tempfile

import torch


def _profile(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return prof


def kernels_launched(fn) -> set[str]:
    """The names of the CUDA kernels fn launched."""
    return {e.name for e in _profile(fn).events() if e.device_type == torch.autograd.DeviceType.CUDA}


def kernels_launched_by_kernel(fn) -> set[str]:
    """kernels_launched, each Hopper kernel's form with host-made maps (`<kernel>_maps`: dense
    calls up to the op's limits; the tests of the maps say which form runs) under its kernel's name."""
    return {name.removesuffix("_maps") for name in kernels_launched(fn)}


def launch_args(fn, kernel: str, key: str) -> list:
    """One launch property (the profiler trace's `key`: "grid", "shared memory", ...) of each
    launch of `kernel` in fn."""
    prof = _profile(fn)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    return [e["args"][key] for e in events if e.get("name") == kernel and key in e.get("args", {})]


def launch_grids(fn, kernel: str) -> list[tuple[int, int, int]]:
    """The grid of each launch of `kernel` in fn, from the profiler's trace."""
    return [tuple(g) for g in launch_args(fn, kernel, "grid")]
