// The two implementations of fattn::decode, given the arguments decode_op.cpp has checked (and
// the shape it found): the CUDA launches and the CPU's float64 definition. Each checks what only
// its device can: the CPU the device values (check_decode_values), CUDA its kernels' limits.
#pragma once

#include <tuple>

#include "decode/decode_shape.h"

namespace fattn {

// decode_cuda.cpp:
std::tuple<Tensor, Tensor> launch_decode(const DecodeShape& s, const DecodeInputs& in);
// decode_cpu.cpp:
std::tuple<Tensor, Tensor> decode_on_cpu(const DecodeShape& s, const DecodeInputs& in);

}  // namespace fattn
