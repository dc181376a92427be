"""Running a kernel script under Triton's interpreter (TRITON_INTERPRET=1, CPU) in a fresh
process, because Triton reads TRITON_INTERPRET when the kernels are decorated."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest


def run_interpreted(script, timeout: int = 900) -> tuple[str, dict]:
    """(seed, {case: row}) from `script`'s JSON lines, on fresh random inputs (the seed goes in
    failure messages). Skips where the interpreter cannot run."""
    pytest.importorskip("triton", reason="the Triton interpreter needs triton (a build requirement)")
    numpy = pytest.importorskip("numpy")
    if tuple(int(x) for x in numpy.__version__.split(".")[:2]) >= (2, 3):
        pytest.skip(f"Triton 3.6's interpreter fails with numpy {numpy.__version__} (it needs numpy < 2.3)")
    env = dict(os.environ, TRITON_INTERPRET="1")
    seed = str(random.randrange(1 << 30))
    run = subprocess.run([sys.executable, str(script), seed], env=env, capture_output=True, text=True,
                         timeout=timeout)
    assert run.returncode == 0, f"seed {seed}:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    return seed, {r["case"]: r for r in rows}
