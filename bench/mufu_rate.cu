// The special-function unit's rate per instruction on the GPU at hand: how
// many results a clock an SM gives for each MUFU instruction the soft-capped
// softmax could use (tanh and ex2 in f32, f16 and bf16 pairs, the
// reciprocal). The soft cap spends one tanh and one ex2 a score, so whether
// tanh costs what ex2 costs decides where its work should go.
//
//   nvcc -O3 -std=c++20 -arch=sm_90a -o mufu_rate bench/mufu_rate.cu && ./mufu_rate
//
// One CTA of 1024 threads an SM, each thread 8 independent chains of the
// instruction; the SM's clock64 measures each CTA's loop, so the figure is
// results an SM-clock whatever the clock runs at.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                               \
  do {                                                                         \
    cudaError_t e_ = (x);                                                      \
    if (e_ != cudaSuccess) {                                                   \
      std::fprintf(stderr, "mufu_rate: %s: %s\n", #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

enum Op { kEx2, kTanh, kTanhEx2, kRcp, kTanhF16x2, kEx2F16x2, kTanhBf16x2, kOps };
static const char* const kNames[kOps] = {"ex2.approx.ftz.f32",      "tanh.approx.f32",   "tanh + ex2 (f32, pairs)",
                                         "rcp.approx.ftz.f32 (+1)", "tanh.approx.f16x2", "ex2.approx.f16x2",
                                         "tanh.approx.bf16x2"};
// Results per instruction: 2 for the paired forms.
static const int kResults[kOps] = {1, 1, 1, 1, 2, 2, 2};

template <Op kOp>
__device__ __forceinline__ std::uint32_t step(std::uint32_t x) {
  std::uint32_t y;
  if constexpr (kOp == kEx2) {
    asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=r"(y) : "r"(x));
  } else if constexpr (kOp == kTanh) {
    asm volatile("tanh.approx.f32 %0, %1;" : "=r"(y) : "r"(x));
  } else if constexpr (kOp == kRcp) {
    // rcp(rcp(x)) would fold to x: each step takes 1 / (x + 1) (one FADD beside it).
    asm volatile("{\n.reg .f32 t;\nadd.f32 t, %1, 0f3F800000;\nrcp.approx.ftz.f32 %0, t;\n}" : "=r"(y) : "r"(x));
  } else if constexpr (kOp == kTanhF16x2) {
    asm volatile("tanh.approx.f16x2 %0, %1;" : "=r"(y) : "r"(x));
  } else if constexpr (kOp == kEx2F16x2) {
    asm volatile("ex2.approx.f16x2 %0, %1;" : "=r"(y) : "r"(x));
  } else {
    asm volatile("tanh.approx.bf16x2 %0, %1;" : "=r"(y) : "r"(x));
  }
  return y;
}

template <Op kOp>
__global__ void __launch_bounds__(1024, 1) rate_kernel(std::uint32_t* sink, long long* cycles, int iters) {
  std::uint32_t v[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = 0x3e800000u + threadIdx.x + i;  // about 0.25 (f32), small pairs (f16)
  __syncthreads();
  const long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if constexpr (kOp == kTanhEx2) {
        v[i] = i % 2 ? step<kEx2>(v[i]) : step<kTanh>(v[i]);
      } else {
        v[i] = step<kOp>(v[i]);
      }
    }
  }
  __syncthreads();
  const long long t1 = clock64();
  std::uint32_t acc = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) acc ^= v[i];
  if (acc == 0x12345678u) sink[threadIdx.x] = acc;  // keeps the chains live
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

template <Op kOp>
double measure(int sms, int iters, std::uint32_t* sink, long long* cycles) {
  rate_kernel<kOp><<<sms, 1024>>>(sink, cycles, iters / 10);  // warm-up
  CHECK(cudaGetLastError());
  rate_kernel<kOp><<<sms, 1024>>>(sink, cycles, iters);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  std::vector<long long> c(sms);
  CHECK(cudaMemcpy(c.data(), cycles, sms * sizeof(long long), cudaMemcpyDeviceToHost));
  long long worst = 0;
  for (long long x : c) worst = x > worst ? x : worst;
  return 1024.0 * 8.0 * iters * kResults[kOp] / static_cast<double>(worst);
}

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 4096;
  int dev = 0, sms = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, dev));
  std::uint32_t* sink = nullptr;
  long long* cycles = nullptr;
  CHECK(cudaMalloc(&sink, 1024 * sizeof(std::uint32_t)));
  CHECK(cudaMalloc(&cycles, sms * sizeof(long long)));
  std::printf("%s, %d SMs, %d iterations x 8 chains x 1024 threads a CTA, one CTA an SM\n", prop.name, sms, iters);
  std::printf("%-26s %s\n", "instruction", "results / SM clock");
  const double r[kOps] = {measure<kEx2>(sms, iters, sink, cycles),       measure<kTanh>(sms, iters, sink, cycles),
                          measure<kTanhEx2>(sms, iters, sink, cycles),   measure<kRcp>(sms, iters, sink, cycles),
                          measure<kTanhF16x2>(sms, iters, sink, cycles), measure<kEx2F16x2>(sms, iters, sink, cycles),
                          measure<kTanhBf16x2>(sms, iters, sink, cycles)};
  for (int op = 0; op < kOps; ++op) std::printf("%-26s %.2f\n", kNames[op], r[op]);
  CHECK(cudaFree(sink));
  CHECK(cudaFree(cycles));
  return 0;
}
