// Factories of the CPU backends (one file per backend in this folder).
#pragma once

#include <memory>

#include "attnprof/backend.h"
#include "attnprof/device_runtime.h"

namespace attnprof::cpu {

std::unique_ptr<Backend> make_naive();          // naive.cpp
std::unique_ptr<Backend> make_naive_inplace();  // naive.cpp (the same ops, the fill in place)
std::unique_ptr<Backend> make_math();           // math.cpp
std::unique_ptr<Backend> make_flash();          // flash.cpp

// The CPU as a profiling device: the tracked allocator, OpenMP and OpenBLAS
// thread counts (0 = all cores), a measured sgemm ceiling (runtime.cpp).
DeviceRuntime& runtime(int threads);

}  // namespace attnprof::cpu
