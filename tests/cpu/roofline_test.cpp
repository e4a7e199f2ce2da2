// The roofline's two sides: the problem's minimum bytes (Problem::io_bytes),
// the matmul ceiling, the measured copy ceiling and its override, and the
// GB/s figures the metrics read against it. The rules that read runs against
// them (`bound`, `split-kv`) are decode_rules_test.cpp's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "analysis/findings.h"
#include "analysis/metrics.h"
#include "analysis/rules.h"
#include "attnprof/runner.h"
#include "findings_lookup.h"
#include "report/json.h"

namespace attnprof {
namespace {

using testing::by_rule;
using testing::dump;

Problem problem(std::int64_t batch, std::int64_t heads, std::int64_t kv_heads, std::int64_t seq, std::int64_t kv_seq,
                std::int64_t head_dim, DType dtype, MaskKind mask) {
  Problem p;
  p.batch = batch;
  p.heads = heads;
  p.kv_heads = kv_heads;
  p.seq = seq;
  p.kv_seq = kv_seq;
  p.head_dim = head_dim;
  p.dtype = dtype;
  p.mask = mask;
  p.normalize().validate();
  return p;
}

// ---- Problem::io_bytes: the least a call must move.

TEST(IoBytes, ContiguousForwardReadsQkvAndWritesO) {
  // Q and O: 2*4*128*64 fp16 = 131072 bytes each; K and V: 2*4*256*64*2 = 262144 each.
  const Problem p = problem(2, 4, 4, 128, 256, 64, DType::F16, MaskKind::None);
  EXPECT_EQ(p.q_bytes(), 131072u);
  EXPECT_EQ(p.kv_bytes(), 262144u);
  EXPECT_EQ(p.kv_rows_read(), 256);
  EXPECT_EQ(p.io_bytes(), 2 * 131072u + 2 * 262144u);
  // Causal bottom-right with kv_seq > seq: every key is seen by the last row.
  EXPECT_EQ(problem(2, 4, 4, 128, 256, 64, DType::F16, MaskKind::CausalBottomRight).io_bytes(), 786432u);
}

TEST(IoBytes, GroupedQueryAttentionReadsOnlyTheSharedKvHeads) {
  // One K/V head for four query heads: K and V are 2*1*256*64*2 = 65536 bytes each.
  const Problem p = problem(2, 4, 1, 128, 256, 64, DType::F16, MaskKind::None);
  EXPECT_EQ(p.io_bytes(), 2 * 131072u + 2 * 65536u);
}

TEST(IoBytes, PagedCacheCountsTheRowsReadNotThePaddingAndTheBlockTable) {
  // kv_seq 100 in pages of 16: 7 pages per sequence, the last with 12 rows of
  // padding that are never read. Q and O: 2*4*1*64 bf16 = 1024 bytes each;
  // K and V: 100 rows of 2*2 heads x 64 bf16 = 51200 bytes each; the block
  // table: 2 sequences x 7 pages x 4 bytes = 56.
  Problem p = problem(2, 4, 2, 1, 100, 64, DType::BF16, MaskKind::CausalBottomRight);
  const std::size_t contiguous = p.io_bytes();
  EXPECT_EQ(contiguous, 1024u + 2 * 51200u + 1024u);
  p.kv_cache = KvCache::Paged;
  p.page_size = 16;
  p.validate();
  ASSERT_EQ(p.pages_per_seq(), 7);
  EXPECT_EQ(p.io_bytes(), contiguous + 56);
  EXPECT_GT(p.kv_page_bytes(), p.kv_bytes()) << "the cache holds the padding; the traffic does not";
}

TEST(IoBytes, KeysNoQuerySeesAreNotRead) {
  // A sliding window of 128 over a 4096-key cache, one query: 128 rows of K and V.
  Problem w = problem(1, 8, 8, 1, 4096, 128, DType::BF16, MaskKind::CausalBottomRight);
  w.mask = MaskKind::SlidingWindow;
  w.window = 128;
  w.validate();
  EXPECT_EQ(w.kv_rows_read(), 128);
  const std::size_t row = 8 * 128 * 2;  // one key row over the K/V heads, bf16
  EXPECT_EQ(w.io_bytes(), row + 2 * 128 * row + row);
  // Top-left causal with 4 queries over 16 keys: only keys 0..3 are seen.
  EXPECT_EQ(problem(1, 1, 1, 4, 16, 32, DType::F32, MaskKind::Causal).kv_rows_read(), 4);
  // A Boolean mask or a bias is read once at [S, Skv].
  const Problem none = problem(2, 4, 4, 128, 256, 64, DType::F16, MaskKind::None);
  EXPECT_EQ(problem(2, 4, 4, 128, 256, 64, DType::F16, MaskKind::Boolean).io_bytes(), none.io_bytes() + 128 * 256);
  EXPECT_EQ(problem(2, 4, 4, 128, 256, 64, DType::F16, MaskKind::Bias).io_bytes(), none.io_bytes() + 128 * 256 * 2);
}

TEST(IoBytes, BackwardAndTrainCountWhatAFusedBackwardMustMove) {
  Problem p = problem(2, 4, 4, 128, 256, 64, DType::F16, MaskKind::None);
  const std::size_t q = 131072, kv = 262144, lse = 2 * 4 * 128 * 4;
  EXPECT_EQ(p.lse_bytes(), lse);
  // Read Q, O, dO, K, V and the log-sum-exp; write dQ, dK, dV.
  p.pass = Pass::Backward;
  EXPECT_EQ(p.io_bytes(), 3 * q + 2 * kv + lse + q + 2 * kv);
  EXPECT_EQ(p.io_bytes(), 1576960u);
  // The forward (which also writes the log-sum-exp), then the backward.
  p.pass = Pass::Train;
  EXPECT_EQ(p.io_bytes(), (2 * q + 2 * kv) + lse + 1576960u);
  EXPECT_EQ(p.io_bytes(), 2367488u);
}

// ---- The copy ceiling: measured once, or given.

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~ScopedEnv() { ::unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

// A runtime that is only a device (ceiling_tflops reads nothing else of it
// when the environment gives the figure): CUDA's, in a build without it.
class DeviceOnly final : public DeviceRuntime {
 public:
  explicit DeviceOnly(Device d) : device_(d) {}
  Device device() const override { return device_; }
  Allocator& allocator() override { return cpu_allocator(); }
  std::int64_t available_bytes() const override { return 0; }
  Inputs upload(const Inputs& host) override { return host; }
  Tensor upload(const Tensor& host) override { return host; }
  Tensor download(const Tensor& t) override { return t; }
  void poison(Tensor&) override {}
  double ceiling_tflops(DType) override { throw std::logic_error("measured: the environment was not read"); }
  double copy_bandwidth_gbs() override { return 0; }
  std::string description() const override { return "device only"; }

 private:
  Device device_;
};

// ATTNPROF_CEILING_TFLOPS is the 16-bit ceiling; fp8 on CUDA is held to twice
// it (e4m3's tensor-core rate), every other dtype, and fp8 on the CPU (which
// multiplies e4m3 values as bf16 ones), to the figure itself.
TEST(MatmulCeiling, TheEnvironmentGivesThe16BitCeilingAndFp8TwiceOnCuda) {
  const ScopedEnv matmul("ATTNPROF_CEILING_TFLOPS", "774");
  DeviceRuntime& rt = device_runtime(Device::Cpu);
  EXPECT_DOUBLE_EQ(ceiling_tflops(rt, DType::BF16), 774);
  EXPECT_DOUBLE_EQ(ceiling_tflops(rt, DType::F16), 774);
  EXPECT_DOUBLE_EQ(ceiling_tflops(rt, DType::F32), 774);
  EXPECT_DOUBLE_EQ(ceiling_tflops(rt, DType::F8E4M3), 774);
  DeviceOnly cuda(Device::Cuda);
  EXPECT_DOUBLE_EQ(ceiling_tflops(cuda, DType::BF16), 774);
  EXPECT_DOUBLE_EQ(ceiling_tflops(cuda, DType::F8E4M3), 2 * 774);
}

// Measured, the CPU's fp8 ceiling is its bf16 one (the same products).
TEST(MatmulCeiling, TheCpusFp8CeilingIsItsBf16One) {
  DeviceRuntime& rt = device_runtime(Device::Cpu);
  EXPECT_EQ(rt.ceiling_tflops(DType::F8E4M3), rt.ceiling_tflops(DType::BF16));
}

TEST(CopyCeiling, TheCpuRuntimeMeasuresAPositiveFigureOnce) {
  DeviceRuntime& rt = device_runtime(Device::Cpu);
  const double gbs = rt.copy_bandwidth_gbs();
  EXPECT_GT(gbs, 0.1);
  EXPECT_LT(gbs, 1e5) << "a host memcpy beyond 100 TB/s is a timing error";
  EXPECT_EQ(rt.copy_bandwidth_gbs(), gbs) << "measured once, then cached";
  std::printf("[ info ] CPU copy ceiling %.1f GB/s (read + written)\n", gbs);
}

RunResult tiny_cpu_run() {
  const Problem p = [] {
    Problem q = problem(1, 2, 2, 64, 64, 32, DType::F32, MaskKind::Causal);
    q.device = Device::Cpu;
    return q;
  }();
  RunOptions o;
  o.schedule = Schedule{.wait = 0, .warmup = 1, .active = 2, .repeat = 1};
  o.threads = 1;
  o.check_rows = 16;
  return run_backend(*find_backend("flash", Device::Cpu), p, o);
}

TEST(CopyCeiling, TheEnvironmentOverrideWinsAndTheMetricsReadAgainstIt) {
  const ScopedEnv copy("ATTNPROF_COPY_GBS", "1234.5");
  const ScopedEnv matmul("ATTNPROF_CEILING_TFLOPS", "2");
  RunResult r = tiny_cpu_run();
  ASSERT_FALSE(r.failure) << *r.failure;
  const Metrics& m = r.metrics;
  ASSERT_TRUE(m.copy_ceiling_gbs && m.ceiling_tflops && m.gbs && m.copy_ceiling_pct && m.device_time_us);
  EXPECT_DOUBLE_EQ(*m.copy_ceiling_gbs, 1234.5);
  EXPECT_DOUBLE_EQ(*m.ceiling_tflops, 2);
  EXPECT_NEAR(*m.gbs, static_cast<double>(r.problem.io_bytes()) / (*m.device_time_us * 1e-6) / 1e9, 1e-9 * *m.gbs);
  EXPECT_NEAR(*m.copy_ceiling_pct, *m.gbs / 1234.5 * 100, 1e-9 * *m.copy_ceiling_pct);

  // The JSON carries both sides, the ceilings and the problem's bytes.
  std::vector<RunResult> all{r};
  all[0].findings = analysis::findings(all[0], all, {});
  const nlohmann::json j = report::result_json(all[0]);
  EXPECT_DOUBLE_EQ(j["gbs"].get<double>(), *m.gbs);
  EXPECT_DOUBLE_EQ(j["copy_ceiling_pct"].get<double>(), *m.copy_ceiling_pct);
  EXPECT_DOUBLE_EQ(j["copy_ceiling_gbs"].get<double>(), 1234.5);
  EXPECT_DOUBLE_EQ(j["ceiling_tflops"].get<double>(), 2);
  EXPECT_EQ(report::problem_json(r.problem)["io_bytes"].get<std::size_t>(), r.problem.io_bytes());
  // A CPU run on a known ceiling pair gets its roofline finding.
  EXPECT_TRUE(by_rule(all[0].findings, "bound")) << dump(all[0].findings);
}

// An override that is not a number is refused in one line naming it, never ignored (the run would then
// report a measured ceiling the user thinks they replaced) nor read in part ("5x" as 5).
TEST(CopyCeiling, AnUnreadableOverrideIsRefusedByName) {
  for (const char* bad : {"fast", "5x", "0", "-3", "1e999"}) {
    const ScopedEnv copy("ATTNPROF_COPY_GBS", bad);
    const RunResult r = tiny_cpu_run();
    ASSERT_TRUE(r.failure) << bad;
    EXPECT_EQ(r.failure->rfind("ATTNPROF_COPY_GBS", 0), 0u) << *r.failure;
    EXPECT_EQ(r.failure->find('\n'), std::string::npos) << *r.failure;
  }
  const ScopedEnv empty("ATTNPROF_COPY_GBS", "");  // empty: unset, the measurement
  const RunResult r = tiny_cpu_run();
  ASSERT_FALSE(r.failure) << *r.failure;
  EXPECT_EQ(*r.metrics.copy_ceiling_gbs, device_runtime(Device::Cpu, 1).copy_bandwidth_gbs());
}

TEST(CopyCeiling, TheDeviceJsonKeepsThePeakAndTheMeasuredApart) {
  DeviceProperties d;
  d.name = "NVIDIA H200";
  d.memory_bandwidth_gbs = 4800;
  nlohmann::json j = report::device_json("H200", d, Device::Cuda);
  EXPECT_DOUBLE_EQ(j["memory_bandwidth_gbs"].get<double>(), 4800);
  EXPECT_TRUE(j["copy_bandwidth_gbs"].is_null()) << "not measured";
  d.copy_bandwidth_gbs = 4200;
  j = report::device_json("H200", d, Device::Cuda);
  EXPECT_DOUBLE_EQ(j["memory_bandwidth_gbs"].get<double>(), 4800);
  EXPECT_DOUBLE_EQ(j["copy_bandwidth_gbs"].get<double>(), 4200);
}

}  // namespace
}  // namespace attnprof
