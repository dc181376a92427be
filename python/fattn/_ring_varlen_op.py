"""The packed ring as two custom ops, fattn_cp::ring_varlen_forward and ring_varlen_backward, with
their fakes and autograd: torch.compile sees one opaque call where the ring's point-to-point
ops, which it cannot trace, would break the graph. Everything that reads cu_seqlens' values (the
plan, the checks) runs inside the ops, so a traced call reads none: cu_seqlens is a tensor input,
and a new batch reuses the graph."""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as collectives
from torch.distributed.distributed_c10d import _resolve_process_group

from ._checks import check_softcap, lse_dtype
from ._cp_sharding import offsets, packed_layout
from ._ring_exchange import DTYPE_CODES, Ring, check_agreement
from ._ring_varlen_passes import Options, ring_backward, ring_forward
from ._ring_varlen_plan import VarlenPlan, varlen_plan
from .attention import sinks_gradient

FN = "ring_flash_attn_varlen_func"


def group_name(group) -> str:
    """The name the ops take for `group` (None: the default group); torch.compile traces it."""
    return collectives._resolve_group_name(dist.group.WORLD if group is None else group)


def _agreement(group, q, k, cu: tuple[int, ...]) -> None:
    """One small all-gather tells every rank what the others hold: different batches or dtypes
    would otherwise hang or corrupt the ring (not while a CUDA graph is captured: check_agreement)."""
    checksum = sum((i + 1) * x for i, x in enumerate(cu)) % (2**61 - 1)
    check_agreement(FN, group, q, [len(cu), cu[-1], checksum, DTYPE_CODES.get(q.dtype, 0), q.shape[1], k.shape[1],
                                   q.shape[2]],
                    ("documents + 1", "total rows", "cu_seqlens checksum", "dtype", "heads", "kv heads", "head_dim"))


def _plan(q, k, v, cu_seqlens, name, causal, window_left, window_right, alibi, check=False) -> tuple[VarlenPlan, Ring]:
    group = _resolve_process_group(name)
    cu = offsets(FN, cu_seqlens)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    local_total = packed_layout(cu, world).local_total(rank)
    if not q.shape[0] == k.shape[0] == v.shape[0] == local_total:
        raise ValueError(f"fattn.{FN}: rank {rank}'s part of the batch is {local_total} rows "
                         f"(fattn.varlen_shard_layout); got q, k, v of {q.shape[0]}, {k.shape[0]}, {v.shape[0]}")
    if check:  # the forward's: the backward runs on what the forward checked
        _agreement(group, q, k, cu)
    return varlen_plan(cu, world, causal, (window_left, window_right), alibi), Ring(group)


@torch.library.custom_op("fattn_cp::ring_varlen_forward", mutates_args=())
def ring_varlen_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                        sinks: Optional[torch.Tensor], alibi_slopes: Optional[torch.Tensor], group: str, causal: bool,
                        window_left: int, window_right: int, softmax_scale: Optional[float], softcap: float,
                        deterministic: bool) -> tuple[torch.Tensor, torch.Tensor]:
    check_softcap(f"fattn.{FN}", softcap)
    plan, ring = _plan(q, k, v, cu_seqlens, group, causal, window_left, window_right, alibi_slopes is not None,
                       check=True)
    return ring_forward(q, k, v, sinks, ring, plan, Options(softmax_scale, softcap, alibi_slopes, deterministic))


@ring_varlen_forward.register_fake
def _forward_fake(q, k, v, cu_seqlens, sinks, alibi_slopes, group, causal, window_left, window_right, softmax_scale,
                  softcap, deterministic):
    return torch.empty_like(q), q.new_empty((q.shape[1], q.shape[0]), dtype=lse_dtype(q.dtype))


@torch.library.custom_op("fattn_cp::ring_varlen_backward", mutates_args=())
def ring_varlen_backward(dout: torch.Tensor, dlse: Optional[torch.Tensor], q: torch.Tensor, k: torch.Tensor,
                         v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, cu_seqlens: torch.Tensor,
                         alibi_slopes: Optional[torch.Tensor], group: str, causal: bool, window_left: int,
                         window_right: int, softmax_scale: Optional[float], softcap: float,
                         deterministic: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    plan, ring = _plan(q, k, v, cu_seqlens, group, causal, window_left, window_right, alibi_slopes is not None)
    return ring_backward(dout.contiguous(), dlse, q, k, v, out, lse, ring, plan,
                         Options(softmax_scale, softcap, alibi_slopes, deterministic))


@ring_varlen_backward.register_fake
def _backward_fake(dout, dlse, q, k, v, out, lse, cu_seqlens, alibi_slopes, group, causal, window_left, window_right,
                   softmax_scale, softcap, deterministic):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens, sinks, alibi_slopes, *settings = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens, sinks, alibi_slopes)
    ctx.settings = settings
    ctx.sinks_need_grad = sinks is not None and sinks.requires_grad


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, cu_seqlens, sinks, alibi_slopes = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv = ring_varlen_backward(dout, dlse, q, k, v, out, lse, cu_seqlens, alibi_slopes, *ctx.settings)
    # This rank's rows' share, as in the dense ring (sum it over the ranks).
    dsinks = sinks_gradient(sinks, dout, out, lse, dlse) if ctx.sinks_need_grad else None
    return dq, dk, dv, None, dsinks, None, None, None, None, None, None, None, None


ring_varlen_forward.register_autograd(_backward, setup_context=_setup_context)
