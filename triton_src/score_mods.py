"""The score modifiers, in the log2 domain: the softcap, ALiBi and an additive bias read through
pointers. Which of them a kernel compiles is its SCORE_MOD variant (triton_src/variants.py).
"""

import triton
import triton.language as tl

from .constants import INTERPRETED, LOG2E


@triton.jit
def softcap_tanh(x):
    """tanh(x), for the softcap.

    On the GPU one tanh.approx.f32 (sm_75+; relative error about 2**-11, below bf16's and
    at fp16's rounding of a score): the softmax already spends one MUFU op per score on
    exp2, and 1 - 2 / (exp(2x) + 1) would add two more (ex2, rcp), which made the softcap
    MUFU-bound. Triton's interpreter cannot run PTX, so there the formula stands in for it.
    """
    if INTERPRETED:
        return 1.0 - 2.0 / (tl.math.exp2(x * (2 * LOG2E)) + 1.0)
    else:
        return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)


@triton.jit
def alibi_slope_log2(Alibi, batch, head, stride_alibib, stride_alibih, use_alibi):
    """The head's ALiBi slope in the log2 domain; 0 when use_alibi is 0 (nothing is read)."""
    ptr = Alibi + batch.to(tl.int64) * stride_alibib + head.to(tl.int64) * stride_alibih
    return tl.load(ptr, mask=use_alibi != 0, other=0.0) * LOG2E


@triton.jit
def modified_scores(qk, q_idx, k_idx, diagonal, softcap_log2, alibi_log2, alibi_offset):
    """(scores, dscores/dqk) after the softcap and the ALiBi bias, in the log2 domain.

    With softcap_log2 = softcap * log2(e) > 0, `qk` is q.k * scale / softcap and the score is
    softcap * tanh(qk); otherwise `qk` is already the score. ALiBi subtracts
    slope * |q_idx + diagonal + alibi_offset - k_idx| (alibi_log2 = slope * log2(e); 0 adds
    nothing; alibi_offset moves ALiBi's distances apart from the masks' diagonal). The
    second value is the softcap's derivative factor (1 - tanh^2), which the backward applies
    to dS; 1 without a softcap.
    """
    if softcap_log2 > 0:
        t = softcap_tanh(qk)
        scores = softcap_log2 * t
        dscores = 1.0 - t * t
    else:
        scores = qk
        dscores = qk * 0.0 + 1.0
    # Unconditional: a runtime branch around it (skipping it for a softcap alone) measured 5 %
    # faster with the softcap alone but 12 % slower with ALiBi, forward and backward.
    return alibi_scores(scores, q_idx, k_idx, diagonal, alibi_log2, alibi_offset), dscores


@triton.jit
def alibi_scores(scores, q_idx, k_idx, diagonal, alibi_log2, alibi_offset):
    """The log2-domain scores minus ALiBi's slope * |q_idx + diagonal + alibi_offset - k_idx|
    (modified_scores' second step; alone, for kernels built for ALiBi without a softcap)."""
    # The offset goes on the key side: on the query side it kept a second copy of the query
    # positions live through the loops (more spills in 9-11 of 20 sm_90 variants; docs/notes/ring.md R6).
    # Positions become floats before they meet: one conversion per row and per key of the tile
    # instead of one per score (integer-to-float conversions run at a quarter of the FMA rate),
    # and the distance is one FADD whose absolute value is free. Exact below 2**24 positions.
    q_pos = (q_idx + diagonal).to(tl.float32)
    k_pos = (k_idx - alibi_offset).to(tl.float32)
    return scores - alibi_log2 * tl.abs(q_pos - k_pos)


@triton.jit
def bias_log2(bias_base, stride_biasq, rows, cols, seqlen_q, seqlen_k):
    """The additive bias of the scores at (rows, cols), broadcastable index tensors, in the log2
    domain; 0 outside the sequence. bias_base points at the (batch, head)'s [seqlen_q, seqlen_k]
    matrix, keys contiguous, stride_biasq 0 for a bias broadcast over the queries. -inf hides a
    key (a boolean mask's False)."""
    ptrs = bias_base + rows.to(tl.int64) * stride_biasq + cols
    bias = tl.load(ptrs, mask=(rows < seqlen_q) & (cols < seqlen_k), other=0.0)
    return bias.to(tl.float32) * LOG2E
