// fattn::merge_attention_states: one (out, lse) from a stack of partial results over disjoint key
// sets, weighted by their lse in fp32; -inf partials are ignored. The arguments are checked once,
// then handed to the implementation of their device (merge/merge_impl.h). Registered here for
// both dispatch keys; the schema is in csrc/register.cpp.
#include <torch/csrc/stable/library.h>

#include "merge/merge_impl.h"
#include "runtime/host_exception.h"

namespace fattn {
namespace {

std::tuple<Tensor, Tensor> merge_attention_states(Tensor outs, Tensor lses) {
  constexpr const char* op = "fattn.merge_attention_states";
  const MergeShape m = check_merge_inputs(op, outs, lses);
  if (outs.is_cpu()) return merge_on_cpu(m, outs, lses);
  return launch_merge(op, m, outs, lses);
}

}  // namespace
}  // namespace fattn

STABLE_TORCH_LIBRARY_IMPL(fattn, CUDA, m) {
  m.impl("merge_attention_states", FATTN_BOX(&fattn::merge_attention_states));
}

STABLE_TORCH_LIBRARY_IMPL(fattn, CPU, m) {
  m.impl("merge_attention_states", FATTN_BOX(&fattn::merge_attention_states));
}
