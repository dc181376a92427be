"""Fake (meta) implementations: shapes, dtypes and strides of each op's outputs, for
torch.compile and FakeTensor tracing. They must match what the real kernels return."""

import torch


@torch.library.register_fake("fattn::forward")
def _forward_fake(q, k, v, softmax_scale=None, causal=False):
    batch, seqlen_q, heads, head_dim = q.shape
    # Both outputs are freshly allocated and contiguous, as in csrc/ops/forward_*.cpp.
    out = q.new_empty((batch, seqlen_q, heads, head_dim))
    lse = q.new_empty((batch, heads, seqlen_q), dtype=torch.float32)
    return out, lse
