"""FP8 inputs: quantize_fp8 turns a 16- or 32-bit [batch, seqlen, heads, head_dim] tensor into
FP8 and the float32 descale factors that FlashAttention-3's FP8 calls take beside it, shaped
[batch, heads] (its q_descale / k_descale / v_descale convention): x is about
x_fp8.float() * descale[b, h] for the rows of sequence b, head h.

The scale maps each group's largest magnitude onto the FP8 dtype's largest finite value, so
that no value saturates and the small ones keep as many bits as the group allows; a group of
zeros gets descale 1. Written in torch operations, it runs on any device; its check that every
value is finite reads the tensor, so under torch.compile the graph breaks there.

Below it, the fakes' checks of the attention functions' FP8 arguments (q_descale, k_descale,
v_descale beside float8 q, k, v), which mirror the ops'.
"""

from __future__ import annotations

import torch

from ._checks import check_same_device, dtype_name, fail, shape_of

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
GRANULARITIES = ("tensor", "head")
_OP = "fattn.quantize_fp8"


def quantize_fp8(x: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn,
                 granularity: str = "tensor") -> tuple[torch.Tensor, torch.Tensor]:
    """(x_fp8, descale): x [batch, seqlen, heads, head_dim] (float16, bfloat16 or float32, every
    value finite) in `dtype` (torch.float8_e4m3fn or torch.float8_e5m2) and float32 descale
    [batch, heads].

    granularity "tensor": one scale for the whole tensor, every entry of descale the same;
    "head": one per (sequence, head), over its seqlen x head_dim values. x_fp8 has x's shape,
    contiguous; descale is contiguous."""
    if not isinstance(x, torch.Tensor):
        fail(_OP, "x must be a tensor, got ", type(x).__name__)
    if x.dim() != 4:
        fail(_OP, "x must be a 4-D tensor [batch, seqlen, heads, head_dim], got shape ", shape_of(x))
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        fail(_OP, "x has dtype ", dtype_name(x.dtype), "; expected float16, bfloat16 or float32")
    if dtype not in FP8_DTYPES:
        fail(_OP, "dtype must be torch.float8_e4m3fn or torch.float8_e5m2, got ", dtype)
    if granularity not in GRANULARITIES:
        fail(_OP, "granularity must be \"tensor\" or \"head\", got ", repr(granularity))
    batch, _, heads, _ = x.shape
    if x.numel() == 0:
        return x.to(dtype).contiguous(), torch.ones(batch, heads, dtype=torch.float32, device=x.device)
    xf = x.float()
    if not bool(torch.isfinite(xf).all()):
        fail(_OP, "x has values that are not finite; FP8 scaling needs every value finite")
    if granularity == "tensor":
        amax = xf.abs().amax().reshape(1, 1).expand(batch, heads)
    else:
        amax = xf.abs().amax(dim=(1, 3))
    # The scale that maps amax to the dtype's largest finite value; a group of zeros keeps
    # scale 1, so that descale stays finite and nonzero.
    descale = torch.where(amax > 0, amax / torch.finfo(dtype).max, torch.ones_like(amax)).contiguous()
    scaled = xf / descale[:, None, :, None]
    # Rounding may carry amax / descale a hair past the largest value: clamp, never saturate
    # to NaN (e4m3fn has no infinity).
    limit = torch.finfo(dtype).max
    x_fp8 = scaled.clamp(-limit, limit).to(dtype).contiguous()
    return x_fp8, descale


# ---------------------------------------------------------------- FP8 attention inputs
# The fakes' mirror of csrc/common/fp8.cpp and csrc/attention/fp8_inputs.cpp (same order, same
# messages); the attention functions take q_descale, k_descale and v_descale beside float8 q, k, v.

_DESCALES = ("q_descale", "k_descale", "v_descale")


def forward_output_dtype(dtype: torch.dtype) -> torch.dtype:
    """The forward's output dtype: bfloat16 for float8 inputs (FlashAttention-3's), q's otherwise."""
    return torch.bfloat16 if dtype in FP8_DTYPES else dtype


def check_descale(op: str, name: str, t, batch: int, kv_heads: int, query_heads: int, q) -> None:
    """An optional float32 descale [batch, kv_heads] (or [batch, heads] for q's, query_heads != 0)."""
    if t is None:
        return
    check_same_device(op, name, t, "q", q)
    if t.dtype != torch.float32:
        fail(op, name, " has dtype ", dtype_name(t.dtype), "; expected float32")
    heads_ok = t.dim() == 2 and (t.shape[1] == kv_heads or (query_heads != 0 and t.shape[1] == query_heads))
    if t.dim() != 2 or t.shape[0] != batch or not heads_ok:
        if query_heads != 0 and query_heads != kv_heads:
            fail(op, name, " has shape ", shape_of(t), "; expected [batch, kv_heads] = [", batch, ", ", kv_heads,
                 "] or [batch, heads] = [", batch, ", ", query_heads, "]")
        fail(op, name, " has shape ", shape_of(t), "; expected [batch, kv_heads] = [", batch, ", ", kv_heads, "]")


def check_fp8_inputs(op: str, batch: int, heads: int, kv_heads: int, q, bias, dropout_p: float, q_segment_ids,
                     q_descale, k_descale, v_descale) -> None:
    """Descales go with float8 q, k, v only; float8 inputs take no bias, dropout or segment ids."""
    descales = (q_descale, k_descale, v_descale)
    if q.dtype not in FP8_DTYPES:
        for name, t in zip(_DESCALES, descales):
            if t is not None:
                fail(op, name, " is given but q has dtype ", dtype_name(q.dtype),
                     "; descale factors go with float8_e4m3fn or float8_e5m2 q, k and v")
        return
    for i, (name, t) in enumerate(zip(_DESCALES, descales)):
        check_descale(op, name, t, batch, kv_heads, heads if i == 0 else 0, q)
    if bias is not None:
        fail(op, "float8 q, k and v take no bias")
    if dropout_p > 0:
        fail(op, "float8 q, k and v take no dropout (dropout_p must be 0)")
    if q_segment_ids is not None:
        fail(op, "float8 q, k and v take no segment ids")


def refuse_gradients(fn: str, q, *others) -> None:
    """FP8 attention is inference only: with float8 q, an input that asks for gradients (q, k, v,
    sinks) is refused before the forward runs, not at the backward."""
    if (q.dtype in FP8_DTYPES and torch.is_grad_enabled()
            and any(t is not None and t.requires_grad for t in (q, *others))):
        fail(f"fattn.{fn}", "float8 q, k and v have no backward; call it under torch.no_grad() or "
             "with tensors that do not require grad")
