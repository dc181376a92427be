"""Merging partial attention results by their log-sum-exp.

Attention over a key set split into parts (split-K decoding, ring attention,
cascade inference) gives one (out_s, lse_s) per part. The result over the union
is out = sum_s w_s out_s / sum_s w_s with w_s = exp(lse_s - max_s lse_s), and
lse = max + log(sum_s w_s). Parts whose lse is -inf (they saw no key) get weight
0; a row that no part saw gives out = 0, lse = -inf. All math is fp32.
"""

import triton
import triton.language as tl

from .softmax import merge_finish, merge_rescale
from .spec import KernelSpec, f32_tensor, i32, strides, tensor


@triton.jit
def attn_merge(
    Outs, Lses, Out, Lse,
    stride_ps, stride_pb, stride_pq, stride_ph,
    stride_ob, stride_oq, stride_oh,
    num_splits, seqlen_q, num_heads, head_dim,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, PAD_D: tl.constexpr,
):
    """Grid (cdiv(seqlen_q, BLOCK_M), heads, batch).

    Outs: partial outputs [splits, batch, seqlen_q, heads, head_dim] (strided, last dim
    contiguous); Lses: fp32 [splits, batch, heads, seqlen_q] contiguous; Out like one
    partial; Lse fp32 [batch, heads, seqlen_q] contiguous.
    """
    pid_m = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    batch = tl.program_id(2).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < seqlen_q
    mask = row_ok[:, None]
    if PAD_D:
        mask = mask & (offs_d < head_dim)[None, :]
    rows = (batch * num_heads + head) * seqlen_q + offs_m
    split_stride = num_heads * seqlen_q * tl.num_programs(2).to(tl.int64)

    # One pass over the splits, rescaling as the running maximum grows (the online merge of
    # triton_src/softmax.py, shared with split-K decoding).
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    part = Outs + batch * stride_pb + head * stride_ph + offs_m[:, None].to(tl.int64) * stride_pq + offs_d[None, :]
    for s in range(0, num_splits):
        lse = tl.load(Lses + s * split_stride + rows, mask=row_ok, other=float("-inf"))
        o = tl.load(part + s * stride_ps, mask=mask, other=0.0).to(tl.float32)
        m, shift, rescale = merge_rescale(m, lse)
        weight = tl.exp(lse - shift)  # exactly 0 for a part that saw no key
        # where(), not a product: a -inf part may hold anything, even NaN, in its out.
        acc = acc * rescale[:, None] + tl.where(weight[:, None] > 0, weight[:, None] * o, 0.0)
        total = total * rescale + weight

    denominator, lse = merge_finish(total, m)
    out = acc / denominator[:, None]
    o_ptrs = (Out + batch * stride_ob + head * stride_oh + offs_m[:, None].to(tl.int64) * stride_oq
              + offs_d[None, :])
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=mask)
    tl.store(Lse + rows, lse, mask=row_ok)


ATTN_MERGE = KernelSpec(attn_merge, [
    tensor("Outs"), f32_tensor("Lses"), tensor("Out"), f32_tensor("Lse"),
    *strides("p", "sbqh"), *strides("o", "bqh"),
    i32("num_splits"), i32("seqlen_q"), i32("num_heads"), i32("head_dim", multiple_of=8),
])
