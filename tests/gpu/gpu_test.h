// What every GPU test file needs: whether a CUDA device is usable, and the
// skip that CTest reports (the SKIP_REGULAR_EXPRESSION in tests/CMakeLists.txt)
// when it is not.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

namespace attnprof::testing {

inline bool has_gpu() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  cudaGetLastError();  // clear the error a machine without a driver leaves
  return ok;
}

}  // namespace attnprof::testing

#define REQUIRE_GPU() \
  if (!::attnprof::testing::has_gpu()) GTEST_SKIP() << "no CUDA device"
