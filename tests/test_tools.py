"""The offline tools run on a CPU in their --quick modes: the tile searches (Triton's interpreter)
and the variants benchmark. They launch the kernels by argument name, so a kernel signature
change that they do not follow fails here rather than in the next search on a GPU."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("script", ["tune_forward", "tune_backward", "tune_decode", "bench_variants",
                                    "bench_chunked_prefill"])
def test_quick_run_times_every_case(script, tmp_path):
    out = tmp_path / "result.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{script}.py"), "--device", "cpu", "--quick",
                             "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert rows
    if script == "bench_variants":  # a benchmark times every implementation of every case
        assert all(r["ms"] for r in rows), [r for r in rows if not r["ms"]][:3]
    elif script == "bench_chunked_prefill":  # every fattn path (a CPU has no SDPA flash/cuDNN/efficient)
        fattn_rows = [r for r in rows if r["impl"].startswith("fattn")]
        assert len(fattn_rows) == 4 and all(r["ms"] for r in fattn_rows), fattn_rows
    else:  # a search may meet configs that cannot run, but times at least one per case
        assert any(r["ms"] for r in rows)
