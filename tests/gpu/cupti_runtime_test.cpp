// The CUDA runtime and the CUPTI collector on a real device: allocator
// accounting, launches through both APIs with their correlations and
// occupancy, copies, the shared clock, and the device-event fallback.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "attnprof/error.h"
#include "attnprof/profiler.h"
#include "attnprof/runner.h"
#include "backends/cuda/caching_allocator.h"
#include "backends/cuda/cuda_backends.h"
#include "cupti_test_kernels.h"
#include "gpu_test.h"
#include "profiler/cupti/cupti_collector.h"
#include "profiler/cupti/event_timing_collector.h"

namespace attnprof {
namespace {

constexpr std::int64_t kMiB = 1 << 20;

TEST(CachingAllocator, StatsPeakAndReuse) {
  REQUIRE_GPU();
  cuda::CachingAllocator a;
  void* small = a.allocate(1000);
  EXPECT_EQ(a.stats().allocated, 1024);  // rounded to 512 B
  void* big = a.allocate(3 * kMiB);
  EXPECT_EQ(a.stats().allocated, 1024 + 4 * kMiB);  // rounded to 2 MiB
  EXPECT_EQ(a.stats().reserved, 1024 + 4 * kMiB);

  a.deallocate(big, 3 * kMiB);
  EXPECT_EQ(a.stats().allocated, 1024);
  EXPECT_EQ(a.stats().reserved, 1024 + 4 * kMiB) << "a freed block stays cached";
  EXPECT_EQ(a.stats().peak_allocated, 1024 + 4 * kMiB);
  EXPECT_EQ(a.cached_bytes(), 4 * kMiB);

  void* again = a.allocate(3 * kMiB + 100);
  EXPECT_EQ(again, big) << "same rounded size: the cached block comes back";
  EXPECT_EQ(a.stats().reserved, 1024 + 4 * kMiB);

  a.deallocate(again, 3 * kMiB + 100);
  a.deallocate(small, 1000);
  EXPECT_EQ(a.stats().allocated, 0);
  a.reset_peak();
  EXPECT_EQ(a.stats().peak_allocated, 0);
  a.release_cached();
  EXPECT_EQ(a.stats().reserved, 0);
}

TEST(CachingAllocator, OutOfMemoryLeavesNothing) {
  REQUIRE_GPU();
  cuda::CachingAllocator a;
  a.deallocate(a.allocate(8 * kMiB), 8 * kMiB);  // something cached, to be released on the retry
  const MemoryStats before = a.stats();
  try {
    a.allocate(std::size_t{10} << 40);  // 10 TiB
    FAIL() << "10 TiB was granted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::OutOfMemory);
    EXPECT_NE(std::string(e.what()).find("CUDA out of memory allocating"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("smaller batch"), std::string::npos) << e.what();
  }
  EXPECT_EQ(a.stats().allocated, before.allocated);
  EXPECT_EQ(a.stats().reserved, 0) << "the cache was released before the retry";
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the failed cudaMalloc left an error behind";
  void* p = a.allocate(kMiB);  // the allocator still works
  a.deallocate(p, kMiB);
}

TEST(CudaRuntime, UploadKeepsStridesAndPoisonIsNaN) {
  REQUIRE_GPU();
  DeviceRuntime& rt = cuda::runtime();
  // A [B, S, H, D] buffer viewed as [B, H, S, D]: a transpose of metadata.
  Tensor bshd = Tensor::empty({2, 5, 3, 4}, DType::F32, cpu_allocator());
  for (std::int64_t i = 0; i < bshd.numel(); ++i) bshd.data_as<float>()[i] = static_cast<float>(i) * 0.5f;
  Inputs host;
  host.q = bshd.transpose(1, 2);
  host.k = host.q;
  host.v = host.q;
  Tensor mask = Tensor::empty({1, 1, 5, 5}, DType::Bool, cpu_allocator());
  for (std::int64_t i = 0; i < 25; ++i) mask.data_as<std::uint8_t>()[i] = (i % 5) <= (i / 5);
  host.mask = mask.expand({2, 3, 5, 5});

  const Inputs dev = rt.upload(host);
  ASSERT_EQ(dev.q.device(), Device::Cuda);
  EXPECT_EQ(dev.q.strides(), host.q.strides());
  EXPECT_EQ(dev.mask.strides(), host.mask.strides()) << "expanded masks stay expanded";
  const Tensor back = rt.download(dev.q);
  const Tensor mask_back = rt.download(dev.mask);
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t h = 0; h < 3; ++h)
      for (std::int64_t s = 0; s < 5; ++s) {
        for (std::int64_t d = 0; d < 4; ++d) ASSERT_EQ(back.get(b, h, s, d), host.q.get(b, h, s, d));
        for (std::int64_t j = 0; j < 5; ++j) ASSERT_EQ(mask_back.get(b, h, s, j), host.mask.get(b, h, s, j));
      }

  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    Tensor out = Tensor::empty({1, 2, 3, 4}, t, rt.allocator());
    rt.poison(out);
    const Tensor seen = rt.download(out);
    for (std::int64_t i = 0; i < 3; ++i) EXPECT_TRUE(std::isnan(seen.get(0, 1, i, 3))) << dtype_name(t);
  }
  EXPECT_GT(rt.available_bytes(), 0);
  EXPECT_NE(rt.description().find("CUDA runtime"), std::string::npos) << rt.description();
  ASSERT_TRUE(rt.properties().has_value());
  EXPECT_GT(rt.properties()->num_sms, 0);
}

TEST(CudaRuntime, CeilingIsMeasuredOncePerDtype) {
  REQUIRE_GPU();
  DeviceRuntime& rt = cuda::runtime();
  const double bf16 = rt.ceiling_tflops(DType::BF16);
  EXPECT_GT(bf16, 10.0);
  EXPECT_EQ(rt.ceiling_tflops(DType::BF16), bf16) << "cached, not re-measured";
  EXPECT_GT(bf16, rt.ceiling_tflops(DType::F32)) << "tensor cores beat FP32 SGEMM";
}

const Activity* find(const std::vector<Activity>& all, ActivityType type, const std::string& name,
                     std::uint64_t correlation = 0) {
  for (const Activity& a : all) {
    if (a.type == type && a.name.find(name) != std::string::npos && (!correlation || a.correlation == correlation)) {
      return &a;
    }
  }
  return nullptr;
}

TEST(CuptiCollector, RuntimeAndDriverLaunchesCopiesAndClock) {
  REQUIRE_GPU();
  DeviceRuntime& rt = cuda::runtime();
  auto stream = static_cast<cudaStream_t>(rt.stream());
  float* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, 2 * kMiB), cudaSuccess);
  float* copy = out + kMiB / sizeof(float);
  attnprof_test::launch_with_runtime(out, stream);  // load the module before the window
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);

  cupti::CuptiCollector c;
  try {
    c.start();
  } catch (const Error& e) {
    cudaFree(out);
    FAIL() << "CUPTI could not start: " << e.what();
  }
  const std::int64_t t0 = now_ns();
  attnprof_test::launch_with_runtime(out, stream);
  attnprof_test::launch_with_driver(out, stream);
  ASSERT_EQ(cudaMemcpyAsync(copy, out, kMiB, cudaMemcpyDeviceToDevice, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const std::int64_t t1 = now_ns();
  c.stop();
  std::vector<Activity> all;
  c.drain(all);
  cudaFree(out);
  ASSERT_FALSE(all.empty());
  EXPECT_TRUE(c.device_properties().has_value());

  const Activity* rt_launch = find(all, ActivityType::CudaRuntime, "cudaLaunchKernel");
  ASSERT_NE(rt_launch, nullptr) << "no cudaLaunchKernel record";
  EXPECT_EQ(rt_launch->tid, static_cast<std::int64_t>(::syscall(SYS_gettid))) << "CUPTI thread id not mapped";
  EXPECT_EQ(rt_launch->pid, static_cast<std::int64_t>(::getpid()));
  const Activity* k1 = find(all, ActivityType::Kernel, "touch_shared(float*)", rt_launch->correlation);
  ASSERT_NE(k1, nullptr) << "no kernel correlated with cudaLaunchKernel (demangled name expected)";

  // The runtime may call the driver internally too; take the cuLaunchKernelEx
  // record that launched a kernel other than k1.
  const Activity* drv_launch = nullptr;
  const Activity* k2 = nullptr;
  for (const Activity& a : all) {
    if (a.type != ActivityType::CudaDriver || a.name != "cuLaunchKernelEx") continue;
    const Activity* k = find(all, ActivityType::Kernel, "touch_shared", a.correlation);
    if (k && k != k1) drv_launch = &a, k2 = k;
  }
  ASSERT_NE(drv_launch, nullptr) << "no cuLaunchKernelEx record correlated with a kernel";

  for (const Activity* k : {k1, k2}) {
    ASSERT_TRUE(k->kernel.has_value());
    EXPECT_EQ(k->kernel->grid[0], attnprof_test::kTestGrid);
    EXPECT_EQ(k->kernel->block[0], attnprof_test::kTestBlock);
    EXPECT_EQ(k->kernel->dynamic_shared_bytes, attnprof_test::kTestDynamicShared);
    EXPECT_GT(k->kernel->registers_per_thread, 0);
    ASSERT_TRUE(k->kernel->occupancy_pct.has_value());
    EXPECT_GT(*k->kernel->occupancy_pct, 0.0) << "64 KiB opted-in shared memory must not read as 0%";
    EXPECT_LE(*k->kernel->occupancy_pct, 100.0);
    EXPECT_GT(k->kernel->blocks_per_sm.value_or(0), 0.0);
    EXPECT_GT(k->kernel->warps_per_sm.value_or(0), 0.0);
    EXPECT_GE(k->stream, 0);
    EXPECT_GT(k->dur_ns, 0);
  }

  const Activity* memcpy_call = find(all, ActivityType::CudaRuntime, "cudaMemcpyAsync");
  ASSERT_NE(memcpy_call, nullptr);
  const Activity* m = find(all, ActivityType::Memcpy, "Memcpy DtoD", memcpy_call->correlation);
  ASSERT_NE(m, nullptr) << "no DtoD memcpy correlated with cudaMemcpyAsync";
  ASSERT_TRUE(m->transfer.has_value());
  EXPECT_EQ(m->transfer->kind, "DtoD");
  EXPECT_EQ(m->transfer->bytes, kMiB);

  // One clock: host calls fall inside the host window exactly; GPU times go
  // through CUPTI's interpolation, so allow it 100 us.
  constexpr std::int64_t kSlack = 100'000;
  for (const Activity* a : {rt_launch, drv_launch, memcpy_call}) {
    EXPECT_GE(a->start_ns, t0) << a->name;
    EXPECT_LE(a->end_ns(), t1) << a->name;
  }
  for (const Activity* a : {k1, k2, m}) {
    EXPECT_GE(a->start_ns, t0 - kSlack) << a->name;
    EXPECT_LE(a->end_ns(), t1 + kSlack) << a->name;
  }
  EXPECT_GE(k2->start_ns, k1->end_ns() - kSlack) << "same stream: in launch order";
}

// stop() detaches CUPTI from the process; the next start() attaches it again,
// with the shared clock, and records only its own window.
TEST(CuptiCollector, CollectsAgainAfterDetaching) {
  REQUIRE_GPU();
  ::unsetenv("ATTNPROF_CUPTI_STAY_ATTACHED");
  DeviceRuntime& rt = cuda::runtime();
  auto stream = static_cast<cudaStream_t>(rt.stream());
  float* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, kMiB), cudaSuccess);
  attnprof_test::launch_with_runtime(out, stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  for (int round = 0; round < 3; ++round) {
    cupti::CuptiCollector c;
    try {
      c.start();
    } catch (const Error& e) {
      cudaFree(out);
      FAIL() << "round " << round << ": CUPTI could not start: " << e.what();
    }
    EXPECT_TRUE(cupti::attached()) << "round " << round;
    const std::int64_t t0 = now_ns();
    for (int i = 0; i <= round; ++i) attnprof_test::launch_with_driver(out, stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const std::int64_t t1 = now_ns();
    c.stop();
    EXPECT_TRUE(c.note().empty()) << "round " << round << ": " << c.note();
    EXPECT_FALSE(cupti::attached()) << "round " << round << ": CUPTI still loaded after stop()";
    // Between collections, with CUPTI detached.
    attnprof_test::launch_with_runtime(out, stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<Activity> all;
    c.drain(all);
    int kernels = 0;
    for (const Activity& a : all) {
      if (a.type != ActivityType::Kernel) continue;
      ++kernels;
      EXPECT_GE(a.start_ns, t0 - 100'000) << "round " << round << ": kernel off the shared clock";
      EXPECT_LE(a.end_ns(), t1 + 100'000) << "round " << round;
    }
    EXPECT_EQ(kernels, round + 1) << "round " << round;
    EXPECT_NE(find(all, ActivityType::CudaDriver, "cuLaunchKernelEx"), nullptr) << "round " << round;
    EXPECT_EQ(find(all, ActivityType::CudaRuntime, "cudaLaunchKernel"), nullptr) << "round " << round;
  }
  cudaFree(out);
}

TEST(EventTimingCollector, OneSpanPerRecordedForward) {
  REQUIRE_GPU();
  DeviceRuntime& rt = cuda::runtime();
  float* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, kMiB), cudaSuccess);
  Schedule schedule;
  schedule.wait = 0;
  schedule.warmup = 1;
  schedule.active = 2;
  schedule.repeat = 1;
  Profiler prof(schedule);
  prof.add_collector(std::make_unique<cupti::EventTimingCollector>(rt.stream(), "test: CUPTI off"));
  prof.start();
  for (int s = 0; s < schedule.total_steps(); ++s) {
    {
      RecordFunction fwd("forward", {}, {}, ActivityType::UserAnnotation);
      attnprof_test::launch_with_runtime(out, static_cast<cudaStream_t>(rt.stream()));
      rt.synchronize();
    }
    prof.step();
  }
  prof.stop();
  cudaFree(out);

  int spans = 0;
  for (const Activity& a : prof.trace().activities) {
    if (a.type != ActivityType::GpuUserAnnotation) continue;
    ++spans;
    EXPECT_EQ(a.name, "forward (device events)");
    EXPECT_GT(a.dur_ns, 0);
    EXPECT_GE(a.step, 1) << "the warmup step is not recorded";
  }
  EXPECT_EQ(spans, 2);
  EXPECT_NE(prof.trace().collector_note.find("CUPTI unavailable (test: CUPTI off): GPU time from device events"),
            std::string::npos)
      << prof.trace().collector_note;
}

TEST(CudaRuntime, AllocationsReachTheProfiler) {
  REQUIRE_GPU();
  DeviceRuntime& rt = cuda::runtime();
  Schedule schedule;
  schedule.warmup = 0;
  schedule.active = 1;
  Profiler prof(schedule);
  prof.observe(rt.allocator());
  prof.start();
  { Tensor t = Tensor::empty({1, 1, 256, 256}, DType::F32, rt.allocator()); }
  prof.step();
  prof.stop();
  int allocs = 0, frees = 0;
  for (const Activity& a : prof.trace().activities) {
    if (a.type != ActivityType::Allocation || !a.allocation || a.allocation->device_type != 1) continue;
    (a.allocation->bytes > 0 ? allocs : frees)++;
  }
  EXPECT_EQ(allocs, 1);
  EXPECT_EQ(frees, 1);
}

}  // namespace
}  // namespace attnprof
