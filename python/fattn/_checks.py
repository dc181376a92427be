"""Rules every op family shares: the dtype of lse, and the input checks that the fakes run.

A fake stands in for its C++ op under torch.compile and FakeTensor tracing, where the op
itself never runs: it raises the op's own error (same text) for every rule that shapes,
dtypes and devices decide. Rules that need the values of a tensor (cache_seqlens, a block
table) stay with the op.

Checks compare sizes with plain Python operators so that symbolic sizes become guards of
the compiled graph, and skip float arguments that are symbolic rather than specialise them.
"""

from __future__ import annotations

import math

import torch

MAX_HEAD_DIM = 256

_DTYPE_NAMES = {
    torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float64: "float64",
    torch.int32: "int32", torch.int64: "int64", torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8",
    torch.bool: "bool",
}
# Meta tensors carry no data on any backend: they pass the device rules, so that shape
# inference on the meta device keeps working through the fakes.
_DEVICE_TYPES = ("cpu", "cuda", "meta")


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """lse's dtype for inputs of `dtype`: float32, except float64 inputs (CPU only), whose lse
    stays float64 so that gradients through it can be checked by finite differences."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def fail(op: str, *parts) -> None:
    raise RuntimeError(f"{op}: " + "".join(str(p) for p in parts))


def shape_of(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_NAMES.get(dtype) or str(dtype).removeprefix("torch.")


def device_name(t: torch.Tensor) -> str:
    device = t.device
    if device.type == "cuda":
        return f"cuda:{device.index}"
    if device.type in _DEVICE_TYPES:
        return device.type
    return "a device other than cpu or cuda"


def check_rank(op: str, name: str, t: torch.Tensor, rank: int, layout: str) -> None:
    if t.dim() != rank:
        fail(op, name, f" must be a {rank}-D tensor {layout}, got shape ", shape_of(t))
    if t.device.type not in _DEVICE_TYPES:
        fail(op, name, " must be a CUDA or CPU tensor")


def check_same_device(op: str, name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor, hint: str = "") -> None:
    if device_name(t) != device_name(ref):
        fail(op, name, " is on ", device_name(t), " but ", ref_name, " is on ", device_name(ref), hint)


def check_same_dtype(op: str, name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor, hint: str = "") -> None:
    if t.dtype != ref.dtype:
        fail(op, name, " has dtype ", dtype_name(t.dtype), " but ", ref_name, " has ", dtype_name(ref.dtype), hint)


def check_attention_dtype(op: str, name: str, t: torch.Tensor, fp8_allowed: bool = False) -> None:
    """float16/bfloat16 anywhere, float8 (e4m3fn, e5m2) where fp8_allowed (the forwards);
    float32/float64 also on CPU, where the reference implementations run."""
    if t.dtype in (torch.float16, torch.bfloat16):
        return
    if fp8_allowed and t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return
    on_cpu = t.device.type == "cpu"
    if t.dtype in (torch.float32, torch.float64) and (on_cpu or t.device.type == "meta"):
        return
    fail(op, name, " has dtype ", dtype_name(t.dtype), "; expected float16 or bfloat16",
         " (or float8_e4m3fn/float8_e5m2)" if fp8_allowed else "", " (or float32/float64 on CPU)" if on_cpu else "")


def check_last_dim_contiguous(op: str, name: str, t: torch.Tensor, hint: str = "") -> None:
    stride = t.stride(-1)
    if stride != 1:
        fail(op, name, " must have a contiguous last dim (stride 1), got stride ", stride, hint)


def check_index_tensor(op: str, name: str, t: torch.Tensor, rank: int, q: torch.Tensor) -> None:
    """int32, `rank`-D, on q's device: lengths and block tables."""
    if t.dtype != torch.int32:
        fail(op, name, " has dtype ", dtype_name(t.dtype), "; expected int32")
    if t.dim() != rank:
        fail(op, name, f" must be a {rank}-D tensor, got shape ", shape_of(t))
    check_same_device(op, name, t, "q", q)


def check_head_dim(op: str, head_dim) -> None:
    if head_dim < 8 or head_dim > MAX_HEAD_DIM or head_dim % 8 != 0:
        fail(op, "head_dim ", head_dim, " is not supported; expected a multiple of 8 from 8 to ", MAX_HEAD_DIM)


def check_public_head_dim(op: str, head_dim) -> None:
    """What the public functions take: any head dim up to 256 (fattn/_head_dim.py pads the rest)."""
    if head_dim < 1 or head_dim > MAX_HEAD_DIM:
        fail(op, "head_dim ", head_dim, " is not supported; expected 1 to ", MAX_HEAD_DIM)


def check_head_groups(op: str, heads, kv_heads, kv_names: str) -> None:
    if kv_heads < 1 or heads % kv_heads != 0:
        fail(op, "q has ", heads, " heads, which is not a multiple of the ", kv_heads, " heads of ", kv_names,
             " (GQA/MQA needs q heads = group size x kv heads)")


def check_finite(op: str, name: str, value) -> None:
    """A float argument (softmax_scale, softcap) must be finite; symbolic floats are left to the op."""
    if isinstance(value, (int, float)) and not math.isfinite(value):
        fail(op, name, " must be a finite number, got ", f"{value:g}")


def check_softcap(op: str, softcap) -> None:
    if isinstance(softcap, (int, float)) and not (softcap >= 0 and math.isfinite(softcap)):
        fail(op, "softcap must be a finite number >= 0 (0 disables it), got ", f"{softcap:g}")


def check_window(op: str, window_left, window_right) -> None:
    for name, w in (("window_left", window_left), ("window_right", window_right)):
        if isinstance(w, int) and w < -1:
            fail(op, name, " is ", w, "; expected -1 (unbounded) or >= 0")


