"""Runs triton_src/forward.py's and backward.py's kernels in Triton's interpreter
(TRITON_INTERPRET=1, CPU, numpy) and compares them with fattn's float64 CPU ops. Invoked by
test_attention_kernels_interpreted.py in a fresh process, because Triton reads
TRITON_INTERPRET when the kernels are decorated.

Dense cases compare with fattn::forward/backward, packed (varlen) cases, random sequence
lengths with and without seqused_k, with fattn::varlen_forward/varlen_backward. The
launches are triton_src/python_launch.py's, which mirror csrc/attention/forward_cuda.cpp and
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

from triton_src.python_launch import (  # noqa: E402
    Packing, Tiles, Variant, backward_dkdv, backward_dq, backward_preprocess, forward,
)

# Small tiles, so that every case crosses several key and query tiles: the window's masked
# edges, the unmasked middle and the skipped tiles all occur. One stage: the
# interpreter runs a program as one thread.
TILES = Tiles(block_m=16, block_n=16, num_warps=4, num_stages=1)


def launch(q, k, v, dout, dlse, causal, window, softcap, alibi, packing=None, segments=None, sinks=None):
    """(out, lse, dq, dk, dv) from the kernels; packing: None (dense) or a Packing."""
    variant = Variant(causal=causal, window=window, softcap=softcap, alibi=alibi, segments=segments, sinks=sinks)
    out, lse = forward(q, k, v, TILES, variant, packing)
    delta = backward_preprocess(out, dout, lse, dlse, TILES, packing)
    dk, dv = backward_dkdv(q, k, v, dout, lse, delta, TILES, variant, packing)
    dq = backward_dq(q, k, v, dout, lse, delta, TILES, variant, packing)
    return out, lse, dq, dk, dv


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
    ("segments-causal", 50, 50, 4, 2, 16, True, (-1, -1), 0.0, "segments"),
    ("segments-window-softcap-sq-below-sk", 37, 58, 2, 2, 24, False, (9, 3), 2.0, "segments"),
    ("sinks-causal-sq-above-sk-gqa2", 53, 37, 4, 2, 16, True, (-1, -1), 0.0, "sinks"),
    ("sinks-window-softcap", 45, 61, 2, 2, 16, False, (5, 3), 1.5, "sinks"),
]

PACKED_CASES = [
    # name, batch, heads, kv_heads, head_dim, causal, window, softcap, alibi, seqused_k, equal q/k lengths
    ("varlen-gqa2", 4, 4, 2, 16, False, (-1, -1), 0.0, None, False, True),
    ("varlen-causal-q-and-k-differ", 5, 2, 2, 24, True, (-1, -1), 0.0, None, False, False),
    ("varlen-window-softcap-alibi", 3, 4, 1, 16, False, (6, 2), 2.0, "batch", False, True),
    ("varlen-seqused-k-causal", 4, 2, 2, 16, True, (-1, -1), 0.0, None, True, False),
]


def run_case(name, seqlen_q, seqlen_k, heads, kv_heads, head_dim, causal, window, softcap, alibi_kind):
    """alibi_kind "segments" gives segment ids instead: random cuts, shared by q and k's ends;
    "sinks" gives sinks."""
    batch = 2
    segments = sinks = None
    if alibi_kind == "sinks":
        sinks = torch.randn(heads)
        alibi_kind = None
    if alibi_kind == "segments":
        longest = max(seqlen_q, seqlen_k)
        cuts = torch.randint(0, longest, (batch, 3))
        ids = (torch.arange(longest)[None, :, None] >= cuts[:, None, :]).sum(-1).int()
        segments = (ids[:, longest - seqlen_q:].contiguous(), ids[:, longest - seqlen_k:].contiguous())
        alibi_kind = None
    q = torch.randn(batch, seqlen_q, heads, head_dim)
    k = torch.randn(batch, seqlen_k, kv_heads, head_dim)
    v = torch.randn(batch, seqlen_k, kv_heads, head_dim)
    dout = torch.randn_like(q)
    dlse = torch.randn(batch, heads, seqlen_q)
    alibi = None if alibi_kind is None else torch.rand((heads,) if alibi_kind == "heads" else (batch, heads)) * 0.3
    options = (causal, False, window[0], window[1], softcap, alibi, *(segments or (None, None)))
    want_out, want_lse = torch.ops.fattn.forward(q.double(), k.double(), v.double(), None, *options, sinks)
    finite = torch.isfinite(want_lse)
    want = torch.ops.fattn.backward(dout.double(), q.double(), k.double(), v.double(), want_out, want_lse,
                                    dlse.double().masked_fill(~finite, 0), None, *options)
    got = launch(q, k, v, dout, dlse.masked_fill(~finite, 0), causal, window, softcap, alibi, segments=segments,
                 sinks=sinks)
    return compare(name, got, want_out, want_lse, want)


def packed_lengths(batch, equal):
    """Random lengths 0..70 (an empty sequence included) for q, and for k equal or independent."""
    lq = torch.randint(1, 70, (batch,))
    lq[1] = 0
    lk = lq.clone() if equal else torch.randint(1, 70, (batch,))
    return lq, lk


def run_packed_case(name, batch, heads, kv_heads, head_dim, causal, window, softcap, alibi_kind, seqused, equal):
    lq, lk = packed_lengths(batch, equal)
    cu_q = torch.nn.functional.pad(lq.cumsum(0), (1, 0)).int()
    cu_k = torch.nn.functional.pad(lk.cumsum(0), (1, 0)).int()
    used = (lk * torch.rand(batch)).long().int() if seqused else None
    # Two spare rows past the last sequence: the op must leave them alone (zeros).
    q = torch.randn(int(cu_q[-1]) + 2, heads, head_dim)
    k = torch.randn(int(cu_k[-1]) + 2, kv_heads, head_dim)
    v = torch.randn_like(k)
    dout = torch.randn_like(q)
    alibi = None if alibi_kind is None else torch.rand((heads,) if alibi_kind == "heads" else (batch, heads)) * 0.3
    max_q, max_k = int(lq.max()), int(lk.max())
    options = (None, causal, False, window[0], window[1], softcap, alibi)
    varlen = (cu_q, cu_k, max_q, max_k, used)
    want_out, want_lse = torch.ops.fattn.varlen_forward(q.double(), k.double(), v.double(), *varlen, *options)
    finite = torch.isfinite(want_lse)
    dlse = torch.randn(heads, q.shape[0]).masked_fill(~finite, 0)
    want = torch.ops.fattn.varlen_backward(dout.double(), q.double(), k.double(), v.double(), want_out, want_lse,
                                           dlse.double(), *varlen, *options)
    got = launch(q, k, v, dout, dlse, causal, window, softcap, alibi, packing=Packing(cu_q, cu_k, max_q, max_k, used))
    return compare(name, got, want_out, want_lse, want)


def compare(name, got, want_out, want_lse, want_grads):
    finite = torch.isfinite(want_lse)
    row = {"case": name, "empty_rows": int((~finite).sum()),
           "lse_pattern": bool(torch.equal(torch.isfinite(got[1]), finite)),
           "lse_err": (got[1].double()[finite] - want_lse[finite]).abs().max().item() if finite.any() else 0.0}
    for label, g, w in zip(("out", "dq", "dk", "dv"), (got[0], *got[2:]), (want_out, *want_grads)):
        row[f"{label}_err"] = (g.double() - w).abs().max().item()  # NaN if any element was left unwritten
    return row


if __name__ == "__main__":
    torch.manual_seed(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    for case in CASES:
        print(json.dumps(run_case(*case)), flush=True)
    for case in PACKED_CASES:
        print(json.dumps(run_packed_case(*case)), flush=True)
