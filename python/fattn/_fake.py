"""Fake (meta) implementations: shapes, dtypes and strides of each op's outputs, for
torch.compile and FakeTensor tracing. They must match what the real kernels return."""

import torch


@torch.library.register_fake("fattn::forward")
def _forward_fake(q, k, v, softmax_scale=None, causal=False, deterministic=False):
    batch, seqlen_q, heads, head_dim = q.shape
    # Both outputs are freshly allocated and contiguous, as in csrc/ops/forward_*.cpp.
    out = q.new_empty((batch, seqlen_q, heads, head_dim))
    # float32, except float64 inputs (CPU) keep float64 (see lse_dtype in attention_inputs.h)
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    lse = q.new_empty((batch, heads, seqlen_q), dtype=lse_dtype)
    return out, lse


@torch.library.register_fake("fattn::backward")
def _backward_fake(dout, q, k, v, out, lse, dlse, softmax_scale, causal, deterministic):
    # Fresh contiguous gradients shaped like q, k and v (csrc/ops/backward_*.cpp).
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


@torch.library.register_fake("fattn::merge_attention_states")
def _merge_fake(outs, lses):
    _, batch, seqlen_q, heads, head_dim = outs.shape
    lse_dtype = torch.float64 if outs.dtype == torch.float64 else torch.float32
    return outs.new_empty((batch, seqlen_q, heads, head_dim)), outs.new_empty((batch, heads, seqlen_q), dtype=lse_dtype)


@torch.library.register_fake("fattn::decode")
def _decode_fake(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, block_table=None, softmax_scale=None,
                 causal=False, window_left=-1, window_right=-1, softcap=0.0, num_splits=0):
    # The append mutates the caches in place (declared in the schema); the outputs are
    # fresh and contiguous, as in csrc/ops/decode_*.cpp.
    batch, seqlen_q, heads, head_dim = q.shape
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    return q.new_empty((batch, seqlen_q, heads, head_dim)), q.new_empty((batch, heads, seqlen_q), dtype=lse_dtype)
