"""Runs triton_src/forward.py's and backward.py's kernels in Triton's interpreter
(TRITON_INTERPRET=1, CPU, numpy) and compares them with fattn's float64 CPU ops. Invoked by
test_attention_kernels_interpreted.py in a fresh process, because Triton reads
TRITON_INTERPRET when the kernels are decorated.

The launches mirror csrc/attention/forward_cuda.cpp and backward_cuda.cpp, through the
kernels' specs (triton_src/spec.py), which take every argument by name as the C++ launchers
do; the score encoding (qk_scale, softcap_log2) is attention_variant.cpp's kernel_scores.
Prints one JSON line per case with the largest errors of out, lse, dq, dk and dv.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402

import fattn  # noqa: E402,F401  (loads the library: the CPU ops are the reference)

from triton_src.backward import ATTN_BWD_DKDV, ATTN_BWD_DQ, ATTN_BWD_PREPROCESS  # noqa: E402
from triton_src.forward import ATTN_FWD  # noqa: E402
from triton_src.spec import tensor_strides  # noqa: E402

# Small tiles, so that every case crosses several key and query tiles: the window's masked
# edges, the unmasked middle and the skipped tiles all occur.
BLOCK_M, BLOCK_N = 16, 16
LAUNCH = dict(num_warps=4, num_stages=1)  # the interpreter runs a program as one thread
LOG2E = math.log2(math.e)


def variant_args(q, causal, window, softcap, alibi):
    batch, seqlen_q, heads, head_dim = q.shape
    scale = 1 / math.sqrt(head_dim)
    left, right = window
    slopes = alibi if alibi is not None else torch.zeros(1)
    return dict(
        window_left=left, window_right=0 if causal else right,
        Alibi=slopes, stride_alibib=alibi.stride(0) if alibi is not None and alibi.dim() == 2 else 0,
        stride_alibih=slopes.stride(-1), use_alibi=int(alibi is not None),
        qk_scale=scale / softcap if softcap > 0 else scale * LOG2E,
        softcap_log2=softcap * LOG2E if softcap > 0 else 0.0), scale


def launch(q, k, v, dout, dlse, causal, window, softcap, alibi):
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k, kv_heads = k.shape[1], k.shape[2]
    block_d = triton.next_power_of_2(head_dim)
    shape = dict(seqlen_q=seqlen_q, seqlen_k=seqlen_k, num_heads=heads, kv_group_size=heads // kv_heads,
                 head_dim=head_dim)
    variant, scale = variant_args(q, causal, window, softcap, alibi)
    tiles = dict(BLOCK_D=block_d, PAD_D=block_d != head_dim, SCORE_MOD=softcap > 0 or alibi is not None)
    qkv = dict(Q=q, K=k, V=v, **tensor_strides("q", q), **tensor_strides("k", k), **tensor_strides("v", v))

    out = torch.full_like(q, float("nan"))
    lse = torch.full((batch, heads, seqlen_q), float("nan"))
    ATTN_FWD.launch((triton.cdiv(seqlen_q, BLOCK_M), heads, batch), **LAUNCH, **tiles, BLOCK_M=BLOCK_M,
                    BLOCK_N=BLOCK_N, **qkv, Out=out, Lse=lse, **tensor_strides("o", out), **shape, **variant)

    delta = torch.full_like(lse, float("nan"))
    ATTN_BWD_PREPROCESS.launch((triton.cdiv(seqlen_q, BLOCK_M), heads, batch), **LAUNCH, BLOCK_M=BLOCK_M,
                               BLOCK_D=block_d, PAD_D=block_d != head_dim, HAS_DLSE=True, Out=out, DO=dout,
                               DLse=dlse, Delta=delta, **tensor_strides("o", out), **tensor_strides("do", dout),
                               seqlen_q=seqlen_q, num_heads=heads, head_dim=head_dim)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    grads = dict(**qkv, DO=dout, Lse=lse, Delta=delta, **tensor_strides("do", dout), **shape, **variant,
                 softmax_scale=scale, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, **tiles)
    ATTN_BWD_DKDV.launch((triton.cdiv(seqlen_k, BLOCK_N), kv_heads, batch), **LAUNCH, **grads, DK=dk, DV=dv,
                         **tensor_strides("dk", dk), **tensor_strides("dv", dv))
    ATTN_BWD_DQ.launch((triton.cdiv(seqlen_q, BLOCK_M), heads, batch), **LAUNCH, **grads, DQ=dq,
                       **tensor_strides("dq", dq))
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
]


def run_case(name, seqlen_q, seqlen_k, heads, kv_heads, head_dim, causal, window, softcap, alibi_kind):
    batch = 2
    q = torch.randn(batch, seqlen_q, heads, head_dim)
    k = torch.randn(batch, seqlen_k, kv_heads, head_dim)
    v = torch.randn(batch, seqlen_k, kv_heads, head_dim)
    dout = torch.randn_like(q)
    dlse = torch.randn(batch, heads, seqlen_q)
    alibi = None if alibi_kind is None else torch.rand((heads,) if alibi_kind == "heads" else (batch, heads)) * 0.3
    options = (causal, False, window[0], window[1], softcap, alibi)
    want_out, want_lse = torch.ops.fattn.forward(q.double(), k.double(), v.double(), None, *options)
    finite = torch.isfinite(want_lse)
    want = torch.ops.fattn.backward(dout.double(), q.double(), k.double(), v.double(), want_out, want_lse,
                                    dlse.double().masked_fill(~finite, 0), None, *options)
    got = launch(q, k, v, dout, dlse.masked_fill(~finite, 0), causal, window, softcap, alibi)
    row = {"case": name, "empty_rows": int((~finite).sum()),
           "lse_pattern": bool(torch.equal(torch.isfinite(got[1]), finite)),
           "lse_err": (got[1].double()[finite] - want_lse[finite]).abs().max().item() if finite.any() else 0.0}
    for label, g, w in zip(("out", "dq", "dk", "dv"), (got[0], *got[2:]), (want_out, *want)):
        row[f"{label}_err"] = (g.double() - w).abs().max().item()  # NaN if any element was left unwritten
    return row


if __name__ == "__main__":
    torch.manual_seed(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    for case in CASES:
        print(json.dumps(run_case(*case)), flush=True)
