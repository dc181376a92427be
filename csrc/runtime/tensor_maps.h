// Host-made TMA maps: what a kernel's HOST_MAPS variants take in place of a tensor's pointer
// (the kernel spec's map_rows), encoded per call from the tensor and the box the kernel's entry
// recorded (MapBox).
#pragma once

#include <cstdint>

#include "runtime/cuda_driver.h"
#include "runtime/launch.h"

namespace fattn::runtime {

// A dense [batch, seqlen, heads, head_dim] tensor as its map covers it: sizes and strides in
// elements, outermost first (the last stride 1).
struct MapSource {
  const void* data;
  int64_t sizes[4];
  int64_t strides[4];
};

// What Triton's launch ABI passes for one map parameter, each field its own kernel parameter in
// this order: the CUtensorMap by value, then the map's shape (int32) and strides (int64, elements).
struct EncodedMap {
  cuda::CUtensorMap map;
  int32_t shape[4];
  int64_t strides[4];
};

// Whether this process's driver can encode maps (cuTensorMapEncodeTiled, from CUDA 12.0).
bool maps_supported();

// Whether a tensor's layout fits a map: 16-byte aligned data, the innermost stride 1, and every
// other dimension of more than one element a positive stride that is a multiple of 16 bytes.
bool fits_map(const MapSource& source, int element_bytes);

// `source` encoded with the box that `target`'s kernel recorded for its map `index`. Throws,
// naming the kernel and `param`, where the entry has no such map or the driver refuses it.
EncodedMap encode_map(const LaunchTarget& target, int index, const char* param, const MapSource& source);

// Throws unless `target`'s kernel takes `expected` maps and the caller gave them: a launcher
// called without the maps its chosen variant takes is the op's mistake, caught before the launch.
void require_maps(const LaunchTarget& target, bool given, int expected);

}  // namespace fattn::runtime
