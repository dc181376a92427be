// The current CUDA stream of a device, asked of torch at run time.
//
// aoti_torch_get_current_cuda_stream lives in libtorch_cuda, which a CPU-only
// torch does not have; resolving it with dlsym (not by linking) lets one build
// load under CPU torch and launch on torch's stream under CUDA torch.
#pragma once

namespace fattn::runtime {

void* current_cuda_stream(int device_index);

}  // namespace fattn::runtime
