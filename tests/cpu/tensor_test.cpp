// Tensors and views, and the tracked CPU allocator with its profiler events.
#include "attnprof/tensor.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/dtype.h"
#include "attnprof/error.h"
#include "attnprof/problem.h"
#include "attnprof/profiler.h"
#include "attnprof/reference.h"

namespace attnprof {
namespace {

// ---------------------------------------------------------------- tensors

TEST(Tensor, EmptyIsContiguousRowMajor) {
  Tensor t = Tensor::empty({2, 3, 5, 7}, DType::BF16, cpu_allocator());
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.sizes(), (Dims{2, 3, 5, 7}));
  EXPECT_EQ(t.strides(), (Dims{105, 35, 7, 1}));
  EXPECT_EQ(t.numel(), 210);
  EXPECT_EQ(t.nbytes(), 420u);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_TRUE(t.rows_contiguous());
  EXPECT_EQ(t.device(), Device::Cpu);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data()) % 64, 0u);
  EXPECT_FALSE(Tensor().defined());
  EXPECT_THROW(Tensor::empty({1, -1, 1, 1}, DType::F32, cpu_allocator()), Error);
}

TEST(Tensor, FromBlobViewsForeignMemoryWithoutAllocatingOrFreeing) {
  std::vector<float> buf(2 * 4 * 3 * 5);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i);
  const std::int64_t before = cpu_allocator().stats().allocated;
  {
    // A [B, S, H, D] buffer viewed as [B, H, S, D], as a Python caller's BSHD tensor arrives.
    Tensor t = Tensor::from_blob(buf.data(), {2, 3, 4, 5}, {60, 5, 15, 1}, DType::F32, Device::Cpu);
    EXPECT_TRUE(t.defined());
    EXPECT_EQ(t.data(), buf.data());
    EXPECT_EQ(t.device(), Device::Cpu);
    EXPECT_FALSE(t.is_contiguous());
    EXPECT_EQ(t.get(1, 2, 3, 4), buf[60 + 3 * 15 + 2 * 5 + 4]);
    t.set(0, 1, 2, 3, -1.0f);
    EXPECT_EQ(buf[2 * 15 + 1 * 5 + 3], -1.0f);
    EXPECT_EQ(cpu_allocator().stats().allocated, before);
    Tensor v = t.transpose(1, 2);  // views of a view share the borrowed storage
    EXPECT_EQ(v.data(), buf.data());
    EXPECT_TRUE(v.is_contiguous());
  }
  EXPECT_EQ(cpu_allocator().stats().allocated, before);  // nothing freed that it did not own
  EXPECT_EQ(buf[0], 0.0f);
  // A device pointer is never dereferenced by a view: its device is recorded.
  EXPECT_EQ(Tensor::from_blob(buf.data(), {1, 1, 1, 4}, {4, 4, 4, 1}, DType::F32, Device::Cuda).device(), Device::Cuda);
  EXPECT_THROW(Tensor::from_blob(nullptr, {1, 1, 1, 1}, {1, 1, 1, 1}, DType::F32, Device::Cpu), Error);
  EXPECT_THROW(Tensor::from_blob(buf.data(), {1, 1, 2, 2}, {4, 4, -2, 1}, DType::F32, Device::Cpu), Error);
  EXPECT_THROW(Tensor::from_blob(buf.data(), {1, -1, 2, 2}, {4, 4, 2, 1}, DType::F32, Device::Cpu), Error);
}

TEST(Tensor, TransposeIsAViewOfTheSameStorage) {
  Tensor t = Tensor::empty({2, 3, 4, 5}, DType::F32, cpu_allocator());
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = static_cast<float>(i);
  Tensor v = t.transpose(1, 2);
  EXPECT_EQ(v.sizes(), (Dims{2, 4, 3, 5}));
  EXPECT_EQ(v.strides(), (Dims{60, 5, 20, 1}));
  EXPECT_EQ(v.data(), t.data());
  EXPECT_FALSE(v.is_contiguous());
  EXPECT_TRUE(v.rows_contiguous());
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t h = 0; h < 3; ++h)
      for (std::int64_t s = 0; s < 4; ++s)
        for (std::int64_t d = 0; d < 5; ++d) ASSERT_EQ(v.get(b, s, h, d), t.get(b, h, s, d));
  v.set(1, 2, 0, 4, -7.0f);  // a write through the view lands in the original
  EXPECT_EQ(t.get(1, 0, 2, 4), -7.0f);
  EXPECT_TRUE(v.transpose(1, 2).is_contiguous());
  Tensor last = t.transpose(2, 3);
  EXPECT_FALSE(last.rows_contiguous());
  EXPECT_EQ(last.stride(3), 5);
}

TEST(Tensor, ExpandBroadcastsSizeOneDimsWithStrideZero) {
  Tensor m = Tensor::empty({1, 1, 3, 4}, DType::F32, cpu_allocator());
  for (std::int64_t i = 0; i < 12; ++i) m.data_as<float>()[i] = static_cast<float>(i + 1);
  Tensor e = m.expand({2, 5, 3, 4});
  EXPECT_EQ(e.sizes(), (Dims{2, 5, 3, 4}));
  EXPECT_EQ(e.strides(), (Dims{0, 0, 4, 1}));
  EXPECT_EQ(e.data(), m.data());
  EXPECT_FALSE(e.is_contiguous());
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t h = 0; h < 5; ++h) EXPECT_EQ(e.get(b, h, 2, 3), 12.0f);
  try {
    (void)m.expand({1, 1, 6, 4});
    FAIL() << "expanding a dimension of size 3 to 6 must fail";
  } catch (const Error& err) {
    EXPECT_EQ(err.kind(), ErrorKind::InvalidArgument);
  }
}

