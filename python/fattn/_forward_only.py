"""Forward-only calls under autograd.

flash_attn_with_kvcache and flash_attn_varlen_func with block_table have no backward. As in
flash-attn, they still run when their inputs require grad (an inference step inside a training
loop, say); a backward that reaches their outputs raises instead of leaving every input's .grad
at None. fattn::decode mutates its caches, so torch cannot attach an autograd formula to the op
itself: the public functions attach this one.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable


class _NoBackward(torch.autograd.Function):
    """Outputs that require grad, and a backward that raises `reason`. The outputs are computed
    inside forward and are not views, so that the caller can modify them in place (autograd
    forbids that on a view returned by a Function of several outputs)."""

    @staticmethod
    def forward(ctx, reason, compute, *inputs):
        ctx.reason = reason
        # An output that is a view of a scratch tensor would count as a view too: copy it.
        return tuple(t if t._base is None else t.clone() for t in compute())

    @staticmethod
    @once_differentiable
    def backward(ctx, *grads):
        raise RuntimeError(ctx.reason)


def call(reason: str, compute, inputs):
    """compute()'s outputs; joined to the inputs that require grad through a backward that raises
    `reason`, when a gradient could reach them."""
    needing = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    if not needing or not torch.is_grad_enabled():
        return compute()
    if torch.compiler.is_compiling():
        # A compiled graph traces the backward ahead of time, so the refusal comes now.
        raise RuntimeError(reason + "; under torch.compile, call it with inputs that do not require grad "
                           "(or under torch.no_grad())")
    return _NoBackward.apply(reason, compute, *needing)
