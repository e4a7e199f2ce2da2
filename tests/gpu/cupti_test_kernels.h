// A trivial kernel for the CUPTI tests, launched once through the runtime API
// (cudaLaunchKernel) and once through the driver API (cuLaunchKernelEx, the way
// cuDNN launches), both with 64 KiB of opted-in dynamic shared memory: the case
// Kineto's occupancy reports as 0%.
#pragma once

#include <cuda_runtime_api.h>

namespace attnprof_test {

inline constexpr int kTestGrid = 4;
inline constexpr int kTestBlock = 128;
inline constexpr int kTestDynamicShared = 64 * 1024;

// `out` holds kTestGrid * kTestBlock floats. Both throw attnprof::Error(Device).
void launch_with_runtime(float* out, cudaStream_t stream);
void launch_with_driver(float* out, cudaStream_t stream);

}  // namespace attnprof_test
