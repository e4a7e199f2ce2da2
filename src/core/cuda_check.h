// Error checks for CUDA runtime, cuBLAS and CUPTI calls: every failure becomes
// Error(ErrorKind::Device) naming the call, the file and the line, so a report
// says which library refused what instead of a bare status number.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "attnprof/error.h"

namespace attnprof::cuda::detail {

[[noreturn]] inline void throw_device_error(const char* library, const std::string& status, const char* expr,
                                            const char* file, int line) {
  throw Error(ErrorKind::Device,
              std::string(library) + " error " + status + " in " + expr + " at " + file + ":" + std::to_string(line));
}

inline void check_cuda(cudaError_t status, const char* expr, const char* file, int line) {
  if (status != cudaSuccess) {
    throw_device_error("CUDA", std::string(cudaGetErrorName(status)) + " (" + cudaGetErrorString(status) + ")", expr,
                       file, line);
  }
}

inline void check_cublas(cublasStatus_t status, const char* expr, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw_device_error("cuBLAS", std::string(cublasGetStatusName(status)) + " (" + cublasGetStatusString(status) + ")",
                       expr, file, line);
  }
}

}  // namespace attnprof::cuda::detail

#define ATTNPROF_CUDA_CHECK(expr) ::attnprof::cuda::detail::check_cuda((expr), #expr, __FILE__, __LINE__)
#define ATTNPROF_CUBLAS_CHECK(expr) ::attnprof::cuda::detail::check_cublas((expr), #expr, __FILE__, __LINE__)

// CUPTI is only included by the collector; the macro expands to a call it
// provides, so this header does not drag cupti.h into every backend.
#define ATTNPROF_CUPTI_CHECK(expr)                                                                                  \
  do {                                                                                                              \
    const CUptiResult attnprof_cupti_status_ = (expr);                                                              \
    if (attnprof_cupti_status_ != CUPTI_SUCCESS) {                                                                  \
      const char* attnprof_cupti_msg_ = nullptr;                                                                    \
      cuptiGetResultString(attnprof_cupti_status_, &attnprof_cupti_msg_);                                           \
      ::attnprof::cuda::detail::throw_device_error("CUPTI", attnprof_cupti_msg_ ? attnprof_cupti_msg_ : "?", #expr, \
                                                   __FILE__, __LINE__);                                             \
    }                                                                                                               \
  } while (0)
