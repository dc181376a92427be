"""The forward and backward kernels' logic on a CPU: triton_src/forward.py and backward.py run
by Triton's interpreter (tests/interpret_attention_kernels.py) against fattn's float64 CPU ops.

CI has no GPU, so this is where the window ranges (the masked edges, the unmasked middle and
the skipped tiles, in both the key-tile and the query-tile direction), the softcap and its
derivative, ALiBi (with its alibi_offset) and rows outside every window are checked in the Triton source before the
device runs the compiled cubins (test_variants_gpu.py); and the packed (varlen) addressing:
each program's sequence span, tiles past a short sequence's end, lse in [heads, total_q],
seqused_k, and spare rows after the last sequence left untouched (test_varlen_gpu.py); and
segment ids, which mask every tile of the span each tile needs (a document's tiles skip the
others', checked by making another document's inputs NaN); the additive bias (with -inf entries, rows masked
entirely, dbias) and dropout, whose keep-mask the kernels and the CPU op draw from one seed."""

from pathlib import Path

import pytest

from helpers import run_interpreted

pytestmark = pytest.mark.slow  # the slow tier (-m slow): the attention kernels under Triton's interpreter

SCRIPT = Path(__file__).with_name("interpret_attention_kernels.py")
CASES = [
    "plain-gqa2", "causal-sq-above-sk", "window5-causal", "window0-0", "window0-0-sq-above-sk", "window20-3",
    "window3-20", "window1-1-gqa4", "window-right-only", "softcap", "alibi-heads-causal",
    "alibi-batch-window-softcap", "all-causal-window-sq-above-sk", "alibi-offset-negative-causal-window",
    "alibi-offset-positive-softcap",
    "segments-causal", "segments-window-softcap-sq-below-sk", "segments-long-documents-gqa2", "segments-unsorted-gqa2",
    "segments-unsorted-causal-softcap", "segments-other-document-poisoned", "sinks-causal-sq-above-sk-gqa2",
    "sinks-window-softcap", "bias-heads-broadcast-causal", "bias-window-softcap-alibi", "dropout-gqa2",
    "dropout-bias-causal-window", "varlen-gqa2", "varlen-causal-q-and-k-differ",
    "varlen-window-softcap-alibi", "varlen-seqused-k-causal", "varlen-dropout-causal",
]


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(SCRIPT, timeout=900)


def test_every_case_ran(interpreted):
    seed, rows = interpreted
    assert sorted(rows) == sorted(CASES), f"seed {seed}: {sorted(rows)}"
    # Rows that see no key (causal or a window with seqlen_q > seqlen_k) occur, and must come
    # out empty.
    assert rows["causal-sq-above-sk"]["empty_rows"] > 0
    assert rows["window0-0-sq-above-sk"]["empty_rows"] > 0
    assert rows["varlen-seqused-k-causal"]["empty_rows"] > 0
    # A row whose bias is -inf for every key is empty too.
    assert rows["bias-heads-broadcast-causal"]["empty_rows"] > 0


@pytest.mark.parametrize("case", CASES)
def test_kernels_match_cpu_ops(interpreted, case):
    seed, rows = interpreted
    r = rows[case]
    # fp32 kernels against the float64 definition: rounding only (NaN fails: an unwritten element),
    # which grows with the values' size: 2e-5 of the largest, or absolute below 1 (a gradient
    # summed over many rows reaches several units, and a fixed 2e-5 failed one seed in many).
    for name in ("out", "dq", "dk", "dv"):
        bound = 2e-5 * max(1.0, r[f"{name}_scale"])
        assert r[f"{name}_err"] < bound, f"seed {seed} {case}: {name} error {r[f'{name}_err']} (bound {bound:.2e})"
    assert r["lse_pattern"], f"seed {seed} {case}: the -inf rows of lse differ"
    assert r["lse_err"] < 2e-5, f"seed {seed} {case}: lse error {r['lse_err']}"
    if "dbias_err" in r:  # the bias's gradient (dS) as the dK/dV kernel writes it
        assert r["dbias_err"] < 2e-5, f"seed {seed} {case}: dbias error {r['dbias_err']}"
    else:
        assert not case.startswith("bias"), f"{case}: no dbias was compared"
