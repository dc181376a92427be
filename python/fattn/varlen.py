"""Packed variable-length attention (flash-attn's varlen functions): the public functions,
the fakes of fattn::varlen_forward and fattn::varlen_backward, and their autograd.

Sequence b of a batch occupies rows [cu_seqlens[b], cu_seqlens[b + 1]) of q ([total_q,
heads, head_dim]) and of k, v ([total_k, kv_heads, head_dim]); max_seqlen_q/k size the
kernels' grid. Nothing reads the offsets on the host (no device sync): under
torch.compile(dynamic=True), new totals and new max_seqlen values reuse one graph.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from . import _attn_probs, _dropout, _head_dim
from ._checks import (
    check_dropout, check_finite, check_index_tensor, check_sinks, fail, lse_dtype, shape_of,
)
from ._arguments import flag, integer, real, window_pair
from ._eager import call_op, eager_autograd
from ._library import load_library
from .fp8 import FP8_DTYPES, check_fp8_inputs, forward_output_dtype, refuse_gradients
from .paged_varlen import paged_varlen_forward
from .attention import (
    AttentionShape, check_attention_variant, check_backward_inputs, check_qkv, sinks_gradient,
)

load_library()
_forward_op = torch.ops.fattn.varlen_forward.default
_backward_op = torch.ops.fattn.varlen_backward.default


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, *, seqused_k=None,
                           return_lse=False, sinks=None, q_descale=None, k_descale=None, v_descale=None):
    """flash_attn_func over packed sequences, with flash-attn 2.8's parameters in its order.

    Args:
        q: [total_q, heads, head_dim]; k, v: [total_k, kv_heads, head_dim].
        cu_seqlens_q, cu_seqlens_k: int32 [batch + 1], contiguous, on q's device: sequence b
           is rows [cu[b], cu[b + 1]). Their values are checked on CPU tensors; on CUDA they
           are not read on the host (that would stall the stream): keep them non-decreasing,
           within the tensors and each sequence at most max_seqlen long.
        max_seqlen_q, max_seqlen_k: the longest sequence (sizes the grid): an int, a numpy int or a
           one-element integer tensor (read on the host).
        dropout_p ... return_attn_probs: as flash_attn_func (S_dmask with dropout is [batch, heads,
           max_seqlen_q and max_seqlen_k rounded up to 128], sequence b's query t at row t and key
           j at column j of S_dmask[b]; the offsets are read on the host); causal and windows are aligned
           to the bottom-right corner of each sequence's own (seqlen_q, seqlen_k). Dropout's
           mask counts rows and keys from each sequence's start, batch = sequence index.
        block_table: int32 [batch, pages_per_seq]: k and v are a paged cache [num_pages, page_size,
           kv_heads, head_dim] (page_size a multiple of 16), key j of sequence b in page
           block_table[b, j // page_size], and sequence b has cu_seqlens_k[b + 1] - cu_seqlens_k[b]
           keys (seqused_k[b] if given). Forward only (chunked prefill): no dropout, and a
           backward that reaches its outputs raises; fattn/paged_varlen.py.
        seqused_k: (keyword) int32 [batch]: sequence b attends to its first seqused_k[b] keys.
        return_lse: (keyword) also return lse, float32 [heads, total_q].
        sinks: (keyword) float32 [heads], as in flash_attn_func.
        q_descale, k_descale, v_descale: (keyword) with float8 q, k and v, as in flash_attn_func:
           float32 [batch, kv_heads] (q_descale also [batch, heads]), batch = sequences; out is
           bfloat16. Not with block_table.

    Rows outside every sequence (past cu[batch]) get out 0 and lse 0, and gradient 0.
    """
    fn = "flash_attn_varlen_func"
    refuse_gradients(fn, q, k, v, sinks)
    max_seqlen_q, max_seqlen_k = (integer(fn, name, value, minimum=0) for name, value in
                                  (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)))
    dropout_p = _dropout.check_probability(fn, dropout_p)
    softmax_scale, softcap = real(fn, "softmax_scale", softmax_scale, allow_none=True), real(fn, "softcap", softcap)
    causal, deterministic = flag(fn, "causal", causal), flag(fn, "deterministic", deterministic)
    left, right = window_pair(fn, window_size)
    if block_table is not None:
        if q.dtype in FP8_DTYPES or any(t is not None for t in (q_descale, k_descale, v_descale)):
            fail(f"fattn.{fn}", "float8 q, k, v and their descales are not taken with block_table "
                 "(paged keys); flash_attn_with_kvcache reads an FP8 cache")
        if dropout_p > 0:
            fail(f"fattn.{fn}", "dropout_p is ", dropout_p, "; with block_table (paged keys) attention is for "
                 "inference, without dropout")
        out, lse = paged_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, block_table, seqused_k,
                                        softmax_scale, causal, left, right, softcap, alibi_slopes, sinks)
        if return_attn_probs:
            return out, lse, None
        return (out, lse) if return_lse else out
    padding = _head_dim.Padding(q, k, v)  # a head dim that is not a multiple of 8
    softmax_scale = padding.scale(softmax_scale)
    q, k, v = padding.inputs(q, k, v)
    dropout_seed = _dropout.draw_seed(dropout_p, q.device)
    out, lse = _varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k,
                                 softmax_scale, causal, deterministic, left, right, softcap, alibi_slopes, sinks,
                                 dropout_p, dropout_seed, q_descale, k_descale, v_descale)
    out = padding.output(out)
    if return_attn_probs:
        s_dmask = None if dropout_p == 0 else _attn_probs.packed(
            q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k, dropout_p, dropout_seed,
            softmax_scale, causal, (left, right), softcap, alibi_slopes)
        return out, lse, s_dmask
    return (out, lse) if return_lse else out


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False, *, return_lse=False):
    """flash_attn_varlen_func over qkv [total, 3, heads, head_dim] (views, no copy)."""
    q, k, v = qkv.unbind(1)
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale,
                                  causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
                                  return_lse=return_lse)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False, *,
                                    return_lse=False):
    """flash_attn_varlen_func over q and kv [total_k, 2, kv_heads, head_dim] (views, no copy)."""
    k, v = kv.unbind(1)
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs, return_lse=return_lse)


def _varlen_attention(*args):
    """(out, lse) through the cheapest path that keeps gradients right; args are the op's."""
    q, k, v = args[:3]
    sinks = args[15]
    return call_op(_forward_op, args, (q, k, v, sinks), _EagerVarlen)


# ---------------------------------------------------------------- autograd

# fattn::varlen_forward's defaults after cu_seqlens_q/k and max_seqlen_q/k (csrc/register.cpp).
_OPTION_DEFAULTS = [None, None, False, False, -1, -1, 0.0, None, None, 0.0, None, None, None, None]


def _setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, *options = inputs
    options += _OPTION_DEFAULTS[len(options):]
    (seqused_k, softmax_scale, causal, deterministic, window_left, window_right, softcap, alibi, sinks, dropout_p,
     dropout_seed, *_descales) = options
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, seqused_k, alibi, sinks, dropout_seed)
    ctx.sinks_need_grad = sinks is not None and sinks.requires_grad  # see attention.py
    ctx.options = (max_q, max_k, softmax_scale, causal, deterministic, window_left, window_right, softcap)
    ctx.dropout_p = dropout_p
    ctx.set_materialize_grads(False)


