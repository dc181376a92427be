"""How the public functions call a differentiable op eagerly at the least host cost that keeps
gradients right: under torch.compile the op itself (the traced graph differentiates through its
registered autograd), a plain autograd.Function when a gradient can flow, and otherwise the op
below autograd."""

from __future__ import annotations

import torch

# Bound once: attribute lookups on torch cost more than the call's own Python work.
_below_autograd = torch._C._AutoDispatchBelowAutograd
_grad_enabled = torch.is_grad_enabled
_is_compiling = torch.compiler.is_compiling


def call_op(forward_op, args, grad_inputs, eager=None):
    """forward_op(*args) through the cheapest path: `eager` (an eager_autograd Function; the op
    itself where None) when grad mode is on and one of `grad_inputs` (tensors or None) requires a
    gradient. Otherwise no gradient can flow, so the Python autograd kernel of register_autograd,
    which would only find that out itself and redispatch below autograd, is skipped."""
    if _is_compiling():
        return forward_op(*args)
    if _grad_enabled():
        for t in grad_inputs:
            if t is not None and t.requires_grad:
                return forward_op(*args) if eager is None else eager.apply(*args)
    with _below_autograd():
        return forward_op(*args)


def eager_autograd(fn: str, forward_op, setup_context, backward):
    """A plain autograd.Function over `forward_op` and its registered setup_context/backward, for
    eager calls: torch's generic wrapper around a registered autograd costs about 150 us of Python
    per training step at tiny shapes (H100, benchmarks/profile_call.py host), this a fraction of that.
    `fn` names the public function in the second-order error."""

    class EagerAutograd(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            with _below_autograd():
                output = forward_op(*args)
            setup_context(ctx, args, output)
            return output

        @staticmethod
        def backward(ctx, dout, dlse):
            if torch.is_grad_enabled():  # create_graph=True: the caller wants to differentiate again
                raise RuntimeError(f"fattn.{fn}: second-order gradients are not supported (the backward is not "
                                   "differentiable, so they would come out as 0); call backward/grad without "
                                   "create_graph=True")
            return backward(ctx, dout, dlse)

    return EagerAutograd
