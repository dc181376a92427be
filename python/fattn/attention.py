"""Attention forward and backward: flash_attn_func, the fakes of fattn::forward and
fattn::backward, and the autograd that joins them (registered on the op, so eager mode
and torch.compile training graphs both differentiate through fattn::backward)."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch.autograd.function import once_differentiable

from ._checks import (
    check_alibi_offset, check_alibi_slopes, check_attention_dtype, check_bias, check_dropout, check_finite,
    check_head_dim, check_head_groups, check_last_dim_contiguous, check_rank, check_same_device, check_same_dtype,
    check_segment_ids, check_sinks, check_softcap, check_window, dtype_name, fail, lse_dtype, shape_of,
)
from . import _attn_probs, _bias, _dropout, _head_dim
from .fp8 import check_fp8_inputs, forward_output_dtype, refuse_gradients
from ._arguments import flag, real, window_pair
from ._eager import call_op, eager_autograd
from ._library import load_library

load_library()
# Bound once: attribute lookups on torch.ops cost more than the call's own Python work.
_forward_op = torch.ops.fattn.forward.default
_backward_op = torch.ops.fattn.backward.default


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    return_lse: bool = False,
    q_segment_ids: torch.Tensor | None = None,
    kv_segment_ids: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
):
    """Scaled dot-product attention, FlashAttention-2 style, with flash-attn 2.8's parameters
    in flash-attn's order (fattn's own extras are keyword-only, after them).

    Args:
        q: [batch, seqlen_q, heads, head_dim], float16 or bfloat16 on CUDA
           (float32/float64 also accepted on CPU, where a reference implementation runs).
           head_dim 1..256; one that is not a multiple of 8 is padded (a copy of q, k, v) and
           out comes back as a view of its first head_dim columns.
        k, v: [batch, seqlen_k, kv_heads, head_dim]; heads must be a multiple of
           kv_heads (GQA/MQA). Any batch/seq/head strides; the last dim contiguous.
        dropout_p: dropout probability on the attention probabilities, 0 <= p < 1, applied
           whenever it is > 0 (pass 0.0 for evaluation, as with flash-attn). Each call draws a
           seed from torch's generator on q's device (torch.manual_seed reproduces it; CUDA
           graphs replay with fresh seeds); the backward regenerates the same mask. p is rounded
           to a multiple of 2**-16 and the kept probabilities are scaled by the exact inverse of
           the resulting keep probability; the CPU implementation draws the identical mask.
        softmax_scale: multiplies q @ k^T before the softmax; default 1/sqrt(head_dim).
        causal: mask keys after the query's position, aligned to the bottom-right
           corner when seqlen_q != seqlen_k (query i sees key j iff
           j <= i + seqlen_k - seqlen_q). Rows that see no key give out 0 and lse -inf.
           Same as window_size=(left, 0).
        window_size: (left, right) sliding window, -1 unbounded on that side: query i sees
           key j iff i + d - left <= j <= i + d + right, d = seqlen_k - seqlen_q. Key tiles
           outside every window of a query tile are skipped (time grows with the window).
        softcap: if > 0, scores become softcap * tanh(scores / softcap) (Gemma 2, Grok).
        alibi_slopes: float32 [heads] or [batch, heads]: the score of key j for query i gets
           -slope * |i + seqlen_k - seqlen_q - j| (after the softcap). Not differentiated.
           flash-attn adds a row-constant-shifted bias under causal; out is the same, lse
           differs by slope * (seqlen_q - 1 - i).
        deterministic: True asks for a bitwise reproducible backward (separate dK/dV and
           dQ kernels). False (the default) allows dQ to be accumulated in float32 inside
           the dK/dV kernel where the build has it (Hopper, head dim 64 bucket, no bias or
           dropout), whose additions come in a varying order.
        return_attn_probs: return (out, lse, S_dmask) as flash-attn does. S_dmask is None without
           dropout; with dropout it is flash-attn's test tensor, float [batch, heads, seqlen_q and
           seqlen_k rounded up to 128] in q's dtype: exp(s - row max) for a kept key, negated for a
           dropped one, 0 where the query sees no key (fattn/_attn_probs.py). For tests: it is
           rebuilt with torch operations at O(batch x heads x seqlen_q x seqlen_k) memory and time,
           and reads the seed on the host.
        return_lse: (keyword) also return the log-sum-exp of the scaled scores,
           float32 [batch, heads, seqlen_q] (natural log, -inf for empty rows;
           float64 for float64 inputs on CPU).
           It is differentiable: a gradient flowing into lse reaches q and k.
        q_segment_ids, kv_segment_ids: (keyword) int32 [batch, seqlen_q] and [batch, seqlen_k],
           both or neither: query i sees key j only if their ids are equal (several documents
           packed in one row); combines with causal, windows, softcap and ALiBi. Every tile
           is masked when they are given.
        sinks: (keyword) float32 [heads]: one logit per query head that joins every row's
           softmax denominator and carries no value (gpt-oss's attention sinks):
           out_i = sum_j exp(s_ij - m) v_j / (exp(sink - m) + sum_j exp(s_ij - m)), and lse
           includes it (a row that sees no key gives out 0 and lse = sink). Differentiable:
           the gradient reaching sinks is -sum_i exp(sink - lse_i) * (dout_i . out_i - dlse_i).
        bias: (keyword) an additive bias of the scores, broadcastable to [batch, heads, seqlen_q,
           seqlen_k] (fewer dims are leading 1s), any float dtype (converted to q's, as SDPA's
           attn_mask must be), added after the softcap and ALiBi; or a boolean mask, True =
           attend. Rows whose every key is masked give out 0 and lse -inf. Differentiable: the
           gradient reaching it is summed over its broadcast dims (the backward first writes
           it unreduced, float32 [batch, heads, seqlen_q, seqlen_k]). Every key tile goes
           through the masked path, as with dropout and segment ids.
        q_descale, k_descale, v_descale: (keyword) with float8_e4m3fn or float8_e5m2 q, k and v
           (all three the same FP8 dtype; on sm_89 and sm_90 GPUs, and on CPU): float32
           [batch, kv_heads] (q_descale also [batch, heads]) that the inputs' values are
           multiplied by, FlashAttention-3's convention (fattn.quantize_fp8 makes them); None
           stands for 1. Both products run on FP8 tensor cores, the probabilities rounded to
           e4m3 (times 256) for the second; out is bfloat16. Causal, windows, softcap, ALiBi,
           sinks, GQA and head dims up to 256 compose; a bias, dropout and segment ids do not.
           Inference only: FP8 inputs that require grad are refused.

    Returns:
        out [batch, seqlen_q, heads, head_dim] in q's dtype (bfloat16 for FP8 inputs);
        (out, lse) with return_lse; (out, lse, None) with return_attn_probs.
    """
    fn = "flash_attn_func"
    refuse_gradients(fn, q, k, v, sinks)
    dropout_p = _dropout.check_probability(fn, dropout_p)
    softmax_scale, softcap = real(fn, "softmax_scale", softmax_scale, allow_none=True), real(fn, "softcap", softcap)
    causal, deterministic = flag(fn, "causal", causal), flag(fn, "deterministic", deterministic)
    window_left, window_right = window_pair(fn, window_size)
    bias = _bias.prepare(fn, bias, q, k)
    padding = _head_dim.Padding(q, k, v)  # a head dim that is not a multiple of 8
    softmax_scale = padding.scale(softmax_scale)
    q, k, v = padding.inputs(q, k, v)
    dropout_seed = _dropout.draw_seed(dropout_p, q.device)
    out, lse = _attention(q, k, v, softmax_scale, causal, deterministic, window_left, window_right, softcap,
                          alibi_slopes, q_segment_ids, kv_segment_ids, sinks, bias, dropout_p, dropout_seed, 0,
                          q_descale, k_descale, v_descale)
    out = padding.output(out)
    if return_attn_probs:
        s_dmask = None if dropout_p == 0 else _attn_probs.dense(
            q, k, dropout_p, dropout_seed, softmax_scale, causal, (window_left, window_right), softcap, alibi_slopes,
            q_segment_ids, kv_segment_ids, bias)
        return out, lse, s_dmask
    return (out, lse) if return_lse else out


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, *,
                              return_lse=False):
    """flash_attn_func over qkv [batch, seqlen, 3, heads, head_dim] (views, no copy; gradients
    reach qkv)."""
    q, k, v = qkv.unbind(2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs, return_lse=return_lse)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, *,
                             return_lse=False):
    """flash_attn_func over q and kv [batch, seqlen_k, 2, kv_heads, head_dim] (views, no copy)."""
    k, v = kv.unbind(2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs, return_lse=return_lse)


def _attention(*args):
    """(out, lse) through the cheapest path that keeps gradients right. args: the op's
    (q, k, v, softmax_scale, causal, deterministic, window_left, window_right, softcap,
    alibi_slopes, q_segment_ids, kv_segment_ids, sinks, bias, dropout_p, dropout_seed, alibi_offset,
    q_descale, k_descale, v_descale)."""
    q, k, v = args[:3]
    sinks, bias = args[12], args[13]
    return call_op(_forward_op, args, (q, k, v, sinks, bias), _EagerAttention)


# ---------------------------------------------------------------- autograd

# fattn::forward's defaults after q, k, v: softmax_scale, causal, deterministic, window_left,
# window_right, softcap, alibi_slopes, q_segment_ids, kv_segment_ids, sinks, bias, dropout_p,
# dropout_seed, alibi_offset, q_descale, k_descale, v_descale (csrc/register.cpp);
# tests/test_op_samples.py checks them.
_OPTION_DEFAULTS = [None, False, False, -1, -1, 0.0, None, None, None, None, None, 0.0, None, 0, None, None, None]


def sinks_gradient(sinks, dout, out, lse, dlse, rows=None):
    """d loss / d sinks (float32 [heads]) from the forward's outputs: with p_i = exp(sink - lse_i)
    the sink's share of row i, d out_i / d sink = -p_i out_i and d lse_i / d sink = p_i, so the
    gradient is -sum_i p_i (dout_i . out_i - dlse_i) over the rows of every sequence. Dense
    [batch, seqlen, heads, dim] outputs with lse [batch, heads, seqlen], or packed [total,
    heads, dim] with lse [heads, total] and `rows`, a bool [total] of the rows inside a sequence."""
    delta = (dout.to(lse.dtype) * out.to(lse.dtype)).sum(-1)  # [batch, seqlen, heads] or [total, heads]
    delta = delta.transpose(-1, -2)  # lse's layout
    if dlse is not None:
        delta = delta - dlse
    share = torch.exp(sinks.to(lse.dtype)[:, None] - lse)  # [heads, seqlen] broadcasts over batch
    terms = share * delta
    if rows is not None:
        terms = torch.where(rows, terms, 0.0)
    return (-terms.reshape(-1, *terms.shape[-2:]).sum((0, 2))).to(sinks.dtype)


def _setup_context(ctx, inputs, output):
    q, k, v, *options = inputs
    options += _OPTION_DEFAULTS[len(options):]  # what the call left to the schema's defaults
    (softmax_scale, causal, deterministic, window_left, window_right, softcap, alibi_slopes, q_seg, kv_seg, sinks,
     bias, dropout_p, dropout_seed, alibi_offset, *_descales) = options
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, alibi_slopes, q_seg, kv_seg, sinks, bias, dropout_seed)
    # Not needs_input_grad: a call that left sinks or bias to their defaults has fewer inputs.
    ctx.sinks_need_grad = sinks is not None and sinks.requires_grad
    ctx.bias_need_grad = bias is not None and bias.requires_grad
    ctx.options = (softmax_scale, causal, deterministic, window_left, window_right, softcap)
    ctx.dropout_p = dropout_p
    ctx.alibi_offset = alibi_offset
    # An output nobody used gets None, not a zero tensor: no allocation, no fill, and the
    # backward skips the dlse term.
    ctx.set_materialize_grads(False)


@once_differentiable  # no double backward yet: differentiating twice raises instead of giving 0
def _backward(ctx, dout, dlse):
    q, k, v, out, lse, alibi_slopes, q_seg, kv_seg, sinks, bias, dropout_seed = ctx.saved_tensors
    if dout is None:  # only lse was used downstream
        dout = torch.zeros_like(out)
    # The backward needs no sinks: P = exp(s - lse) with the sink already inside lse.
    dq, dk, dv, dbias = _backward_op(dout, q, k, v, out, lse, dlse, *ctx.options, alibi_slopes, q_seg, kv_seg, bias,
                                     ctx.bias_need_grad, ctx.dropout_p, dropout_seed, ctx.alibi_offset)
    dsinks = sinks_gradient(sinks, dout, out, lse, dlse) if ctx.sinks_need_grad else None
    dbias = _bias.reduce_gradient(dbias, bias) if ctx.bias_need_grad else None
    # One gradient per input; a call that left the trailing options to their defaults has fewer
    # inputs, and autograd drops the trailing Nones.
    return (dq, dk, dv) + (None,) * 9 + (dsinks, dbias, None, None, None, None, None, None)


torch.library.register_autograd("fattn::forward", _backward, setup_context=_setup_context)


_EagerAttention = eager_autograd("flash_attn_func", _forward_op, _setup_context, _backward)


# ---------------------------------------------------------------- fakes

class AttentionShape(NamedTuple):
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads: int
    kv_heads: int
    head_dim: int


def check_qkv(op: str, q, k, v, rank: int, layout: str, fp8_allowed: bool = False) -> None:
    """q, k, v as [batch, seqlen, heads, head_dim] (rank 4) or packed [total, heads, head_dim]
    (rank 3): the op's checks but the lengths, in the op's order. fp8_allowed: the forwards."""
    names, tensors = ("q", "k", "v"), (q, k, v)
    for name, t in zip(names, tensors):
        check_rank(op, name, t, rank, layout)
    for name, t in zip(names[1:], tensors[1:]):
        check_same_device(op, name, t, "q", q, "; q, k and v must be on one device")
    check_attention_dtype(op, "q", q, fp8_allowed)
    for name, t in zip(names[1:], tensors[1:]):
        check_same_dtype(op, name, t, "q", q, "; q, k and v must share one dtype")
    seq = rank - 3
    if rank == 4:
        for name, t in zip(names[1:], tensors[1:]):
            if t.shape[0] != q.shape[0]:
                fail(op, name, " has batch size ", t.shape[0], " but q has ", q.shape[0])
    if v.shape[seq] != k.shape[seq] or v.shape[seq + 1] != k.shape[seq + 1]:
        fail(op, "v has shape ", shape_of(v), " but k has ", shape_of(k), "; k and v must agree on seqlen and heads")
    head_dim = q.shape[-1]
    for name, t in zip(names[1:], tensors[1:]):
        if t.shape[-1] != head_dim:
            fail(op, name, " has head_dim ", t.shape[-1], " but q has ", head_dim,
                 "; q, k and v must share one head_dim")
    check_head_dim(op, head_dim)
    check_head_groups(op, q.shape[-2], k.shape[-2], "k and v")
    for name, t in zip(names, tensors):
        check_last_dim_contiguous(op, name, t, "; call .contiguous() first")


def check_attention_inputs(op: str, q, k, v, softmax_scale, fp8_allowed: bool = False) -> AttentionShape:
    """The op's checks of q, k, v and softmax_scale, in the op's order."""
    check_qkv(op, q, k, v, 4, "[batch, seqlen, heads, head_dim]", fp8_allowed)
    check_finite(op, "softmax_scale", softmax_scale)
    return AttentionShape(q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3])


def check_backward_inputs(op: str, s: AttentionShape, q, dout, out, lse, dlse) -> None:
    for name, t in (("dout", dout), ("out", out)):
        if tuple(t.shape) != tuple(q.shape):
            fail(op, name, " has shape ", shape_of(t), " but must match q's shape ", shape_of(q))
        check_same_device(op, name, t, "q", q)
        check_same_dtype(op, name, t, "q", q)
    for name, t in (("lse", lse), ("dlse", dlse)):
        if t is None:
            continue
        if q.dim() == 3:  # packed: [heads, total_q]
            if tuple(t.shape) != (s.heads, q.shape[0]):
                fail(op, name, " has shape ", shape_of(t), " but must be [heads, total_q] = [", s.heads, ", ",
                     q.shape[0], "]")
        elif t.dim() != 3 or tuple(t.shape) != (s.batch, s.heads, s.seqlen_q):
            fail(op, name, " has shape ", shape_of(t), " but must be [batch, heads, seqlen_q] = [",
                 s.batch, ", ", s.heads, ", ", s.seqlen_q, "]")
        if t.dtype != lse_dtype(q.dtype):
            fail(op, name, " has dtype ", dtype_name(t.dtype), "; expected ", dtype_name(lse_dtype(q.dtype)))
        check_same_device(op, name, t, "q", q)


def check_attention_variant(op: str, s: AttentionShape, q, window_left, window_right, softcap, alibi_slopes,
                            q_segment_ids=None, kv_segment_ids=None):
    """The op's checks of the variant arguments, in the op's order (after the inputs'; sinks
    come after them, check_sinks)."""
    check_window(op, window_left, window_right)
    check_softcap(op, softcap)
    check_alibi_slopes(op, alibi_slopes, q, s.batch, s.heads)
    check_segment_ids(op, q_segment_ids, kv_segment_ids, q, s.batch, s.seqlen_q, s.seqlen_k)


@torch.library.register_fake("fattn::forward")
def _forward_fake(q, k, v, softmax_scale=None, causal=False, deterministic=False, window_left=-1, window_right=-1,
                  softcap=0.0, alibi_slopes=None, q_segment_ids=None, kv_segment_ids=None, sinks=None, bias=None,
                  dropout_p=0.0, dropout_seed=None, alibi_offset=0, q_descale=None, k_descale=None, v_descale=None):
    op = "fattn.forward"
    s = check_attention_inputs(op, q, k, v, softmax_scale, fp8_allowed=True)
    check_attention_variant(op, s, q, window_left, window_right, softcap, alibi_slopes, q_segment_ids, kv_segment_ids)
    check_alibi_offset(op, alibi_offset, alibi_slopes, s.seqlen_q, s.seqlen_k)
    check_sinks(op, sinks, q, s.heads)
    check_bias(op, bias, q, s.batch, s.heads, s.seqlen_q, s.seqlen_k)
    check_dropout(op, dropout_p, dropout_seed, q)
    check_fp8_inputs(op, s.batch, s.heads, s.kv_heads, q, bias, dropout_p, q_segment_ids, q_descale, k_descale,
                     v_descale)
    # Both outputs are fresh and contiguous, as the op allocates them.
    out = q.new_empty((s.batch, s.seqlen_q, s.heads, s.head_dim), dtype=forward_output_dtype(q.dtype))
    lse = q.new_empty((s.batch, s.heads, s.seqlen_q), dtype=lse_dtype(q.dtype))
    return out, lse


@torch.library.register_fake("fattn::backward")
def _backward_fake(dout, q, k, v, out, lse, dlse, softmax_scale, causal, deterministic, window_left=-1,
                   window_right=-1, softcap=0.0, alibi_slopes=None, q_segment_ids=None, kv_segment_ids=None,
                   bias=None, bias_grad=False, dropout_p=0.0, dropout_seed=None, alibi_offset=0):
    op = "fattn.backward"
    s = check_attention_inputs(op, q, k, v, softmax_scale)
    check_backward_inputs(op, s, q, dout, out, lse, dlse)
    check_attention_variant(op, s, q, window_left, window_right, softcap, alibi_slopes, q_segment_ids, kv_segment_ids)
    check_alibi_offset(op, alibi_offset, alibi_slopes, s.seqlen_q, s.seqlen_k)
    check_bias(op, bias, q, s.batch, s.heads, s.seqlen_q, s.seqlen_k)
    check_dropout(op, dropout_p, dropout_seed, q)
    if bias_grad and bias is None:
        fail(op, "bias_grad=True needs a bias")
    # Fresh contiguous gradients shaped like q, k and v; dbias unreduced, or empty.
    dbias_shape = (s.batch, s.heads, s.seqlen_q, s.seqlen_k) if bias_grad else (0,)
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            q.new_empty(dbias_shape, dtype=lse_dtype(q.dtype)))
