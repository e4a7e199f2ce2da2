// NCCL return codes as errors: ATTNPROF_NCCL_CHECK throws Error(Device) naming
// the call, NCCL's error string, the file and the line (as
// ATTNPROF_CUDA_CHECK in core/cuda_check.h does for CUDA).
#pragma once

#include <string>

#include "core/cuda_check.h"
#include "parallel/cuda/nccl_api.h"

namespace attnprof::parallel::detail {

inline void check_nccl(ncclResult_t status, const char* expr, const char* file, int line) {
  if (status != ncclSuccess) {
    std::string what = nccl().error_string(status);
    if (const char* last = nccl().last_error(nullptr); last && *last) what += std::string(": ") + last;
    ::attnprof::cuda::detail::throw_device_error("NCCL", what, expr, file, line);
  }
}

}  // namespace attnprof::parallel::detail

#define ATTNPROF_NCCL_CHECK(expr) ::attnprof::parallel::detail::check_nccl((expr), #expr, __FILE__, __LINE__)
