// fattn for C++ LibTorch programs: typed calls to the torch.ops.fattn operators.
//
// Link libfattn.so (CMake: find_package(fattn) + target_link_libraries(app fattn::fattn)).
// The operators are registered by libfattn.so's static initializers when it loads; the
// program never calls into it directly, only through the dispatcher. So that a linker run
// with --as-needed (the default on Ubuntu) does not drop it, this header refers to a
// function the library exports, which keeps libfattn.so a dependency of every program
// that calls fattn::forward.
//
// Layout (the flash-attn convention): q, k, v are [batch, seqlen, heads, head_dim], any
// strides with a contiguous last dim; k and v may have fewer heads than q (GQA/MQA, q's
// heads a multiple of theirs). CUDA takes float16/bfloat16; CPU also float32/float64.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <tuple>

// Defined by libfattn.so (csrc/runtime/build_info.cpp): the kernel table as JSON.
extern "C" const char* fattn_build_info_json();

namespace fattn {

namespace detail {
// Reading a volatile pointer to a libfattn.so function is a reference the compiler
// cannot drop, and costs one load per call.
inline void keep_library_linked() {
  static const char* (*volatile const anchor)() = &fattn_build_info_json;
  (void)anchor;
}
}  // namespace detail

// Attention of q over k, v: softmax(q k^T * softmax_scale) v per head.
// Returns (out, lse): out [batch, seqlen_q, heads, head_dim] in q's dtype, lse float32
// [batch, heads, seqlen_q] (natural log of the softmax denominator, -inf for a row that
// attends to nothing). softmax_scale defaults to 1/sqrt(head_dim). With causal and
// seqlen_q != seqlen_k the mask is aligned to the bottom-right corner: query i sees keys
// j <= i + seqlen_k - seqlen_q, so a decode step's single query sees the whole cache.
// Inference only: autograd for the operator is registered by the Python package.
inline std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& q, const at::Tensor& k,
                                                  const at::Tensor& v,
                                                  std::optional<double> softmax_scale = std::nullopt,
                                                  bool causal = false) {
  detail::keep_library_linked();
  // Schema: forward(Tensor q, Tensor k, Tensor v, float? softmax_scale=None,
  //                 bool causal=False, bool deterministic=False) -> (Tensor out, Tensor lse)
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("fattn::forward", "")
          .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                    const at::Tensor&, std::optional<double>,
                                                    bool, bool)>();
  // `deterministic` only matters to the backward, which C++ callers do not run.
  return op.call(q, k, v, softmax_scale, causal, /*deterministic=*/false);
}

}  // namespace fattn
