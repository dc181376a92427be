"""Merging partial attention results: merge_attention_states, the fake of
fattn::merge_attention_states, and its autograd (registered on the op, so eager mode and
torch.compile training graphs both differentiate it)."""

from __future__ import annotations

import torch

from . import _head_dim
from ._checks import (
    check_head_dim, check_last_dim_contiguous, check_same_device, dtype_name, fail, lse_dtype, shape_of,
)
from ._eager import call_op
from ._library import load_library

load_library()
_merge_op = torch.ops.fattn.merge_attention_states.default


def merge_attention_states(outs, lses):
    """Combine attention results over disjoint key sets into the result over their union.

    Args:
        outs: partial outputs, a tensor [splits, batch, seqlen_q, heads, head_dim] or a
           sequence of [batch, seqlen_q, heads, head_dim] tensors (fp32, fp16 or bf16;
           float64 on CPU). head_dim 1..256; one that is not a multiple of 8 is padded with
           zero columns (a copy of outs) and out comes back as a view of its first head_dim
           columns.
        lses: their log-sum-exps, [splits, batch, heads, seqlen_q] or a sequence of
           [batch, heads, seqlen_q], float32 (as returned with return_lse=True; float64 with
           float64 partials).

    Returns:
        (out, lse): out in the partials' dtype, lse float32. The merge runs in fp32:
        out = sum_s exp(lse_s - lse) out_s with lse = logsumexp_s lse_s. Partials with
        lse = -inf (they saw no key) are ignored; a row no partial saw gives 0 and -inf.
        Serves split-K decoding, ring attention and cascade inference alike.

    Differentiable w.r.t. outs and lses (a sequence: each element, through torch.stack), in
    eager mode and under torch.compile; also twice in eager mode (the backward is made of
    differentiable torch operations). With w_s = exp(lse_s - lse): d out_s = w_s dout and
    d lse_s = w_s (dout . (out_s - out) + dlse), in fp32; partials that were ignored, and rows no
    partial saw, get exactly 0. Cost: the stacked outs are kept for the backward, which is a few
    elementwise passes over them with no host synchronization; in eager mode it allocates float32
    temporaries of outs' size, about two at a time (torch.compile fuses them into one pass).
    """
    if not isinstance(outs, torch.Tensor):
        outs = torch.stack(list(outs))
    if not isinstance(lses, torch.Tensor):
        lses = torch.stack(list(lses))
    # A head dim that is not a multiple of 8: zero columns change no weight and come out 0. Only a
    # 5-D stack of a float dtype is padded; the op reports other inputs on the caller's own shapes.
    padding = _head_dim.Padding(outs) if outs.dim() == 5 and outs.dtype in _PADDABLE_DTYPES else _head_dim.Padding()
    (outs,) = padding.inputs(outs)
    # Where a gradient can flow, through the op's registered autograd.
    out, lse = call_op(_merge_op, (outs, lses), (outs, lses))
    return padding.output(out), lse


_PADDABLE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


# ---------------------------------------------------------------- autograd

def _setup_context(ctx, inputs, output):
    outs, lses = inputs
    out, lse = output
    ctx.save_for_backward(outs, lses, out, lse)
    # An output nobody used gets None, not a zero tensor: its term is skipped.
    ctx.set_materialize_grads(False)


def _backward(ctx, dout, dlse):
    """d outs and d lses from the saved inputs and outputs, in differentiable torch operations so
    that create_graph=True gives correct second-order gradients. The -infs, and the NaNs an
    ignored partial may hold, are masked before any arithmetic rather than after: a NaN that a
    where discards still makes NaN of the second-order gradient through the discarded branch."""
    outs, lses, out, lse = ctx.saved_tensors
    need_outs, need_lses = ctx.needs_input_grad[:2]
    acc = lses.dtype  # float32, float64 for float64 partials
    # The weights w_s = exp(lse_s - lse), [splits, batch, heads, seqlen_q]. A row no partial saw
    # has lse = -inf: shifting by 0 there keeps -inf - -inf (NaN) out and gives w = 0.
    empty_row = lse == float("-inf")
    w = torch.exp(lses - torch.where(empty_row, 0.0, lse))
    # The op skips a partial whose weight underflows to 0 (always when lse_s = -inf): its out may
    # hold anything, NaN included, and its gradients are exactly 0. This w is at most the op's
    # (lse >= the row max the op shifts by), so every partial the op skipped has w = 0 here.
    used = w != 0
    w_rows = w.transpose(-1, -2).unsqueeze(-1)  # outs' layout, [splits, batch, seqlen_q, heads, 1]
    douts = dlses = None
    dout_acc = None if dout is None else dout.to(acc)
    if need_outs and dout is not None:
        douts = (w_rows * dout_acc).to(outs.dtype)
    if need_lses:
        terms = None
        if dout is not None:
            parts = torch.where(used.transpose(-1, -2).unsqueeze(-1), outs, 0).to(acc)
            terms = ((parts - out.to(acc)) * dout_acc).sum(-1).transpose(-1, -2)
        if dlse is not None:
            terms = dlse.to(acc) if terms is None else terms + dlse.to(acc)
        if terms is not None:
            dlses = torch.where(used, w * terms, 0.0).to(lses.dtype)
    return douts, dlses


torch.library.register_autograd("fattn::merge_attention_states", _backward, setup_context=_setup_context)


# ---------------------------------------------------------------- fake

_MERGE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _check_merge_inputs(op: str, outs, lses) -> None:
    """The op's checks of a stack of partial results, in the op's order."""
    if outs.dim() != 5:
        fail(op, "outs must be a 5-D tensor [splits, batch, seqlen_q, heads, head_dim], got shape ", shape_of(outs))
    splits, batch, seqlen_q, heads, _ = outs.shape
    if splits < 1:
        fail(op, "outs must hold at least one partial result (splits >= 1)")
    if lses.dim() != 4 or tuple(lses.shape) != (splits, batch, heads, seqlen_q):
        fail(op, "lses has shape ", shape_of(lses), " but must be [splits, batch, heads, seqlen_q] = [", splits, ", ",
             batch, ", ", heads, ", ", seqlen_q, "]")
    check_same_device(op, "lses", lses, "outs", outs)
    # float64 partials only on CPU (the reference implementation), or meta, which has no backend.
    float64_ok = outs.dtype == torch.float64 and outs.device.type in ("cpu", "meta")
    if outs.dtype not in _MERGE_DTYPES and not float64_ok:
        fail(op, "outs has dtype ", dtype_name(outs.dtype), "; expected float32, float16 or bfloat16")
    if lses.dtype != lse_dtype(outs.dtype):
        fail(op, "lses has dtype ", dtype_name(lses.dtype), "; expected ", dtype_name(lse_dtype(outs.dtype)))
    check_head_dim(op, outs.shape[4])
    check_last_dim_contiguous(op, "outs", outs)


@torch.library.register_fake("fattn::merge_attention_states")
def _merge_fake(outs, lses):
    _check_merge_inputs("fattn.merge_attention_states", outs, lses)
    _, batch, seqlen_q, heads, head_dim = outs.shape
    # Fresh contiguous outputs, as the op allocates them.
    return outs.new_empty((batch, seqlen_q, heads, head_dim)), outs.new_empty((batch, heads, seqlen_q),
                                                                              dtype=lse_dtype(outs.dtype))
