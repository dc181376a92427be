"""FP8 inputs of the attention kernels (attn_fwd's FP8 flag, the decode kernels' KV_FP8).

A variant's dtype stays the 16-bit type of its output; the flag says that the tensors it names
hold float8 values instead (1 e4m3fn, 2 e5m2: the values of fp8_flag in csrc/common/fp8.h), and
the kernel reinterprets their pointers. Each FP8 tensor stands for its values times a float32
descale factor per (sequence, head), applied where it costs least: the scores' descales fold
into the scale every score is multiplied by anyway, V's multiplies the finished accumulator.
"""

import triton
import triton.language as tl

from .constants import INTERPRETED
from .spec import KernelSpec, Param, i32, index_tensor, strides, tensor
from .tiles import sequence_span


def fp8_v_row_stride(name: str) -> Param:
    """The head-dim stride of an FP8 V read transposed (keys contiguous): the op pads each row to
    a multiple of 16 keys, so that every row starts 16-byte aligned."""
    return Param(name, "i64", 16)


@triton.jit
def fp8_pointer(ptr, FP8: tl.constexpr):
    """`ptr` as a pointer to the FP8 type that the flag names; unchanged for FP8 0."""
    if FP8 == 1:
        ptr = ptr.to(tl.pointer_type(tl.float8e4nv), bitcast=True)
    elif FP8 == 2:
        ptr = ptr.to(tl.pointer_type(tl.float8e5), bitcast=True)
    return ptr


@triton.jit
def descale_at(Descale, batch, head, stride_b, stride_h):
    """The float32 descale factor of (batch, head): [batch, heads] with any strides."""
    return tl.load(Descale + batch * stride_b + head.to(tl.int64) * stride_h)


# float32 to FP8 in one rounding (to nearest, ties to even, saturating), two values per asm, or
# one (the other half of the pair is a zero). Triton 3.6's cast does this on sm_90, but on sm_89
# it rounds to float16 toward zero first (cvt.rz.f16.f32), a second rounding that takes the lower
# neighbour of a value just past a tie: one FP8 step from the CPU implementation's rounding.
def _f32_to_fp8(fmt: str, pairs: bool) -> str:
    """PTX rounding float32 to FP8 (`fmt`: e4m3 or e5m2) into $0: $1 and $2 (the first in the low
    byte: cvt's first source goes high), or $1 alone beside a zero."""
    if pairs:
        return f"cvt.rn.satfinite.{fmt}x2.f32 $0, $2, $1;"
    return f"{{ .reg .b16 pair; cvt.rn.satfinite.{fmt}x2.f32 pair, 0f00000000, $1; mov.b16 $0, pair; }}"


F32_TO_E4M3X2 = tl.constexpr(_f32_to_fp8("e4m3", True))
F32_TO_E5M2X2 = tl.constexpr(_f32_to_fp8("e5m2", True))
F32_TO_E4M3 = tl.constexpr(_f32_to_fp8("e4m3", False))
F32_TO_E5M2 = tl.constexpr(_f32_to_fp8("e5m2", False))


@triton.jit
def to_fp8(x, FP8: tl.constexpr, PAIRS: tl.constexpr):
    """x (float32) rounded once to the FP8 type the flag names (1 e4m3fn, 2 e5m2), saturating at
    its largest finite value (NaN stays NaN). PAIRS: two values per conversion, for tensors whose
    threads hold an even count (an mma tile); else one. Triton's interpreter runs no PTX: there
    the plain cast, which rounds once."""
    fp8_type: tl.constexpr = tl.float8e4nv if FP8 == 1 else tl.float8e5
    if INTERPRETED:
        return x.to(fp8_type)
    if PAIRS:
        asm: tl.constexpr = F32_TO_E4M3X2 if FP8 == 1 else F32_TO_E5M2X2
        bits = tl.inline_asm_elementwise(asm, "=h,r,r", [x], dtype=tl.int8, is_pure=True, pack=2)
    else:
        asm: tl.constexpr = F32_TO_E4M3 if FP8 == 1 else F32_TO_E5M2
        bits = tl.inline_asm_elementwise(asm, "=h,r", [x], dtype=tl.int8, is_pure=True, pack=1)
    return bits.to(fp8_type, bitcast=True)


