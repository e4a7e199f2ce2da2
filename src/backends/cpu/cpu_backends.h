// Factories of the CPU backends, their ops and the CPU runtime.
#pragma once

#include <memory>

#include "attnprof/backend.h"
#include "attnprof/device_runtime.h"
#include "backends/ops.h"

namespace attnprof::cpu {

std::unique_ptr<Backend> make_flash();  // flash.cpp
// The ops naive, naive_inplace and math (backends/composite/) run on the CPU,
// one object per backend (ops.cpp).
std::unique_ptr<Ops> make_ops();

// The CPU as a profiling device: the tracked allocator, OpenMP and OpenBLAS
// thread counts (0 = all cores), a measured sgemm ceiling (runtime.cpp).
DeviceRuntime& runtime(int threads);

}  // namespace attnprof::cpu
