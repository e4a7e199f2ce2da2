// A hand-built trace of one naive attention forward, shared by the writer
// tests: every number in it is chosen so the expected table can be worked out
// by hand (see the comments at each event).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "attnprof/activity.h"

namespace attnprof::testing {

inline constexpr std::int64_t kBase = 1'000'000'000;  // steady-clock ns of the first event
inline constexpr std::int64_t kPid = 4242;
inline constexpr std::int64_t kTid = 17;
inline constexpr std::int64_t kStream = 7;

inline Activity host(ActivityType type, std::string name, std::int64_t start, std::int64_t dur, int depth,
                     std::uint64_t correlation = 0) {
  Activity a;
  a.type = type;
  a.name = std::move(name);
  a.start_ns = kBase + start;
  a.dur_ns = dur;
  a.pid = kPid;
  a.tid = kTid;
  a.depth = depth;
  a.correlation = correlation;
  return a;
}

inline Activity device(ActivityType type, std::string name, std::int64_t start, std::int64_t dur,
                       std::uint64_t correlation) {
  Activity a;
  a.type = type;
  a.name = std::move(name);
  a.start_ns = kBase + start;
  a.dur_ns = dur;
  a.device = 0;
  a.stream = kStream;
  a.context = 1;
  a.correlation = correlation;
  a.external_id = correlation + 100;
  return a;
}

inline Activity allocation(std::int64_t start, std::int64_t bytes, std::int64_t total) {
  Activity a = host(ActivityType::Allocation, "[memory]", start, 0, 0);
  a.allocation = AllocationInfo{.bytes = bytes,
                                .addr = 0x7f0000000000ULL,
                                .total_allocated = total,
                                .total_reserved = 2 * total,
                                .peak_allocated = total,
                                .device_type = 1,
                                .device_id = 0};
  return a;
}

// Self CPU (us): ProfilerStep 100, forward 150, matmul 90+180, mul 40,
// masked_fill 110, copy_ 60, softmax 90, 4 cudaLaunchKernel 40,
// cudaMemcpyAsync 20, cuLaunchKernelEx 20: 900 in all.
// Device (us): gemm 30+30, mul 20, memcpy 40, fill 15, softmax 25: 160 in all.
inline Trace attention_trace() {
  using T = ActivityType;
  Trace t;
  t.name = "8_16_1024_64_naive";
  t.base_ns = kBase;
  t.steps_recorded = 1;
  t.device = DeviceProperties{.id = 0,
                              .name = "NVIDIA H200",
                              .total_global_mem = 150'000'000'000,
                              .compute_major = 9,
                              .compute_minor = 0,
                              .num_sms = 132,
                              .max_threads_per_sm = 2048,
                              .max_threads_per_block = 1024,
                              .max_blocks_per_sm = 32,
                              .regs_per_sm = 65536,
                              .regs_per_block = 65536,
                              .shared_mem_per_sm = 233472,
                              .shared_mem_per_block = 49152,
                              .shared_mem_per_block_optin = 232448,
                              .l2_cache_bytes = 52428800};
  auto& v = t.activities;
  v.push_back(host(T::UserAnnotation, "ProfilerStep#1", 0, 900'000, 0));
  v.push_back(host(T::UserAnnotation, "forward", 10'000, 800'000, 1));
  Activity mm = host(T::CpuOp, "matmul", 20'000, 100'000, 2);
  mm.input_dtypes = "bf16, bf16";
  mm.input_dims = "[8, 16, 1024, 64], [8, 16, 64, 1024]";
  v.push_back(mm);
  v.push_back(host(T::CudaRuntime, "cudaLaunchKernel", 30'000, 10'000, 3, 1));
  v.push_back(host(T::CpuOp, "mul", 130'000, 50'000, 2));
  v.push_back(host(T::CudaRuntime, "cudaLaunchKernel", 140'000, 10'000, 3, 2));
  v.push_back(host(T::CpuOp, "masked_fill", 200'000, 200'000, 2));
  v.push_back(allocation(205'000, 33'554'432, 100'663'296));
  v.push_back(host(T::CpuOp, "copy_", 210'000, 80'000, 3));
  v.push_back(host(T::CudaRuntime, "cudaMemcpyAsync", 220'000, 20'000, 4, 3));
  v.push_back(host(T::CudaRuntime, "cudaLaunchKernel", 300'000, 10'000, 3, 4));
  v.push_back(host(T::CpuOp, "softmax", 420'000, 100'000, 2));
  v.push_back(host(T::CudaRuntime, "cudaLaunchKernel", 430'000, 10'000, 3, 5));
  v.push_back(host(T::CpuOp, "matmul", 540'000, 200'000, 2));
  v.push_back(host(T::CudaDriver, "cuLaunchKernelEx", 550'000, 20'000, 3, 6));
  v.push_back(allocation(850'000, -33'554'432, 67'108'864));

  Activity gemm = device(T::Kernel, "ampere_bf16_s16816gemm_bf16_128x64", 45'000, 30'000, 1);
  gemm.kernel = KernelInfo{.grid = {64, 16, 8},
                           .block = {128, 1, 1},
                           .registers_per_thread = 128,
                           .static_shared_bytes = 0,
                           .dynamic_shared_bytes = 49152,
                           .blocks_per_sm = 2.0,
                           .warps_per_sm = 8.0,
                           .occupancy_pct = 12.5,
                           .queued_ns = 3000.0};
  v.push_back(gemm);
  Activity mul = device(T::Kernel, "elementwise_kernel<mul>", 155'000, 20'000, 2);
  mul.kernel = KernelInfo{};
  v.push_back(mul);
  Activity copy = device(T::Memcpy, "Memcpy DtoD (Device -> Device)", 245'000, 40'000, 3);
  copy.transfer = TransferInfo{.bytes = 33'554'432, .kind = "DtoD"};
  v.push_back(copy);
  v.push_back(device(T::Kernel, "masked_fill_kernel", 310'000, 15'000, 4));
  v.push_back(device(T::Kernel, "softmax_warp_forward", 445'000, 25'000, 5));
  Activity gemm2 = gemm;
  gemm2.start_ns = kBase + 575'000;
  gemm2.correlation = 6;
  v.push_back(gemm2);
  // As Profiler::stop() leaves them.
  std::stable_sort(v.begin(), v.end(), [](const Activity& a, const Activity& b) { return a.start_ns < b.start_ns; });
  return t;
}

}  // namespace attnprof::testing