def check_alibi_slopes(op: str, alibi_slopes, q, batch, heads) -> None:
    """float32 [heads] or [batch, heads] on q's device (flash-attn's two forms)."""
    if alibi_slopes is None:
        return
    if alibi_slopes.dtype != torch.float32:
        fail(op, "alibi_slopes has dtype ", dtype_name(alibi_slopes.dtype), "; expected float32")
    shape = tuple(alibi_slopes.shape)
    if shape != (heads,) and shape != (batch, heads):
        fail(op, "alibi_slopes has shape ", shape_of(alibi_slopes), "; expected [heads] = [", heads,
             "] or [batch, heads] = [", batch, ", ", heads, "]")
    check_same_device(op, "alibi_slopes", alibi_slopes, "q", q)


def check_alibi_offset(op: str, alibi_offset, alibi_slopes, seqlen_q, seqlen_k) -> None:
    """0, or, with alibi_slopes, an offset that keeps every ALiBi distance within 32 bits
    (csrc/attention/attention_variant.cpp's add_alibi_offset)."""
    if alibi_offset == 0:
        return
    if alibi_slopes is None:
        fail(op, "alibi_offset is ", alibi_offset, " but alibi_slopes is None; the offset only shifts ALiBi's "
             "distances")
    limit = 2**31 - 1 - seqlen_q - seqlen_k
    if alibi_offset > limit or alibi_offset < -limit:
        fail(op, "alibi_offset is ", alibi_offset, "; expected |alibi_offset| <= ", limit,
             " (2^31 - 1 - seqlen_q - seqlen_k, so that every distance fits in 32 bits)")


def check_sinks(op: str, sinks, q, heads) -> None:
    """float32 [heads] on q's device: one logit per query head."""
    if sinks is None:
        return
    if sinks.dtype != torch.float32:
        fail(op, "sinks has dtype ", dtype_name(sinks.dtype), "; expected float32")
    if tuple(sinks.shape) != (heads,):
        fail(op, "sinks has shape ", shape_of(sinks), "; expected [heads] = [", heads, "]")
    check_same_device(op, "sinks", sinks, "q", q)


def check_segment_ids(op: str, q_segment_ids, kv_segment_ids, q, batch, seqlen_q, seqlen_k) -> None:
    """int32 [batch, seqlen_q] / [batch, seqlen_k] pairs on q's device, rows contiguous, dense layout."""
    if (q_segment_ids is None) != (kv_segment_ids is None):
        which = "q_segment_ids is given without kv_segment_ids" if q_segment_ids is not None else \
            "kv_segment_ids is given without q_segment_ids"
        fail(op, which, "; pass both or neither")
    if q_segment_ids is None:
        return
    if q.dim() != 4:
        fail(op, "segment ids take the dense [batch, seqlen, heads, head_dim] layout")
    for name, ids, length, label in (("q_segment_ids", q_segment_ids, seqlen_q, "seqlen_q"),
                                     ("kv_segment_ids", kv_segment_ids, seqlen_k, "seqlen_k")):
        check_index_tensor(op, name, ids, 2, q)
        if tuple(ids.shape) != (batch, length):
            fail(op, name, " has shape ", shape_of(ids), "; expected [batch, ", label, "] = [", batch, ", ", length,
                 "]")
        if length > 1 and ids.stride(1) != 1:
            fail(op, name, " must have contiguous rows (stride 1 along the sequence); call .contiguous() first")


def check_bias(op: str, bias, q, batch, heads, seqlen_q, seqlen_k) -> None:
    """[batch | 1, heads | 1, seqlen_q | 1, seqlen_k] in q's dtype on q's device, keys contiguous,
    dense layout (csrc/attention/bias.cpp)."""
    if bias is None:
        return
    if q.dim() != 4:
        fail(op, "bias takes the dense [batch, seqlen, heads, head_dim] layout")
    if bias.dtype != q.dtype:
        fail(op, "bias has dtype ", dtype_name(bias.dtype), " but q has ", dtype_name(q.dtype),
             "; the bias must have q's dtype")
    full = (batch, heads, seqlen_q)
    fits = bias.dim() == 4 and bias.shape[3] == seqlen_k and all(
        bias.shape[d] == full[d] or bias.shape[d] == 1 for d in range(3))
    if not fits:
        fail(op, "bias has shape ", shape_of(bias), "; expected [batch or 1, heads or 1, seqlen_q or 1, seqlen_k] = [",
             batch, ", ", heads, ", ", seqlen_q, ", ", seqlen_k, "]")
    check_same_device(op, "bias", bias, "q", q)
    if seqlen_k > 1 and bias.numel() > 0 and bias.stride(3) != 1:  # (an empty bias is never read)
        fail(op, "bias must have contiguous keys (stride 1 along its last dim); call .contiguous() first")


def check_dropout(op: str, dropout_p, dropout_seed, q) -> None:
    """0 <= dropout_p < 1; with dropout, an int64 seed of one element on q's device
    (csrc/attention/dropout.cpp)."""
    if isinstance(dropout_p, torch.SymFloat):
        return
    if not 0.0 <= dropout_p < 1.0:
        fail(op, "dropout_p is ", f"{dropout_p:g}", "; expected 0 <= dropout_p < 1")  # as C++ prints it
    if dropout_p == 0.0:
        return
    if dropout_seed is None:
        fail(op, "dropout_p > 0 needs dropout_seed (an int64 tensor of one element)")
    if dropout_seed.dtype != torch.int64:
        fail(op, "dropout_seed has dtype ", dtype_name(dropout_seed.dtype), "; expected int64")
    if dropout_seed.numel() != 1:
        fail(op, "dropout_seed has shape ", shape_of(dropout_seed), "; expected one element")
    check_same_device(op, "dropout_seed", dropout_seed, "q", q)
