"""Runs triton_src/forward.py's and backward.py's kernels in Triton's interpreter
(TRITON_INTERPRET=1, CPU, numpy) and compares them with fattn's float64 CPU ops. Invoked by
test_attention_kernels_interpreted.py in a fresh process, because Triton reads
TRITON_INTERPRET when the kernels are decorated.

Dense cases compare with fattn::forward/backward (the bias cases also dbias; the dropout cases
draw the same keep-mask from the same seed on both sides), packed (varlen) cases, random sequence
lengths with and without seqused_k, with fattn::varlen_forward/varlen_backward. The
launches are tuning/launch.py's, which mirror csrc/attention/forward_cuda.cpp and
backward_cuda.cpp through the kernels' specs.
Prints one JSON line per case with the largest errors of out, lse, dq, dk and dv.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import fattn  # noqa: E402,F401  (loads the library: the CPU ops are the reference)

from tuning.launch import (  # noqa: E402
    Packing, Tiles, Variant, backward_dkdv, backward_dq, backward_preprocess, forward,
)

# Small tiles, so that every case crosses several key and query tiles: the window's masked
# edges, the unmasked middle and the skipped tiles all occur. One stage: the
# interpreter runs a program as one thread.
TILES = Tiles(block_m=16, block_n=16, num_warps=4, num_stages=1)


def launch(q, k, v, dout, dlse, causal, window, softcap, alibi, packing=None, segments=None, sinks=None, bias=None,
           dropout_p=0.0, dropout_seed=None, alibi_offset=0):
    """(out, lse, dq, dk, dv) from the kernels, and dbias with a bias; packing: None (dense) or a
    Packing."""
    variant = Variant(causal=causal, window=window, softcap=softcap, alibi=alibi, alibi_offset=alibi_offset,
                      segments=segments, sinks=sinks, bias=bias, dropout_p=dropout_p, dropout_seed=dropout_seed)
    out, lse = forward(q, k, v, TILES, variant, packing)
    delta = backward_preprocess(out, dout, lse, dlse, TILES, packing)
    dk, dv, *dbias = backward_dkdv(q, k, v, dout, lse, delta, TILES, variant, packing, want_dbias=bias is not None)
    dq = backward_dq(q, k, v, dout, lse, delta, TILES, variant, packing)
    return (out, lse, dq, dk, dv, *dbias)


CASES = [
    # name, seqlen_q, seqlen_k, heads, kv_heads, head_dim, causal, window, softcap, alibi ("heads"/"batch"/None)
    ("plain-gqa2", 37, 53, 4, 2, 16, False, (-1, -1), 0.0, None),
    ("causal-sq-above-sk", 53, 37, 2, 2, 24, True, (-1, -1), 0.0, None),
    ("window5-causal", 50, 50, 2, 1, 16, True, (5, -1), 0.0, None),
    ("window0-0", 41, 41, 2, 2, 16, False, (0, 0), 0.0, None),
    ("window0-0-sq-above-sk", 61, 41, 2, 2, 16, False, (0, 0), 0.0, None),
    ("window20-3", 45, 61, 2, 2, 16, False, (20, 3), 0.0, None),
    ("window3-20", 61, 45, 2, 2, 16, False, (3, 20), 0.0, None),
    ("window1-1-gqa4", 33, 33, 4, 1, 32, False, (1, 1), 0.0, None),
    ("window-right-only", 40, 70, 2, 2, 16, False, (-1, 7), 0.0, None),
    ("softcap", 37, 53, 2, 2, 16, False, (-1, -1), 1.5, None),
    ("alibi-heads-causal", 48, 48, 4, 2, 16, True, (-1, -1), 0.0, "heads"),
    ("alibi-batch-window-softcap", 39, 57, 2, 2, 24, False, (9, 4), 2.0, "batch"),
    ("all-causal-window-sq-above-sk", 57, 39, 4, 2, 16, True, (12, -1), 3.0, "heads"),
    # ALiBi's distances shifted by alibi_offset (a ring attention piece): negative, so that they
    # change sign inside the tiles, and positive past both lengths.
    ("alibi-offset-negative-causal-window", 45, 53, 4, 2, 16, True, (20, -1), 0.0, "offset-23"),
    ("alibi-offset-positive-softcap", 37, 29, 2, 1, 24, False, (-1, -1), 2.0, "offset+300"),
    ("segments-causal", 50, 50, 4, 2, 16, True, (-1, -1), 0.0, "segments"),
    ("segments-window-softcap-sq-below-sk", 37, 58, 2, 2, 24, False, (9, 3), 2.0, "segments"),
    # Three documents, long enough for tiles of one id, whose keys' run is left unmasked.
    ("segments-long-documents-gqa2", 97, 80, 4, 2, 16, False, (-1, -1), 0.0, "segments-long"),
    # Runs of ids that go up and down, so that a tile's span (first to last key in its ids'
    # range) holds other runs too; with seqlen_q > seqlen_k some query ids have no key.
    ("segments-unsorted-gqa2", 61, 45, 4, 2, 16, False, (-1, -1), 0.0, "segments-unsorted"),
    ("segments-unsorted-causal-softcap", 50, 64, 2, 2, 16, True, (-1, -1), 1.5, "segments-unsorted"),
    # Documents on tile boundaries, the second one's q, k, v and dout all NaN: the first
    # document's results must not see them, which holds only if its tiles skip the second's.
    ("segments-other-document-poisoned", 64, 64, 4, 2, 16, False, (-1, -1), 0.0, "segments-poisoned"),
    ("sinks-causal-sq-above-sk-gqa2", 53, 37, 4, 2, 16, True, (-1, -1), 0.0, "sinks"),
    ("sinks-window-softcap", 45, 61, 2, 2, 16, False, (5, 3), 1.5, "sinks"),
    ("bias-heads-broadcast-causal", 41, 53, 4, 2, 16, True, (-1, -1), 0.0, "bias"),
    ("bias-window-softcap-alibi", 45, 37, 2, 2, 24, False, (9, 4), 2.0, "bias-alibi"),
    ("dropout-gqa2", 37, 53, 4, 2, 16, False, (-1, -1), 0.0, "dropout"),
    ("dropout-bias-causal-window", 50, 50, 2, 1, 16, True, (12, -1), 1.5, "bias-dropout"),
]

PACKED_CASES = [
    # name, batch, heads, kv_heads, head_dim, causal, window, softcap, alibi, seqused_k, equal q/k lengths
    ("varlen-gqa2", 4, 4, 2, 16, False, (-1, -1), 0.0, None, False, True),
    ("varlen-causal-q-and-k-differ", 5, 2, 2, 24, True, (-1, -1), 0.0, None, False, False),
    ("varlen-window-softcap-alibi", 3, 4, 1, 16, False, (6, 2), 2.0, "batch", False, True),
    ("varlen-seqused-k-causal", 4, 2, 2, 16, True, (-1, -1), 0.0, None, True, False),
    ("varlen-dropout-causal", 4, 2, 2, 16, True, (-1, -1), 0.0, "dropout", False, False),
]


def run_case(name, seqlen_q, seqlen_k, heads, kv_heads, head_dim, causal, window, softcap, alibi_kind):
    """alibi_kind "segments" gives segment ids instead: random cuts, shared by q and k's ends
    ("segments-long": two cuts; "segments-unsorted": each run labelled at random; "segments-poisoned": two documents cut at
    a tile boundary, the second's inputs NaN, compared on the first alone);
    "sinks" gives sinks; "bias" a [batch, 1, seqlen_q, seqlen_k] bias with -inf entries and a row
    all -inf ("bias-alibi" with ALiBi slopes too); "dropout" dropout 0.3 ("bias-dropout" both)."""
    batch = 2
    segments = sinks = bias = dropout_seed = None
    dropout_p = 0.0
    alibi_offset = 0
    if alibi_kind is not None and alibi_kind.startswith("offset"):
        alibi_offset, alibi_kind = int(alibi_kind[len("offset"):]), "batch"
    if alibi_kind is not None and "dropout" in alibi_kind:
        dropout_p, dropout_seed = 0.3, torch.randint(-(2**63), 2**63 - 1, (1,), dtype=torch.int64)
        alibi_kind = alibi_kind.replace("dropout", "").strip("-") or None
    if alibi_kind is not None and alibi_kind.startswith("bias"):
        bias = torch.randn(batch, 1, seqlen_q, seqlen_k)
        bias[torch.rand(bias.shape) < 0.2] = float("-inf")
        bias[0, 0, 3] = float("-inf")
        alibi_kind = "heads" if alibi_kind == "bias-alibi" else None
    if alibi_kind == "sinks":
        sinks = torch.randn(heads)
        alibi_kind = None
    poisoned = alibi_kind == "segments-poisoned"
    if alibi_kind in ("segments", "segments-long", "segments-unsorted"):
        longest = max(seqlen_q, seqlen_k)
        cuts = torch.randint(0, longest, (batch, {"segments": 3, "segments-long": 2}.get(alibi_kind, 6)))
        ids = (torch.arange(longest)[None, :, None] >= cuts[:, None, :]).sum(-1)
        if alibi_kind == "segments-unsorted":
            ids = torch.randint(0, 4, (batch, cuts.shape[1] + 1)).gather(1, ids)
        ids = ids.int()
        segments = (ids[:, longest - seqlen_q:].contiguous(), ids[:, longest - seqlen_k:].contiguous())
        alibi_kind = None
    if poisoned:
        first_length = torch.tensor([2, 1])[:, None] * TILES.block_m
        ids = torch.where(torch.arange(seqlen_q)[None, :] < first_length, 5, 9).int()
        segments = (ids, ids.clone())
        alibi_kind = None
    q = torch.randn(batch, seqlen_q, heads, head_dim)
    k = torch.randn(batch, seqlen_k, kv_heads, head_dim)
    v = torch.randn(batch, seqlen_k, kv_heads, head_dim)
    dout = torch.randn_like(q)
    dlse = torch.randn(batch, heads, seqlen_q)
    alibi = None if alibi_kind is None else torch.rand((heads,) if alibi_kind == "heads" else (batch, heads)) * 0.3
    options = (causal, False, window[0], window[1], softcap, alibi, *(segments or (None, None)))
    bias64 = None if bias is None else bias.double()
    want_out, want_lse = torch.ops.fattn.forward(q.double(), k.double(), v.double(), None, *options, sinks, bias64,
                                                 dropout_p, dropout_seed, alibi_offset)
    finite = torch.isfinite(want_lse)
    *want, want_dbias = torch.ops.fattn.backward(dout.double(), q.double(), k.double(), v.double(), want_out,
                                                 want_lse, dlse.double().masked_fill(~finite, 0), None, *options,
                                                 bias64, bias is not None, dropout_p, dropout_seed, alibi_offset)
    inputs = (q, k, v, dout)
    if poisoned:
        second = (segments[0] == 9)[:, :, None, None]
        inputs = tuple(t.masked_fill(second, float("nan")) for t in inputs)
    got = launch(*inputs, dlse.masked_fill(~finite, 0), causal, window, softcap, alibi, segments=segments,
                 sinks=sinks, bias=bias, dropout_p=dropout_p, dropout_seed=dropout_seed, alibi_offset=alibi_offset)
    if poisoned:  # the second document's own results are NaN: take the reference's there
        first = (segments[0] == 5)[:, :, None, None]
        want_all = (want_out, want_lse, *want)
        keep = (first, first[..., 0].transpose(1, 2), first, first, first)
        got = tuple(torch.where(m, g.double(), w) for g, w, m in zip(got, want_all, keep))
    row = compare(name, got[:5], want_out, want_lse, want)
    if bias is not None:
        row["dbias_err"] = (got[5].double() - want_dbias).abs().max().item()
    return row


def packed_lengths(batch, equal):
    """Random lengths 0..70 (an empty sequence included) for q, and for k equal or independent."""
    lq = torch.randint(1, 70, (batch,))
    lq[1] = 0
    lk = lq.clone() if equal else torch.randint(1, 70, (batch,))
    return lq, lk


def run_packed_case(name, batch, heads, kv_heads, head_dim, causal, window, softcap, alibi_kind, seqused, equal):
    """alibi_kind "dropout": dropout 0.3 instead of slopes."""
    dropout_p, dropout_seed = 0.0, None
    if alibi_kind == "dropout":
        dropout_p, dropout_seed = 0.3, torch.randint(-(2**63), 2**63 - 1, (1,), dtype=torch.int64)
        alibi_kind = None
    lq, lk = packed_lengths(batch, equal)
    cu_q = torch.nn.functional.pad(lq.cumsum(0), (1, 0)).int()
    cu_k = torch.nn.functional.pad(lk.cumsum(0), (1, 0)).int()
    used = (lk * torch.rand(batch)).long().int() if seqused else None
    if seqused:  # sequence 0 keeps fewer keys than it has queries, so a causal row of it sees none
        used[0] = min(int(used[0]), int(lq[0]) - 1)
    # Two spare rows past the last sequence: the op must leave them alone (zeros).
    q = torch.randn(int(cu_q[-1]) + 2, heads, head_dim)
    k = torch.randn(int(cu_k[-1]) + 2, kv_heads, head_dim)
    v = torch.randn_like(k)
    dout = torch.randn_like(q)
    alibi = None if alibi_kind is None else torch.rand((heads,) if alibi_kind == "heads" else (batch, heads)) * 0.3
    max_q, max_k = int(lq.max()), int(lk.max())
    options = (None, causal, False, window[0], window[1], softcap, alibi)
    varlen = (cu_q, cu_k, max_q, max_k, used)
    want_out, want_lse = torch.ops.fattn.varlen_forward(q.double(), k.double(), v.double(), *varlen, *options, None,
                                                        dropout_p, dropout_seed)
    finite = torch.isfinite(want_lse)
    dlse = torch.randn(heads, q.shape[0]).masked_fill(~finite, 0)
    want = torch.ops.fattn.varlen_backward(dout.double(), q.double(), k.double(), v.double(), want_out, want_lse,
                                           dlse.double(), *varlen, *options, dropout_p, dropout_seed)
    got = launch(q, k, v, dout, dlse, causal, window, softcap, alibi, packing=Packing(cu_q, cu_k, max_q, max_k, used),
                 dropout_p=dropout_p, dropout_seed=dropout_seed)
    return compare(name, got, want_out, want_lse, want)


def compare(name, got, want_out, want_lse, want_grads):
    finite = torch.isfinite(want_lse)
    row = {"case": name, "empty_rows": int((~finite).sum()),
           "lse_pattern": bool(torch.equal(torch.isfinite(got[1]), finite)),
           "lse_err": (got[1].double()[finite] - want_lse[finite]).abs().max().item() if finite.any() else 0.0}
    for label, g, w in zip(("out", "dq", "dk", "dv"), (got[0], *got[2:]), (want_out, *want_grads)):
        row[f"{label}_err"] = (g.double() - w).abs().max().item()  # NaN if any element was left unwritten
        row[f"{label}_scale"] = w.abs().max().item() if w.numel() else 0.0
    return row


if __name__ == "__main__":
    torch.manual_seed(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    for case in CASES:
        print(json.dumps(run_case(*case)), flush=True)
    for case in PACKED_CASES:
        print(json.dumps(run_packed_case(*case)), flush=True)
