"""Triton types of each kernel's runtime parameters, and the alignment promises we make.

Triton specializes on what it knows about arguments: a pointer known to be 16-byte
aligned and a stride known to be a multiple of 8 elements let it emit 16-byte
vector loads. The C++ op keeps these promises (it checks alignment before the
launch and copies an input that breaks them), so they are declared here once.
"""

from __future__ import annotations

# "*T" marks a pointer whose element type is the variant's dtype.
_FORWARD = {
    "Q": "*T", "K": "*T", "V": "*T", "Out": "*T", "Lse": "*fp32",
    **{f"stride_{t}{d}": "i64" for t in "qkvo" for d in "bsh"},
    "seqlen_q": "i32", "seqlen_k": "i32", "num_heads": "i32", "kv_group_size": "i32",
    "head_dim": "i32",
    "qk_scale": "fp32",
}
_FORWARD_ALIGNED = {
    **{p: 16 for p in ("Q", "K", "V", "Out", "Lse")},
    **{f"stride_{t}{d}": 8 for t in "qkvo" for d in "bsh"},
    "head_dim": 8,
}


def _strides(*tensors):
    return {f"stride_{t}{d}": "i64" for t in tensors for d in "bsh"}


def _strides_named(tensor, dims):
    return {f"stride_{tensor}{d}": "i64" for d in dims}


_BWD_PREPROCESS = {
    "Out": "*T", "DO": "*T", "DLse": "*fp32", "Delta": "*fp32", **_strides("o", "do"),
    "seqlen_q": "i32", "num_heads": "i32", "head_dim": "i32",
}
_BWD_PREPROCESS_ALIGNED = {"Out": 16, "DO": 16, "DLse": 16, "Delta": 16,
                           **{name: 8 for name in _strides("o", "do")}, "head_dim": 8}

_BWD_SHAPE_ARGS = {
    "seqlen_q": "i32", "seqlen_k": "i32", "num_heads": "i32", "kv_group_size": "i32", "head_dim": "i32",
    "qk_scale": "fp32", "softmax_scale": "fp32",
}
_BWD_DKDV = {
    "Q": "*T", "K": "*T", "V": "*T", "DO": "*T", "Lse": "*fp32", "Delta": "*fp32", "DK": "*T", "DV": "*T",
    **_strides("q", "k", "v", "do", "dk", "dv"), **_BWD_SHAPE_ARGS,
}
_BWD_DQ = {
    "Q": "*T", "K": "*T", "V": "*T", "DO": "*T", "Lse": "*fp32", "Delta": "*fp32", "DQ": "*T",
    **_strides("q", "k", "v", "do", "dq"), **_BWD_SHAPE_ARGS,
}


def _aligned(types):
    """Every pointer 16-byte aligned, every stride a multiple of 8 elements, head_dim of 8."""
    out = {name: 16 for name, ty in types.items() if ty.startswith("*")}
    out.update({name: 8 for name in types if name.startswith("stride_")})
    out["head_dim"] = 8
    return out


_MERGE = {
    "Outs": "*T", "Lses": "*fp32", "Out": "*T", "Lse": "*fp32",
    "stride_ps": "i64", "stride_pb": "i64", "stride_pq": "i64", "stride_ph": "i64",
    **_strides_named("o", "bqh"),
    "num_splits": "i32", "seqlen_q": "i32", "num_heads": "i32", "head_dim": "i32",
}

_DECODE_SCALARS = {
    "seqlen_q": "i32", "num_heads": "i32", "kv_group_size": "i32", "head_dim": "i32", "seqlen_new": "i32",
    "capacity": "i32", "page_size": "i32", "num_splits": "i32", "window_left": "i32", "window_right": "i32",
    "qk_scale": "fp32", "softcap_log2": "fp32",
}
_DECODE_SPLIT = {
    "Q": "*T", "KCache": "*T", "VCache": "*T", "CacheSeqlens": "*i32", "BlockTable": "*i32",
    "PartOut": "*fp32", "PartLse": "*fp32", "Out": "*T", "Lse": "*fp32",
    **_strides("q", "k", "v"), "stride_tb": "i64", **_DECODE_SCALARS,
}
_KV_APPEND = {
    "KNew": "*T", "VNew": "*T", "KCache": "*T", "VCache": "*T", "CacheSeqlens": "*i32", "BlockTable": "*i32",
    **_strides("nk", "nv", "k", "v"), "stride_tb": "i64", "page_size": "i32", "capacity": "i32",
    "head_dim": "i32",
}
_DECODE_MERGE = {
    "PartOut": "*fp32", "PartLse": "*fp32", "Out": "*T", "Lse": "*fp32",
    "num_rows": "i64", "num_splits": "i32", "seqlen_q": "i32", "num_heads": "i32", "head_dim": "i32",
}


def _aligned_except(types, *names):
    """_aligned, minus parameters that carry no such promise (int32 index tensors that
    may be views, the block table's row stride)."""
    out = _aligned(types)
    for name in names:
        out.pop(name, None)
    return out


SIGNATURES = {
    "attn_fwd": (_FORWARD, _FORWARD_ALIGNED),
    "attn_bwd_preprocess": (_BWD_PREPROCESS, _BWD_PREPROCESS_ALIGNED),
    "attn_bwd_dkdv": (_BWD_DKDV, _aligned(_BWD_DKDV)),
    "attn_bwd_dq": (_BWD_DQ, _aligned(_BWD_DQ)),
    "attn_merge": (_MERGE, _aligned(_MERGE)),
    "attn_decode_split": (_DECODE_SPLIT, _aligned_except(_DECODE_SPLIT, "CacheSeqlens", "BlockTable", "stride_tb")),
    "kv_append": (_KV_APPEND, _aligned_except(_KV_APPEND, "CacheSeqlens", "BlockTable", "stride_tb")),
    "attn_decode_merge": (_DECODE_MERGE, _aligned(_DECODE_MERGE)),
}


def triton_signature(kernel_fn, kernel: str, dtype: str) -> tuple[dict, dict]:
    """(signature, attrs) for triton.compile's ASTSource; constexprs are marked "constexpr"."""
    types, aligned = SIGNATURES[kernel]
    names = kernel_fn.arg_names
    unknown = set(types) - set(names)
    if unknown:
        raise KeyError(f"signatures.py names parameters {sorted(unknown)} that {kernel} does not have")
    signature, attrs = {}, {}
    for index, name in enumerate(names):
        ty = types.get(name, "constexpr")
        signature[name] = ty.replace("*T", "*" + dtype)
        if name in aligned:
            attrs[(index,)] = [["tt.divisibility", aligned[name]]]
    return signature, attrs


def runtime_params(signature: dict) -> list[tuple[str, str]]:
    """The launch ABI: the non-constexpr parameters in order, as (name, C type class)."""
    out = []
    for name, ty in signature.items():
        if ty == "constexpr":
            continue
        out.append((name, "ptr" if ty.startswith("*") else ty))
    return out
