"""Merging partial attention results: merge_attention_states and the fake of
fattn::merge_attention_states."""

from __future__ import annotations

import torch

from ._checks import check_head_dim, check_last_dim_contiguous, check_same_device, dtype_name, fail, lse_dtype, shape_of
from ._library import load_library

load_library()
_merge_op = torch.ops.fattn.merge_attention_states.default


def merge_attention_states(outs, lses):
    """Combine attention results over disjoint key sets into the result over their union.

    Args:
        outs: partial outputs, a tensor [splits, batch, seqlen_q, heads, head_dim] or a
           sequence of [batch, seqlen_q, heads, head_dim] tensors (fp32, fp16 or bf16).
        lses: their log-sum-exps, [splits, batch, heads, seqlen_q] or a sequence of
           [batch, heads, seqlen_q], float32 (as returned with return_lse=True).

    Returns:
        (out, lse): out in the partials' dtype, lse float32. The merge runs in fp32:
        out = sum_s exp(lse_s - lse) out_s with lse = logsumexp_s lse_s. Partials with
        lse = -inf (they saw no key) are ignored; a row no partial saw gives 0 and -inf.
        Serves split-K decoding, ring attention and cascade inference alike.
    """
    if not isinstance(outs, torch.Tensor):
        outs = torch.stack(list(outs))
    if not isinstance(lses, torch.Tensor):
        lses = torch.stack(list(lses))
    return _merge_op(outs, lses)


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