@once_differentiable
def _backward(ctx, dout, dlse):
    q, k, v, out, lse, cu_q, cu_k, seqused_k, alibi, sinks, dropout_seed = ctx.saved_tensors
    max_q, max_k, softmax_scale, causal, deterministic, window_left, window_right, softcap = ctx.options
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv = _backward_op(dout, q, k, v, out, lse, dlse, cu_q, cu_k, max_q, max_k, seqused_k, softmax_scale,
                              causal, deterministic, window_left, window_right, softcap, alibi, ctx.dropout_p,
                              dropout_seed)
    dsinks = None
    if ctx.sinks_need_grad:
        index = torch.arange(q.shape[0], device=q.device)  # rows inside a sequence, read on the device
        rows = (index >= cu_q[0]) & (index < cu_q[-1])
        dsinks = sinks_gradient(sinks, dout, out, lse, dlse, rows)
    return (dq, dk, dv) + (None,) * 12 + (dsinks, None, None, None, None, None)


torch.library.register_autograd("fattn::varlen_forward", _backward, setup_context=_setup_context)


_EagerVarlen = eager_autograd("flash_attn_varlen_func", _forward_op, _setup_context, _backward)


# ---------------------------------------------------------------- fakes

def _check_offsets(op, name, t, length, q):
    check_index_tensor(op, name, t, 1, q)
    if t.shape[0] != length:
        fail(op, name, " has shape ", shape_of(t), "; expected [", length, "]")
    if length > 1 and t.stride(0) != 1:
        fail(op, name, " must be contiguous; call .contiguous() first")


