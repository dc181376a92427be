"""The decode kernels' logic on a CPU: triton_src/decode.py run by Triton's interpreter
(tests/interpret_decode_kernels.py) against fattn's float64 CPU decode op.

CI has no GPU, so this is where the split-K chunking, the page mapping, the append, the
window and softcap masks, ALiBi and the merge of the Triton source are checked before the device
runs the compiled cubins (test_decode_gpu.py)."""

from pathlib import Path

import pytest

from helpers import run_interpreted

pytestmark = pytest.mark.slow  # the slow tier (-m slow): the decode kernels under Triton's interpreter

SCRIPT = Path(__file__).with_name("interpret_decode_kernels.py")


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(SCRIPT, timeout=600)


def test_every_case_ran(interpreted):
    seed, rows = interpreted
    assert len(rows) == 26, f"seed {seed}: {sorted(rows)}"
    # The batch holds an empty sequence (no append): its rows must come out empty.
    assert rows["paged16-mha-3splits"]["empty_rows"] > 0


@pytest.mark.parametrize("case", [
    "contiguous-gqa4-1split", "paged16-mha-3splits", "paged16-keytiles32-mha-3splits",
    "paged16-keytiles32-window-leftpad-gqa4-2splits", "paged32-window-leftpad-gqa4-3splits",
    "contiguous-mqa-causal-2rowtiles-9splits",
    "paged16-window-both", "contiguous-window-left-softcap", "paged32-window-right-9splits",
    "paged16-causal-softcap", "paged16-causal-softcap-alibi-gqa4", "paged16-causal-sinks-gqa4-9splits",
    "contiguous-window-sinks-1split", "contiguous-rotary-gptj-batchidx-leftpad-3splits",
    "paged16-rotary-neox-noncausal-leftpad", "paged16-wide-40q-causal-rotary-neox-2splits",
    "contiguous-wide-33q-window-batchidx-leftpad", "paged16-wide-mods-24q-causal-softcap-alibi-3splits",
    "paged32-wide-20q-window-leftpad-2splits", "paged16-wide-keytiles32-20q-causal-leftpad-2splits",
    "paged16-causal-leftpad-gqa4-16q-1split", "paged16-wide-48q-causal-leftpad-1split",
    "fp8-e4m3-contiguous-gqa4-3splits", "fp8-e5m2-paged16-window-softcap-1split",
    "fp8-e4m3-contiguous-batchidx-leftpad-kdescale-2splits", "fp8-e4m3-paged16-bf16q-magnitudes-2splits",
])
def test_kernels_match_cpu_op(interpreted, case):
    seed, rows = interpreted
    r = rows[case]
    # fp32 kernels against the float64 definition: rounding only (NaN fails: unwritten output).
    # FP8 cases: relative to the largest output and lse (their saturated values reach thousands).
    out_tol, lse_tol = 1e-4 * max(1.0, r.get("out_scale", 1.0)), 1e-4 * max(1.0, r.get("lse_scale", 1.0))
    if "bf16q" in case:
        # out in bf16, which Triton 3.6's interpreter truncates to (a whole unit in the last of its
        # 8 bits), and P on its way to V in float16 (half a unit in the last of 11): rounding only.
        out_tol = 2.0 ** -7 * r["out_scale"] + 2.0 ** -11 * r["v_scale"]
    assert r["out_err"] < out_tol, f"seed {seed} {case}: out error {r['out_err']}"
    assert r["lse_pattern"], f"seed {seed} {case}: the -inf rows of lse differ"
    assert r["lse_err"] < lse_tol, f"seed {seed} {case}: lse error {r['lse_err']}"
    if case.startswith("fp8"):  # bit for bit
        assert r["cache_ok"], f"seed {seed} {case}: the appended cache is {r['cache_err']} FP8 steps from the op's"
        assert r["saturated"] > 0 or not r["appended"], f"seed {seed} {case}: no appended value saturated"
    elif "rotary" in case:  # keys rotated in fp32 by the kernel, in float64 by the op
        assert r["cache_err"] < 1e-5, f"seed {seed} {case}: the appended cache differs by {r['cache_err']}"
    else:
        assert r["cache_ok"], f"seed {seed} {case}: the appended cache differs from the CPU op's"
