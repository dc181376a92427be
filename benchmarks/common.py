"""Timing and environment records shared by the benchmark CLIs."""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
from pathlib import Path

import torch


def time_ms(fn, warmup=5, reps=30):
    """Median milliseconds of `fn()` over `reps` runs, timed with CUDA events after warm-up."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def environment() -> dict:
    import fattn

    info = fattn.build_info()
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        commit = ""
    env = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "cc": list(torch.cuda.get_device_capability()) if torch.cuda.is_available() else None,
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "fattn_kernels_triton": info["triton_version"], "fattn_commit": commit,
        "python": platform.python_version(),
    }
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        pass
    return env


def write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1))