def check_varlen_inputs(op, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k,
                        softmax_scale, fp8_allowed=False) -> AttentionShape:
    """The op's checks of the packed inputs, in the op's order (csrc/attention/attention_shape.cpp)."""
    check_qkv(op, q, k, v, 3, "[total_tokens, heads, head_dim]", fp8_allowed)
    if cu_seqlens_q.dim() != 1 or cu_seqlens_q.shape[0] < 1:
        fail(op, "cu_seqlens_q has shape ", shape_of(cu_seqlens_q), "; expected [batch + 1] offsets, batch >= 0")
    batch = cu_seqlens_q.shape[0] - 1
    _check_offsets(op, "cu_seqlens_q", cu_seqlens_q, batch + 1, q)
    _check_offsets(op, "cu_seqlens_k", cu_seqlens_k, batch + 1, q)
    if seqused_k is not None:
        _check_offsets(op, "seqused_k", seqused_k, batch, q)
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(value, int) and value < 0:
            fail(op, name, " is ", value, "; expected >= 0")
    check_finite(op, "softmax_scale", softmax_scale)
    return AttentionShape(batch, max_seqlen_q, max_seqlen_k, q.shape[1], k.shape[1], q.shape[2])


@torch.library.register_fake("fattn::varlen_forward")
def _varlen_forward_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k=None,
                         softmax_scale=None, causal=False, deterministic=False, window_left=-1, window_right=-1,
                         softcap=0.0, alibi_slopes=None, sinks=None, dropout_p=0.0, dropout_seed=None, q_descale=None,
                         k_descale=None, v_descale=None):
    op = "fattn.varlen_forward"
    s = check_varlen_inputs(op, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k,
                            softmax_scale, fp8_allowed=True)
    check_attention_variant(op, s, q, window_left, window_right, softcap, alibi_slopes)
    check_sinks(op, sinks, q, s.heads)
    check_dropout(op, dropout_p, dropout_seed, q)
    check_fp8_inputs(op, s.batch, s.heads, s.kv_heads, q, None, dropout_p, None, q_descale, k_descale, v_descale)
    return (q.new_empty(q.shape, dtype=forward_output_dtype(q.dtype)),
            q.new_empty((s.heads, q.shape[0]), dtype=lse_dtype(q.dtype)))


@torch.library.register_fake("fattn::varlen_backward")
def _varlen_backward_fake(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                          seqused_k, softmax_scale, causal, deterministic, window_left=-1, window_right=-1,
                          softcap=0.0, alibi_slopes=None, dropout_p=0.0, dropout_seed=None):
    op = "fattn.varlen_backward"
    s = check_varlen_inputs(op, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k,
                            softmax_scale)
    check_backward_inputs(op, s, q, dout, out, lse, dlse)
    check_attention_variant(op, s, q, window_left, window_right, softcap, alibi_slopes)
    check_dropout(op, dropout_p, dropout_seed, q)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
