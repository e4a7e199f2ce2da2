// Factories of the CUDA backends and the CUDA runtime (one file per backend in
// this folder). Only compiled into CUDA builds; dispatch is the one caller.
#pragma once

#include <memory>

#include "attnprof/backend.h"
#include "attnprof/device_runtime.h"

namespace attnprof::cuda {

std::unique_ptr<Backend> make_naive();          // naive.cu
std::unique_ptr<Backend> make_naive_inplace();  // naive_inplace.cu
std::unique_ptr<Backend> make_math();           // math.cu
std::unique_ptr<Backend> make_efficient();      // efficient.cu
std::unique_ptr<Backend> make_flash();          // flash.cu
std::unique_ptr<Backend> make_cudnn();          // cudnn.cpp (null when built without cuDNN)

// The CUDA device runtime: caching allocator, stream, CUPTI collector,
// upload/download. Throws Error(Unsupported) when no GPU is usable.
DeviceRuntime& runtime();  // runtime.cpp

}  // namespace attnprof::cuda
