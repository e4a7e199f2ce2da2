// Factories of the CUDA backends, their ops and the CUDA runtime (one file per
// fused backend in this folder). Only compiled into the CUDA plugin; its entry
// point (src/plugin/cuda_plugin.cpp) is the one caller, the CPU side reaches them through it.
#pragma once

#include <memory>

#include "attnprof/backend.h"
#include "attnprof/device_runtime.h"
#include "backends/ops.h"

namespace attnprof::cuda {

// The ops naive, naive_inplace and math (backends/composite/) run on a CUDA
// device, one object per backend (ops_object.cpp).
std::unique_ptr<Ops> make_ops();
std::unique_ptr<Backend> make_efficient();  // efficient.cu
std::unique_ptr<Backend> make_flash();      // flash.cu
std::unique_ptr<Backend> make_cudnn();      // cudnn.cpp (null when built without cuDNN)

// The CUDA device runtime: caching allocator, stream, CUPTI collector,
// upload/download. Throws Error(Unsupported) when no GPU is usable.
DeviceRuntime& runtime();  // runtime.cpp

}  // namespace attnprof::cuda
