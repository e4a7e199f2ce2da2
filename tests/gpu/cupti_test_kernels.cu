#include <cuda.h>

#include <string>

#include "core/cuda_check.h"
#include "cupti_test_kernels.h"

// Driver-API errors in the same form as ATTNPROF_CUDA_CHECK's.
// The driver API is reached through the runtime's entry-point query, so this
// binary does not link libcuda and still starts (and skips) without a driver.
#define TEST_CU_CHECK(call)                                                                                         \
  do {                                                                                                              \
    const CUresult status_ = (call);                                                                                \
    if (status_ != CUDA_SUCCESS) {                                                                                  \
      ::attnprof::cuda::detail::throw_device_error("CUDA driver", std::to_string(static_cast<int>(status_)), #call, \
                                                   __FILE__, __LINE__);                                             \
    }                                                                                                               \
  } while (0)

namespace attnprof_test {
namespace {

__global__ void touch_shared(float* out) {
  extern __shared__ float smem[];
  smem[threadIdx.x] = static_cast<float>(threadIdx.x);
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = smem[blockDim.x - 1 - threadIdx.x];
}

void opt_in() {
  ATTNPROF_CUDA_CHECK(
      cudaFuncSetAttribute(touch_shared, cudaFuncAttributeMaxDynamicSharedMemorySize, kTestDynamicShared));
}

}  // namespace

void launch_with_runtime(float* out, cudaStream_t stream) {
  opt_in();
  void* args[] = {&out};
  ATTNPROF_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(touch_shared), dim3(kTestGrid), dim3(kTestBlock),
                                       args, kTestDynamicShared, stream));
}

void launch_with_driver(float* out, cudaStream_t stream) {
  opt_in();
  cudaFunction_t function = nullptr;
  ATTNPROF_CUDA_CHECK(cudaGetFuncBySymbol(&function, reinterpret_cast<const void*>(touch_shared)));
  CUlaunchConfig config{};
  config.gridDimX = kTestGrid;
  config.gridDimY = 1;
  config.gridDimZ = 1;
  config.blockDimX = kTestBlock;
  config.blockDimY = 1;
  config.blockDimZ = 1;
  config.sharedMemBytes = kTestDynamicShared;
  config.hStream = stream;
  void* args[] = {&out};
  using LaunchEx = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found{};
  ATTNPROF_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuLaunchKernelEx", &entry, 12000, cudaEnableDefault, &found));
  if (found != cudaDriverEntryPointSuccess || entry == nullptr) {
    ::attnprof::cuda::detail::throw_device_error("CUDA driver", "no entry point", "cuLaunchKernelEx", __FILE__,
                                                 __LINE__);
  }
  TEST_CU_CHECK(reinterpret_cast<LaunchEx>(entry)(&config, reinterpret_cast<CUfunction>(function), args, nullptr));
}

}  // namespace attnprof_test