@triton.jit
def fp8_probabilities(p, p_scale):
    """Probabilities (fp32, at most 1) for the second product on FP8 tensor cores: times p_scale
    (a power of two, csrc/common/fp8.h's kFp8ProbabilityScale), rounded to e4m3 (to_fp8: to
    nearest, ties to even, saturating), whatever V's FP8 type: e4m3 keeps a mantissa bit more than
    e5m2, and the tensor cores take the mixed product."""
    return to_fp8(p * p_scale, 1, True)


@triton.jit
def key_order_source(k):
    """KEY_ORDER, the Hopper FP8 forward's order of each 32 keys: the key (0-31) at position k.
    Key c = 16 j1 + 8 j0 + 2 t + e (j0: its 8-key block's low bit, t: the accumulator lane that
    holds it) sits at 16 j1 + 4 t + 2 j0 + e, the 8-bit A operand's slot of the same register
    (forward_sm90._p_operand); so position k = 16 j1 + 4 t + 2 j0 + e holds that c."""
    return (k & 16) | (((k >> 1) & 1) << 3) | (((k >> 2) & 3) << 1) | (k & 1)


@triton.jit
def fp8_transpose_v(
    V, Vt,
    stride_vb, stride_vs, stride_vh,
    stride_tb, stride_th, stride_td,
    CuSeqlensK, SequsedK, use_cu_seqlens, use_seqused_k, seqlen_k, head_dim, columns, key_order,
    BLOCK_S: tl.constexpr, BLOCK_DIM: tl.constexpr,
):
    """V^T of an FP8 V, for attn_fwd's FP8 variants: Vt[b, h, d, j] = V[b, j, h, d] (dense) or
    V[cu_seqlens_k[b] + j, h, d] (packed, use_cu_seqlens != 0; its first seqused_k[b] keys with
    use_seqused_k != 0), keys j < `columns` (seqlen_k, the
    longest sequence, rounded up to the attention variant's BLOCK_N, a multiple of 16) with zeros
    past each sequence's end. Every sequence's keys start a row of Vt, so the attention kernel's
    loads of it are 16-byte aligned whatever the packing (a packed V^T would put sequences at any
    byte offset), and the zeros let it load whole tiles unmasked along the keys.

    key_order 1 stores each 32 keys in KEY_ORDER (the Hopper kernel's, forward_sm90._p_operand),
    0 in order (attn_fwd's).

    Grid: (cdiv(columns, BLOCK_S), kv_heads, batch). It moves bytes: the pointers are the
    variant's 16-bit type, reinterpreted, and strides are in bytes (elements of the FP8 tensors);
    stride_td is a multiple of 16, BLOCK_S of 32. head_dim <= BLOCK_DIM.
    """
    V = V.to(tl.pointer_type(tl.int8), bitcast=True)
    Vt = Vt.to(tl.pointer_type(tl.int8), bitcast=True)
    head = tl.program_id(1)
    batch = tl.program_id(2).to(tl.int64)
    # Keys past seqused_k are zeros too: the attention kernel reads V^T unmasked along the keys,
    # and an unused key's bytes may be anything (an FP8 NaN times a probability of 0 is NaN).
    start, length = sequence_span(CuSeqlensK, SequsedK, batch, seqlen_k, use_cu_seqlens, use_seqused_k)
    columns_at = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    # The key each column holds: itself, or in KEY_ORDER (gathered from V's rows, so that the
    # stores stay contiguous).
    keys = tl.where(key_order != 0, (columns_at & ~31) | key_order_source(columns_at & 31), columns_at)
    dims = tl.arange(0, BLOCK_DIM)
    source = (V + batch * stride_vb + head.to(tl.int64) * stride_vh
              + (start + keys)[:, None].to(tl.int64) * stride_vs + dims[None, :])
    tile = tl.load(source, mask=(keys[:, None] < length) & (dims[None, :] < head_dim), other=0)
    target = (Vt + batch * stride_tb + head.to(tl.int64) * stride_th + dims[:, None].to(tl.int64) * stride_td
              + columns_at[None, :])
    tl.store(target, tl.trans(tile), mask=(dims[:, None] < head_dim) & (columns_at[None, :] < columns))


FP8_TRANSPOSE_V = KernelSpec(fp8_transpose_v, [
    tensor("V"), tensor("Vt"), *strides("v"), *strides("t", "bhd"),
    index_tensor("CuSeqlensK"), index_tensor("SequsedK"), i32("use_cu_seqlens"), i32("use_seqused_k"),
    i32("seqlen_k"), i32("head_dim", multiple_of=8),
    i32("columns", multiple_of=16),
    i32("key_order"),
])
