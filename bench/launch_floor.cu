// The host's floor under one attention call on the GPU at hand: what the CUDA
// runtime and driver alone take to launch a kernel, measured the way
// bench/python_overhead.py measures our calls (host time of back-to-back
// calls, the least of several medians), so that issue 56's host targets
// (C++ Plan::run at most 2 us) can be read against what no library can go
// under. Rows:
//   - an empty kernel, <<<1, 32>>> (the cheapest launch);
//   - an empty kernel with a parameter block the size of flash's (FwdArgs and
//     three TMA descriptors, about 600 bytes) over 132 CTAs of 384 threads,
//     through cudaLaunchKernelEx with programmatic stream serialization (PDL),
//     as flash's sm90 forward launches (kernels/fwd_launch.cuh);
//   - cudaGetDevice, which some launch paths call once a call.
//
//   nvcc -O2 -std=c++20 -arch=sm_90a -o launch_floor bench/launch_floor.cu && ./launch_floor
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                                       \
  do {                                                                                 \
    const cudaError_t e_ = (x);                                                        \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

namespace {

struct Big {
  unsigned char bytes[608];
};

__global__ void empty_kernel() {}
__global__ void big_kernel(Big b) {
  if (b.bytes[0] == 255 && threadIdx.x == 1000) asm volatile("trap;");
}

// The least of `rounds` medians of `calls` back-to-back calls of f, each timed alone (us).
template <class F>
double least_median(F&& f, int calls, int rounds, cudaStream_t s) {
  double best = 1e30;
  std::vector<double> us(static_cast<std::size_t>(calls));
  for (int r = 0; r < rounds; ++r) {
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < calls / 4; ++i) f();
    for (double& t : us) {
      const auto t0 = std::chrono::steady_clock::now();
      f();
      t = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    }
    CHECK(cudaStreamSynchronize(s));
    std::nth_element(us.begin(), us.begin() + calls / 2, us.end());
    best = std::min(best, us[static_cast<std::size_t>(calls / 2)]);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int calls = argc > 1 ? std::atoi(argv[1]) : 200;  // python_overhead.py's CUDA count: under the launch queue
  const int rounds = 5;
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  int driver = 0, runtime = 0;
  CHECK(cudaDriverGetVersion(&driver));
  CHECK(cudaRuntimeGetVersion(&runtime));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK(cudaFuncSetAttribute(big_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));

  const double empty = least_median([&] { empty_kernel<<<1, 32, 0, s>>>(); }, calls, rounds, s);
  Big big{};
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(prop.multiProcessorCount);
  config.blockDim = dim3(384);
  config.dynamicSmemBytes = 200 * 1024;
  config.stream = s;
  config.attrs = &attr;
  config.numAttrs = 1;
  const double pdl = least_median([&] { CHECK(cudaLaunchKernelEx(&config, big_kernel, big)); }, calls, rounds, s);
  config.numAttrs = 0;
  const double plain = least_median([&] { CHECK(cudaLaunchKernelEx(&config, big_kernel, big)); }, calls, rounds, s);
  int device = 0;
  const double get_device = least_median([&] { CHECK(cudaGetDevice(&device)); }, calls, rounds, s);
  CHECK(cudaGetLastError());
  CHECK(cudaStreamSynchronize(s));

  std::printf("%s, driver API %d, runtime %d; host time a call, the least of %d medians of %d calls\n\n", prop.name,
              driver, runtime, rounds, calls);
  std::printf("| launch | host us |\n|---|---|\n");
  std::printf("| empty kernel <<<1, 32>>> | %.2f |\n", empty);
  std::printf("| %zu-byte parameters, %d x 384, 200 KiB shared, cudaLaunchKernelEx + PDL | %.2f |\n", sizeof(Big),
              prop.multiProcessorCount, pdl);
  std::printf("| the same without PDL | %.2f |\n", plain);
  std::printf("| cudaGetDevice | %.3f |\n", get_device);
  CHECK(cudaStreamDestroy(s));
  return 0;
}
