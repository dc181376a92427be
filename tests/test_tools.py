"""The offline tools run on a CPU in their --quick modes: the tuner and the decode tile search
(Triton's interpreter) and the benchmarks. They launch the kernels by argument name, so a kernel signature
change that they do not follow fails here rather than in the next search on a GPU."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("script", ["tune_decode", "bench_variants", "bench_chunked_prefill"])
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


def test_tuner_smoke_run_chooses_a_checked_config_per_kernel(tmp_path):
    # aot_build/tune.py under the interpreter: every kernel gets a chosen config that passed the
    # accuracy check and has timings (test_aot_build.py checks how the grid reads such a file).
    out = tmp_path / "sm0.json"
    result = subprocess.run([sys.executable, "-m", "aot_build.tune", "--device", "cpu", "--out", str(out)], cwd=ROOT,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert set(data["kernels"]) == {"attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq"}
    for kernel, buckets in data["kernels"].items():
        entry = buckets["16"]
        chosen = [c for c in entry["candidates"] if c["config"] == entry["chosen"]]
        assert chosen and "rejected" not in chosen[0] and all(c["ms"] > 0 for c in chosen[0]["cases"]), kernel
        assert set(entry["chosen"]) == {"BLOCK_M", "BLOCK_N", "num_warps", "num_stages"}
