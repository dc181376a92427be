// The two implementations of fattn::merge_attention_states, given outs and lses that
// merge_op.cpp has checked: the CUDA launch and the CPU's float64 definition.
#pragma once

#include <tuple>

#include "merge/merge_shape.h"

namespace fattn {

// merge_cuda.cpp:
std::tuple<Tensor, Tensor> launch_merge(const char* op, const MergeShape& m, Tensor outs, Tensor lses);
// merge_cpu.cpp:
std::tuple<Tensor, Tensor> merge_on_cpu(const MergeShape& m, const Tensor& outs, const Tensor& lses);

}  // namespace fattn
