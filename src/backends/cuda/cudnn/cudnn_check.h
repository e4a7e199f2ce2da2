// cuDNN status checks, kept apart from check.h so that only the translation
// unit built against cuDNN includes cudnn.h.
#pragma once

#include <cudnn.h>

#include <string>

#include "core/cuda_check.h"

namespace attnprof::cuda::detail {

inline void check_cudnn(cudnnStatus_t status, const char* expr, const char* file, int line) {
  if (status != CUDNN_STATUS_SUCCESS) throw_device_error("cuDNN", cudnnGetErrorString(status), expr, file, line);
}

}  // namespace attnprof::cuda::detail

#define ATTNPROF_CUDNN_CHECK(expr) ::attnprof::cuda::detail::check_cudnn((expr), #expr, __FILE__, __LINE__)
