"""The dense ring as two custom ops, fattn_cp::ring_forward and ring_backward, with their fakes and
autograd: torch.compile sees one opaque call where the ring's point-to-point ops, which it cannot
trace, would break the graph (python/fattn/_ring_varlen_op.py does the same for packed
documents). The agreement check, which reads an all-gather on the host, runs inside the forward
op."""

from __future__ import annotations

from typing import Optional

import torch
from torch.distributed.distributed_c10d import _resolve_process_group

from ._checks import lse_dtype
from ._ring_exchange import DTYPE_CODES, Ring, check_agreement
from ._ring_passes import _ring_backward, _ring_forward
from .attention import sinks_gradient

FN = "ring_flash_attn_func"


def _settings(causal, softmax_scale, sharding, window_left, window_right, softcap, alibi_slopes):
    return causal, softmax_scale, sharding, (window_left, window_right), softcap, alibi_slopes


@torch.library.custom_op("fattn_cp::ring_forward", mutates_args=())
def ring_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: Optional[torch.Tensor],
                 alibi_slopes: Optional[torch.Tensor], group: str, causal: bool, window_left: int, window_right: int,
                 softmax_scale: Optional[float], softcap: float, sharding: str,
                 deterministic: bool) -> tuple[torch.Tensor, torch.Tensor]:
    process_group = _resolve_process_group(group)
    # Unequal shards or mismatched dtypes would hang or corrupt the ring: every rank says what it holds.
    check_agreement(FN, process_group, q,
                    [q.shape[1], DTYPE_CODES.get(q.dtype, 0), q.shape[0], q.shape[2], k.shape[2], q.shape[3]],
                    ("shard length", "dtype", "batch", "heads", "kv heads", "head_dim"))
    settings = _settings(causal, softmax_scale, sharding, window_left, window_right, softcap, alibi_slopes)
    return _ring_forward(q, k, v, sinks, Ring(process_group), settings)


@ring_forward.register_fake
def _forward_fake(q, k, v, sinks, alibi_slopes, group, causal, window_left, window_right, softmax_scale, softcap,
                  sharding, deterministic):
    b, n, h, _ = q.shape
    return torch.empty_like(q), q.new_empty((b, h, n), dtype=lse_dtype(q.dtype))


@torch.library.custom_op("fattn_cp::ring_backward", mutates_args=())
def ring_backward(dout: torch.Tensor, dlse: Optional[torch.Tensor], q: torch.Tensor, k: torch.Tensor,
                  v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, alibi_slopes: Optional[torch.Tensor],
                  group: str, causal: bool, window_left: int, window_right: int, softmax_scale: Optional[float],
                  softcap: float, sharding: str,
                  deterministic: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    settings = _settings(causal, softmax_scale, sharding, window_left, window_right, softcap, alibi_slopes)
    return _ring_backward(dout.contiguous(), dlse, q, k, v, out, lse, Ring(_resolve_process_group(group)), settings,
                          deterministic)


@ring_backward.register_fake
def _backward_fake(dout, dlse, q, k, v, out, lse, alibi_slopes, group, causal, window_left, window_right,
                   softmax_scale, softcap, sharding, deterministic):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, sinks, alibi_slopes, *settings = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, sinks, alibi_slopes)
    ctx.settings = settings
    ctx.sinks_need_grad = sinks is not None and sinks.requires_grad


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, sinks, alibi_slopes = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv = ring_backward(dout, dlse, q, k, v, out, lse, alibi_slopes, *ctx.settings)
    # This rank's rows' share; sinks replicated over the ranks sum their shares as any replicated
    # parameter does (data-parallel gradient reduction).
    dsinks = sinks_gradient(sinks, dout, out, lse, dlse) if ctx.sinks_need_grad else None
    return dq, dk, dv, dsinks, None, None, None, None, None, None, None, None, None


ring_forward.register_autograd(_backward, setup_context=_setup_context)
