"""The argument groups the attention kernels share, each defined once, in the one order every
kernel takes them (the order of definition below; KernelSpec refuses another).

A group is a run of runtime parameters that means one thing to every kernel that takes it. The
build generates one C++ struct per group (`fattn::kernels::WindowArgs` for "window",
aot_build/launchers.py) and csrc/attention/kernel_args.h has one builder per struct, so a launch
site reads `.window = window_args(variant)` and a new argument of a group touches the group, its builder and
the kernels that read it. What a single kernel alone takes (its tensors and strides, the
backward's extra outputs) stays in that kernel's spec, beside it.
"""

from .fp8 import fp8_v_row_stride
from .spec import f32, group, i32, i64, index_tensor, seed_tensor, slopes_tensor, strides, view

SEQUENCES = group(
    "sequences", "Packed (varlen) sequences: sequence b's rows start at cu_seqlens[b]; its keys stop at "
    "seqused_k[b] when given. Unused pointers are never read (their use flags are 0).",
    index_tensor("CuSeqlensQ"), index_tensor("CuSeqlensK"), index_tensor("SequsedK"), i32("use_cu_seqlens"),
    i32("use_seqused_k"))

SHAPE = group(
    "shape", "The longest sequence's query and key lengths, query heads per KV head, the head dim.",
    i32("seqlen_q"), i32("seqlen_k"), i32("kv_group_size"), i32("head_dim", multiple_of=8))

WINDOW = group(
    "window", "Key j is visible to query i iff i + diagonal - window_left <= j <= i + diagonal + window_right "
    "(diagonal = seqlen_k - seqlen_q); -1 is unbounded, causal is window_right 0.",
    i32("window_left"), i32("window_right"))

ALIBI = group(
    "alibi", "ALiBi: -slope * |i + diagonal + alibi_offset - j| added to each score; slopes float32 [heads] "
    "or [batch, heads] (batch stride 0 for the first), never read when use_alibi is 0.",
    slopes_tensor("Alibi"), *strides("alibi", "bh", aligned=False), i32("use_alibi"), i32("alibi_offset"))

SEGMENTS = group(
    "segments", "Segment ids (dense layout): query i sees key j only where their int32 ids are equal; "
    "SegmentSpans holds each tile's span of the other side (triton_src/segments.py).",
    index_tensor("QSegmentIds"), index_tensor("KvSegmentIds"), i64("stride_qsegb"), i64("stride_kvsegb"),
    i32("use_segments"), index_tensor("SegmentSpans"), i64("stride_spanb"))

SCORES = group(
    "scores", "The scores in the log2 domain: qk_scale multiplies q.k (scale * log2(e), or scale / softcap "
    "with a softcap), softcap_log2 = softcap * log2(e) or 0.",
    f32("qk_scale"), f32("softcap_log2"))

SINKS = group(
    "sinks", "One float32 logit per query head that joins each row's softmax denominator (never read when "
    "use_sinks is 0).",
    slopes_tensor("Sinks"), i32("use_sinks"))

BIAS = group(
    "bias", "An additive bias, a broadcast view over (batch, head, query) of rows of seqlen_k keys (dense "
    "layout only; never read when use_bias is 0).",
    view("Bias"), *strides("bias", "bhq", aligned=False), i32("use_bias"))

DROPOUT = group(
    "dropout", "Dropout after the softmax: a key is kept when its Philox draw is below dropout_threshold "
    "(0: no dropout, the seed is never read); kept probabilities are multiplied by dropout_scale.",
    seed_tensor("DropoutSeed"), i32("dropout_threshold"), f32("dropout_scale"))

FP8_INPUTS = group(
    "fp8_inputs", "FP8 q, k and v: float32 descales [batch, kv_heads] (q's shared by q_descale_group query "
    "heads; never read without the FP8 flag), the scale of the FP8 probabilities, and the head-dim stride "
    "of V read transposed (triton_src/fp8.py).",
    slopes_tensor("QDescale"), slopes_tensor("KDescale"), slopes_tensor("VDescale"),
    *strides("qdescale", "bh", aligned=False), *strides("kdescale", "bh", aligned=False),
    *strides("vdescale", "bh", aligned=False), i32("q_descale_group"), f32("p_scale"), fp8_v_row_stride("stride_vd"))

CACHE_DESCALES = group(
    "cache_descales", "An FP8 KV cache's float32 descales [batch, kv_heads]: what its values stand for "
    "(never read when their use flag is 0).",
    slopes_tensor("KDescale"), *strides("kd", "bh", aligned=False), i32("use_k_descale"),
    slopes_tensor("VDescale"), *strides("vd", "bh", aligned=False), i32("use_v_descale"))
