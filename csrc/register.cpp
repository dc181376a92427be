// The operator schemas and their CUDA and CPU implementations.
//
// Fake (meta) implementations and autograd live in python/fattn, registered with
// torch.library on import, as DESIGN.md lays out.
#include <torch/csrc/stable/library.h>

#include "ops/ops.h"

STABLE_TORCH_LIBRARY(fattn, m) {
  m.def("forward(Tensor q, Tensor k, Tensor v, float? softmax_scale=None, bool causal=False) "
        "-> (Tensor out, Tensor lse)");
}

STABLE_TORCH_LIBRARY_IMPL(fattn, CUDA, m) {
  m.impl("forward", TORCH_BOX(&fattn::ops::forward_cuda));
}

STABLE_TORCH_LIBRARY_IMPL(fattn, CPU, m) {
  m.impl("forward", TORCH_BOX(&fattn::ops::forward_cpu));
}
