// Whether this build carries machine code (or PTX) that the current GPU can
// run: every kernel of attnprof_cuda is compiled for the same architectures,
// so one empty kernel answers for all of them.
#include <cuda_runtime.h>

#include <string>

#include "backends/cuda/arch_check.h"

namespace attnprof::cuda {
namespace {
__global__ void arch_probe_kernel() {}
}  // namespace

std::string arch_unsupported_reason() {
  cudaFuncAttributes attr{};
  const cudaError_t e = cudaFuncGetAttributes(&attr, arch_probe_kernel);
  if (e == cudaSuccess) return {};
  (void)cudaGetLastError();  // clear the sticky-free error so later calls are unaffected
  int device = 0, major = 0, minor = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  const std::string sm = std::to_string(major) + std::to_string(minor);
  return "this build has no kernels for this GPU (sm_" + sm + "): rebuild with -DATTNPROF_CUDA_ARCHITECTURES=\"" + sm +
         "\" (or include " + sm + ") [" + cudaGetErrorString(e) + "]";
}

}  // namespace attnprof::cuda
