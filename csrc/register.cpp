// The operator schemas and their CUDA and CPU implementations.
//
// Fakes and autograd live beside each op family's Python wrapper in python/fattn,
// registered with torch.library on import. FATTN_BOX is TORCH_BOX with errors rethrown
// through the process's C++ runtime (runtime/host_exception.h says why).
#include <torch/csrc/stable/library.h>

#include "ops.h"
#include "runtime/host_exception.h"

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

STABLE_TORCH_LIBRARY_IMPL(fattn, CUDA, m) {
  m.impl("forward", FATTN_BOX(&fattn::forward_cuda));
  m.impl("backward", FATTN_BOX(&fattn::backward_cuda));
  m.impl("varlen_forward", FATTN_BOX(&fattn::varlen_forward_cuda));
  m.impl("varlen_backward", FATTN_BOX(&fattn::varlen_backward_cuda));
  m.impl("merge_attention_states", FATTN_BOX(&fattn::merge_cuda));
  m.impl("decode", FATTN_BOX(&fattn::decode_cuda));
}

STABLE_TORCH_LIBRARY_IMPL(fattn, CPU, m) {
  m.impl("forward", FATTN_BOX(&fattn::forward_cpu));
  m.impl("backward", FATTN_BOX(&fattn::backward_cpu));
  m.impl("varlen_forward", FATTN_BOX(&fattn::varlen_forward_cpu));
  m.impl("varlen_backward", FATTN_BOX(&fattn::varlen_backward_cpu));
  m.impl("merge_attention_states", FATTN_BOX(&fattn::merge_cpu));
  m.impl("decode", FATTN_BOX(&fattn::decode_cpu));
}
