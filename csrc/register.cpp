// The operator schemas. Each op's entry function, whose parameters follow its schema, is
// defined and registered for the CUDA and CPU dispatch keys in its family's file:
// attention/attention_ops.cpp, decode/decode_op.cpp, merge/merge_op.cpp.
//
// Fakes and autograd live beside each op family's Python wrapper in python/fattn,
// registered with torch.library on import.
#include <torch/csrc/stable/library.h>

STABLE_TORCH_LIBRARY(fattn, m) {
  m.def("forward(Tensor q, Tensor k, Tensor v, float? softmax_scale=None, bool causal=False, "
        "bool deterministic=False, int window_left=-1, int window_right=-1, float softcap=0.0, "
        "Tensor? alibi_slopes=None, Tensor? q_segment_ids=None, Tensor? kv_segment_ids=None, Tensor? sinks=None, "
        "Tensor? bias=None, float dropout_p=0.0, Tensor? dropout_seed=None, int alibi_offset=0, "
        "Tensor? q_descale=None, Tensor? k_descale=None, Tensor? v_descale=None) -> (Tensor out, Tensor lse)");
  m.def("backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? dlse, "
        "float? softmax_scale, bool causal, bool deterministic, int window_left=-1, int window_right=-1, "
        "float softcap=0.0, Tensor? alibi_slopes=None, Tensor? q_segment_ids=None, Tensor? kv_segment_ids=None, "
        "Tensor? bias=None, bool bias_grad=False, float dropout_p=0.0, Tensor? dropout_seed=None, "
        "int alibi_offset=0) -> (Tensor dq, Tensor dk, Tensor dv, Tensor dbias)");
  m.def("varlen_forward(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
        "SymInt max_seqlen_q, SymInt max_seqlen_k, Tensor? seqused_k=None, float? softmax_scale=None, "
        "bool causal=False, bool deterministic=False, int window_left=-1, int window_right=-1, float softcap=0.0, "
        "Tensor? alibi_slopes=None, Tensor? sinks=None, float dropout_p=0.0, Tensor? dropout_seed=None, "
        "Tensor? q_descale=None, Tensor? k_descale=None, Tensor? v_descale=None) -> (Tensor out, Tensor lse)");
  m.def("varlen_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? dlse, "
        "Tensor cu_seqlens_q, Tensor cu_seqlens_k, SymInt max_seqlen_q, SymInt max_seqlen_k, Tensor? seqused_k, "
        "float? softmax_scale, bool causal, bool deterministic, int window_left=-1, int window_right=-1, "
        "float softcap=0.0, Tensor? alibi_slopes=None, float dropout_p=0.0, Tensor? dropout_seed=None) "
        "-> (Tensor dq, Tensor dk, Tensor dv)");
  m.def("merge_attention_states(Tensor outs, Tensor lses) -> (Tensor out, Tensor lse)");
  // k_cache and v_cache are written in place when k and v are given (the append).
  m.def("decode(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? k=None, Tensor? v=None, "
        "Tensor? rotary_cos=None, Tensor? rotary_sin=None, Tensor? cache_seqlens=None, "
        "Tensor? cache_batch_idx=None, Tensor? cache_leftpad=None, Tensor? block_table=None, "
        "float? softmax_scale=None, bool causal=False, int window_left=-1, int window_right=-1, "
        "float softcap=0.0, bool rotary_interleaved=True, Tensor? alibi_slopes=None, int num_splits=0, "
        "Tensor? sinks=None, Tensor? k_descale=None, Tensor? v_descale=None) "
        "-> (Tensor out, Tensor lse)");
}