TEST(Tensor, AsStridedWithOffset) {
  Tensor t = Tensor::empty({1, 1, 4, 8}, DType::F32, cpu_allocator());
  for (std::int64_t i = 0; i < 32; ++i) t.data_as<float>()[i] = static_cast<float>(i);
  // Every other column starting at column 1.
  Tensor s = t.as_strided({1, 1, 4, 4}, {32, 32, 8, 2}, 1);
  EXPECT_EQ(static_cast<float*>(s.data()), t.data_as<float>() + 1);
  EXPECT_EQ(s.get(0, 0, 2, 3), 2 * 8 + 1 + 2 * 3);
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_FALSE(s.rows_contiguous());
  EXPECT_EQ(s.nbytes(), 64u);
  EXPECT_EQ(t.describe(), "fp32[1, 1, 4, 8]");
  EXPECT_NE(s.describe().find("strides [32, 32, 8, 2]"), std::string::npos);
}

TEST(Tensor, ViewsKeepTheStorageAlive) {
  const std::int64_t before = cpu_allocator().stats().allocated;
  Tensor v;
  {
    Tensor t = Tensor::empty({1, 1, 16, 16}, DType::F32, cpu_allocator());
    t.set(0, 0, 3, 4, 9.0f);
    v = t.transpose(2, 3);
  }
  EXPECT_EQ(cpu_allocator().stats().allocated, before + 1024);
  EXPECT_EQ(v.get(0, 0, 4, 3), 9.0f);
  v = Tensor();
  EXPECT_EQ(cpu_allocator().stats().allocated, before);
}

// ---------------------------------------------------------------- allocator

TEST(Allocator, TracksAllocatedAndPeak) {
  Allocator& a = cpu_allocator();
  a.reset_peak();
  const MemoryStats s0 = a.stats();
  EXPECT_EQ(s0.peak_allocated, s0.allocated);
  std::int64_t after_first = 0;
  {
    Tensor x = Tensor::empty({1, 1, 10, 100}, DType::F32, a);  // 4000 bytes, rounded up to 64: 4032
    after_first = a.stats().allocated;
    EXPECT_EQ(after_first - s0.allocated, 4032);
    {
      Tensor y = Tensor::empty({1, 1, 1, 1}, DType::Bool, a);  // 1 byte, rounded to 64
      EXPECT_EQ(a.stats().allocated - s0.allocated, 4032 + 64);
      EXPECT_EQ(a.stats().peak_allocated - s0.allocated, 4032 + 64);
    }
    EXPECT_EQ(a.stats().allocated, after_first);
    EXPECT_EQ(a.stats().peak_allocated - s0.allocated, 4096);  // the peak stays
  }
  const MemoryStats s1 = a.stats();
  EXPECT_EQ(s1.allocated, s0.allocated);
  EXPECT_EQ(s1.peak_allocated - s0.allocated, 4096);
  EXPECT_GE(s1.reserved, s1.allocated);
  a.reset_peak();
  EXPECT_EQ(a.stats().peak_allocated, s0.allocated);
  {
    Tensor z = Tensor::empty({1, 1, 1, 64}, DType::F32, a);
    EXPECT_EQ(a.stats().peak_allocated - s0.allocated, 256);
  }
}

TEST(Allocator, ProfilerRecordsAllocationEventsWithRunningTotals) {
  Allocator& a = cpu_allocator();
  Profiler prof(Schedule{.wait = 0, .warmup = 1, .active = 1, .repeat = 1});
  prof.observe(a);
  prof.start();
  {  // step 0 is warmup: nothing recorded
    Tensor unseen = Tensor::empty({1, 1, 1, 1000}, DType::F32, a);
  }
  prof.step();
  ASSERT_TRUE(prof.recording());
  const std::int64_t base = a.stats().allocated;
  void* p1 = nullptr;
  void* p2 = nullptr;
  {
    Tensor x = Tensor::empty({1, 1, 1, 256}, DType::F32, a);  // 1024 bytes
    Tensor y = Tensor::empty({1, 1, 1, 32}, DType::F32, a);   // 128 bytes
    p1 = x.data();
    p2 = y.data();
  }  // y freed first, then x
  prof.step();
  prof.stop();
  std::vector<AllocationInfo> events;
  for (const Activity& ev : prof.trace().activities) {
    if (ev.type != ActivityType::Allocation) continue;
    ASSERT_TRUE(ev.allocation.has_value());
    EXPECT_EQ(ev.step, 1);
    EXPECT_EQ(ev.dur_ns, 0);
    events.push_back(*ev.allocation);
  }
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].bytes, 1024);
  EXPECT_EQ(events[1].bytes, 128);
  EXPECT_EQ(events[2].bytes, -128);
  EXPECT_EQ(events[3].bytes, -1024);
  EXPECT_EQ(events[0].addr, reinterpret_cast<std::uint64_t>(p1));
  EXPECT_EQ(events[1].addr, reinterpret_cast<std::uint64_t>(p2));
  EXPECT_EQ(events[2].addr, events[1].addr);
  EXPECT_EQ(events[3].addr, events[0].addr);
  EXPECT_EQ(events[0].total_allocated, base + 1024);
  EXPECT_EQ(events[1].total_allocated, base + 1152);
  EXPECT_EQ(events[2].total_allocated, base + 1024);
  EXPECT_EQ(events[3].total_allocated, base);
  for (const auto& e : events) {
    EXPECT_GE(e.peak_allocated, base + 1152);
    EXPECT_GE(e.total_reserved, e.total_allocated);
    EXPECT_EQ(e.device_type, 0);
  }
}

}  // namespace
}  // namespace attnprof
