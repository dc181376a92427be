"""Autograd for fattn::forward, registered on the op so that eager mode and
torch.compile training graphs both use fattn::backward."""

import torch


def _setup_context(ctx, inputs, output):
    q, k, v, softmax_scale, causal, deterministic = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.softmax_scale, ctx.causal, ctx.deterministic = softmax_scale, causal, deterministic


def _backward(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    if dout is None:  # only lse was used downstream
        dout = torch.zeros_like(out)
    dq, dk, dv = torch.ops.fattn.backward(dout, q, k, v, out, lse, dlse, ctx.softmax_scale, ctx.causal,
                                          ctx.deterministic)
    return dq, dk, dv, None, None, None


torch.library.register_autograd("fattn::forward", _backward, setup_context=_setup_context)
