// The operator schemas and their CUDA and CPU implementations.
//
// Fake (meta) implementations and autograd live in python/fattn, registered with
// torch.library on import, as DESIGN.md lays out.
#include <torch/csrc/stable/library.h>

#include "ops/ops.h"

STABLE_TORCH_LIBRARY(fattn, m) {
  m.def("forward(Tensor q, Tensor k, Tensor v, float? softmax_scale=None, bool causal=False, "
        "bool deterministic=False) -> (Tensor out, Tensor lse)");
  m.def("backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? dlse, "
        "float? softmax_scale, bool causal, bool deterministic) -> (Tensor dq, Tensor dk, Tensor dv)");
  m.def("merge_attention_states(Tensor outs, Tensor lses) -> (Tensor out, Tensor lse)");
}

STABLE_TORCH_LIBRARY_IMPL(fattn, CUDA, m) {
  m.impl("forward", TORCH_BOX(&fattn::ops::forward_cuda));
  m.impl("backward", TORCH_BOX(&fattn::ops::backward_cuda));
  m.impl("merge_attention_states", TORCH_BOX(&fattn::ops::merge_cuda));
}

STABLE_TORCH_LIBRARY_IMPL(fattn, CPU, m) {
  m.impl("forward", TORCH_BOX(&fattn::ops::forward_cpu));
  m.impl("backward", TORCH_BOX(&fattn::ops::backward_cpu));
  m.impl("merge_attention_states", TORCH_BOX(&fattn::ops::merge_cpu));
}
