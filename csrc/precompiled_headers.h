// torch's stable-ABI headers, compiled once per build and put before every source file of the
// library (setup.py's Objects, CMakeLists.txt's target_precompile_headers): they are about half
// of a typical object's compile time. Only headers that every source may see belong here.
#ifndef FATTN_PRECOMPILED_HEADERS_H
#define FATTN_PRECOMPILED_HEADERS_H

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#endif
