// The roofline's two sides and what limits a run: the problem's minimum
// bytes (Problem::io_bytes), the measured copy ceiling and its override, the
// GB/s figures the metrics read against it, the `bound` rule on both sides of
// the ridge, and the `split-kv` rule on hand-made decode traces.
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
#include "backends/cuda/fused_params.h"
#include "findings_lookup.h"
#include "report/json.h"
#include "synthetic_trace.h"

namespace attnprof {
namespace {

using testing::by_rule;
using testing::dump;

using testing::attention_trace;
using testing::host;
using T = ActivityType;

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

TEST(CopyCeiling, AnUnreadableOverrideFallsBackToTheMeasurement) {
  const ScopedEnv copy("ATTNPROF_COPY_GBS", "fast");
  const RunResult r = tiny_cpu_run();
  ASSERT_FALSE(r.failure) << *r.failure;
  ASSERT_TRUE(r.metrics.copy_ceiling_gbs);
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

// ---- Decode traces: a split kernel and, when the keys are split, a combine.

struct Decode {
  int splits = 8, rows = 32, batch = 4;  // the split kernel's grid
  std::int64_t split_ns = 40'000;
  std::int64_t combine_ns = 4'000;  // 0: no combine kernel
  int calls = 2;
};

// `calls` forwards 100 us apart, each launching the split kernel at +10 us
// and the combine straight after it, on one stream: the device time per call
// is split_ns + combine_ns.
Trace decode_trace(const Decode& d) {
  Trace t = attention_trace();  // for its device (132 SMs) and base time
  t.activities.clear();
  std::uint64_t corr = 1;
  for (int c = 0; c < d.calls; ++c) {
    const std::int64_t at = std::int64_t{c} * 100'000;
    t.activities.push_back(host(T::UserAnnotation, "ProfilerStep#" + std::to_string(c), at, 90'000, 0));
    t.activities.push_back(host(T::UserAnnotation, "forward", at + 1'000, 80'000, 1));
    t.activities.push_back(host(T::CudaRuntime, "cudaLaunchKernel", at + 2'000, 3'000, 2, corr));
    Activity split = testing::device(
        T::Kernel, "void attnprof::cuda::flash_decode_splitkv_kernel<DecodeCfg<128>, __nv_bfloat16, false>",
        at + 10'000, d.split_ns, corr++);
    split.kernel = KernelInfo{.grid = {d.splits, d.rows, d.batch}, .block = {128, 1, 1}, .registers_per_thread = 96};
    t.activities.push_back(split);
    if (d.combine_ns > 0) {
      t.activities.push_back(host(T::CudaRuntime, "cudaLaunchKernel", at + 6'000, 3'000, 2, corr));
      Activity combine = testing::device(T::Kernel, "void attnprof::cuda::flash_decode_combine_kernel<128, float>",
                                         at + 10'000 + d.split_ns, d.combine_ns, corr++);
      combine.kernel = KernelInfo{.grid = {256, 1, 1}, .block = {128, 1, 1}};
      t.activities.push_back(combine);
    }
  }
  std::stable_sort(t.activities.begin(), t.activities.end(),
                   [](const Activity& a, const Activity& b) { return a.start_ns < b.start_ns; });
  t.steps_recorded = d.calls;
  return t;
}

// Decode on an H200-like device: batch 4, 32 query heads over 8 K/V heads,
// one query against 4096 keys, head dim 128, bf16.
Problem decode_problem() {
  Problem p = problem(4, 32, 8, 1, 4096, 128, DType::BF16, MaskKind::CausalBottomRight);
  p.device = Device::Cuda;
  return p;
}

RunResult decode_run(const Decode& d, double ceiling_tflops = 774, double copy_gbs = 4200) {
  RunResult r;
  r.backend = "flash";
  r.problem = decode_problem();
  r.eligibility.eligible = true;
  // What the CUDA flash backend declares of its decode kernel.
  r.traits = {.max_kv_splits = cuda::kFlashDecodeMaxSplits, .kv_split_keys = cuda::kFlashDecodeKeys};
  r.trace = decode_trace(d);
  r.metrics = analysis::measure(r.trace, r.problem, ceiling_tflops, copy_gbs);
  return r;
}

TEST(SplitKv, ReportsSplitsCtasAndTheCombineShare) {
  const RunResult r = decode_run({});
  ASSERT_EQ(r.metrics.steps, 2);
  ASSERT_TRUE(r.metrics.device_time_us);
  EXPECT_DOUBLE_EQ(*r.metrics.device_time_us, 44);
  const auto fs = analysis::findings(r, {r}, {});
  const Finding* f = by_rule(fs, "split-kv");
  ASSERT_TRUE(f) << dump(fs);
  EXPECT_EQ(f->text,
            "split-KV decode: 8 splits (grid 8 x 32 x 4, 1024 CTAs on 132 SMs); combine kernel 4.0 us per forward, "
            "9.1% of the device time");
  EXPECT_EQ(f->severity, Severity::Info);
  EXPECT_DOUBLE_EQ(f->figures.at("splits"), 8);
  EXPECT_DOUBLE_EQ(f->figures.at("ctas"), 1024);
  EXPECT_DOUBLE_EQ(f->figures.at("sms"), 132);
  EXPECT_DOUBLE_EQ(f->figures.at("split_kernels_per_forward"), 1);
  EXPECT_DOUBLE_EQ(f->figures.at("combine_kernels_per_forward"), 1);
  EXPECT_DOUBLE_EQ(f->figures.at("combine_us_per_forward"), 4);
  EXPECT_NEAR(f->figures.at("combine_share_pct"), 4.0 / 44 * 100, 1e-12);
  ASSERT_EQ(f->evidence.size(), 2u);
  EXPECT_NE(f->evidence[0].name.find("flash_decode_splitkv_kernel"), std::string::npos);
  EXPECT_NE(f->evidence[1].name.find("flash_decode_combine_kernel"), std::string::npos);
}

TEST(SplitKv, FlagsACombineAboveFifteenPercentOfTheDeviceTime) {
  const RunResult r = decode_run({.combine_ns = 10'000});  // 10 of 50 us: 20%
  const auto fs = analysis::findings(r, {r}, {});
  const Finding* f = by_rule(fs, "split-kv");
  ASSERT_TRUE(f) << dump(fs);
  EXPECT_EQ(f->severity, Severity::Warning);
  EXPECT_NEAR(f->figures.at("combine_share_pct"), 20, 1e-12);
  EXPECT_NE(f->text.find("combine kernel 10.0 us per forward, 20.0% of the device time; the combine is over 15% of the "
                         "device time: fewer splits"),
            std::string::npos)
      << f->text;
  // 14% stays a report.
  const RunResult ok = decode_run({.split_ns = 43'000, .combine_ns = 7'000});
  const auto ok_fs = analysis::findings(ok, {ok}, {});
  const Finding* g = by_rule(ok_fs, "split-kv");
  ASSERT_TRUE(g);
  EXPECT_EQ(g->severity, Severity::Info) << g->text;
}

TEST(SplitKv, FlagsSplitsThatLeaveSmsIdle) {
  // One split: 1 x 8 x 2 = 16 CTAs for 132 SMs, and rightly no combine.
  const RunResult r = decode_run({.splits = 1, .rows = 8, .batch = 2, .combine_ns = 0});
  const auto fs = analysis::findings(r, {r}, {});
  const Finding* f = by_rule(fs, "split-kv");
  ASSERT_TRUE(f) << dump(fs);
  EXPECT_EQ(f->text,
            "split-KV decode: 1 split (grid 1 x 8 x 2, 16 CTAs on 132 SMs); no combine (one split writes O itself); 16 "
            "CTAs leave 116 of the 132 SMs idle: more splits would fill them");
  EXPECT_EQ(f->severity, Severity::Warning);
  EXPECT_DOUBLE_EQ(f->figures.at("idle_sms"), 116);
  EXPECT_DOUBLE_EQ(f->figures.at("combine_kernels_per_forward"), 0);
  EXPECT_FALSE(f->figures.count("combine_share_pct"));
}

TEST(SplitKv, FromATraceThatDoesNotSayTheKeysPerSplitIdleSmsAreAMaybe) {
  // analyze on someone's trace: no backend traits, no problem (a 27-key
  // cache in transformers' generate() was told "more splits would fill them").
  RunResult r = decode_run({.splits = 1, .rows = 8, .batch = 2, .combine_ns = 0});
  r.traits = {};
  r.problem.kv_seq = 0;
  const auto fs = analysis::findings(r, {r}, {});
  const Finding* f = by_rule(fs, "split-kv");
  ASSERT_TRUE(f) << dump(fs);
  EXPECT_NE(f->text.find("16 CTAs leave 116 of the 132 SMs idle: more splits might fill them, where the keys allow"),
            std::string::npos)
      << f->text;
  EXPECT_EQ(f->severity, Severity::Info);
}

TEST(SplitKv, IdleSmsAreNoWarningWhenTheKeysAllowNoMoreSplits) {
  // 128 keys are 2 tiles of 64: 2 splits is all there is, however idle the SMs.
  RunResult r = decode_run({.splits = 2, .rows = 8, .batch = 2});
  r.problem.kv_seq = 128;
  const auto fs = analysis::findings(r, {r}, {});
  const Finding* f = by_rule(fs, "split-kv");
  ASSERT_TRUE(f) << dump(fs);
  EXPECT_NE(f->text.find("32 CTAs leave 100 of the 132 SMs idle: the 128 keys allow no more splits"), std::string::npos)
      << f->text;
  EXPECT_EQ(f->severity, Severity::Info);
  EXPECT_DOUBLE_EQ(f->figures.at("idle_sms"), 100);
}

TEST(SplitKv, FlagsAMissingOrAPointlessCombine) {
  const RunResult missing = decode_run({.splits = 4, .combine_ns = 0});
  const auto missing_fs = analysis::findings(missing, {missing}, {});
  const Finding* f = by_rule(missing_fs, "split-kv");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->severity, Severity::Warning);
  EXPECT_NE(f->text.find("4 splits"), std::string::npos) << f->text;
  EXPECT_NE(f->text.find("no combine kernel ran"), std::string::npos) << f->text;

  const RunResult pointless = decode_run({.splits = 1, .rows = 256});
  const auto pointless_fs = analysis::findings(pointless, {pointless}, {});
  f = by_rule(pointless_fs, "split-kv");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->severity, Severity::Warning);
  EXPECT_NE(f->text.find("a combine with one split merges nothing"), std::string::npos) << f->text;
}

TEST(SplitKv, SilentWithoutTheDecodeKernelsAndOnTheCpu) {
  RunResult r;
  r.backend = "naive";
  r.problem.device = Device::Cuda;
  r.eligibility.eligible = true;
  r.trace = attention_trace();
  r.metrics = analysis::measure(r.trace, r.problem, 774, 4200);
  auto fs = analysis::findings(r, {r}, {});
  EXPECT_FALSE(by_rule(fs, "split-kv")) << dump(fs);

  RunResult cpu = decode_run({});
  cpu.problem.device = Device::Cpu;
  fs = analysis::findings(cpu, {cpu}, {});
  EXPECT_FALSE(by_rule(fs, "split-kv")) << dump(fs);
}

TEST(SplitKv, WithoutDeviceInfoReportsTheCtasAndFlagsNoIdleSms) {
  RunResult r = decode_run({.splits = 1, .rows = 8, .batch = 2, .combine_ns = 0});
  r.trace.device.reset();
  const auto fs = analysis::findings(r, {r}, {});
  const Finding* f = by_rule(fs, "split-kv");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->text, "split-KV decode: 1 split (grid 1 x 8 x 2, 16 CTAs); no combine (one split writes O itself)");
  EXPECT_EQ(f->severity, Severity::Info);
}

// ---- Memory-bound or compute-bound.

TEST(Bound, DecodeIsMemoryBoundAndSaysHowCloseToTheCopyCeiling) {
  const RunResult r = decode_run({});  // 44 us per call
  const Problem& p = r.problem;
  // Q and O 4*32*128 bf16 = 32 KiB each; K and V 4*8*4096*128 bf16 = 32 MiB each.
  ASSERT_EQ(p.io_bytes(), 2 * 32768u + 2 * 33554432u);
  const double flops = 4.0 * 4 * 32 * 4096 * 128;
  ASSERT_DOUBLE_EQ(p.flops(), flops);
  const Metrics& m = r.metrics;
  ASSERT_TRUE(m.gbs && m.copy_ceiling_pct);
  const double gbs = 67174400.0 / 44e-6 / 1e9;  // 1526.7
  EXPECT_NEAR(*m.gbs, gbs, 1e-9 * gbs);
  EXPECT_NEAR(*m.copy_ceiling_pct, gbs / 4200 * 100, 1e-9);

  const auto fs = analysis::findings(r, {r}, {});
  const Finding* f = by_rule(fs, "bound");
  ASSERT_TRUE(f) << dump(fs);
  EXPECT_EQ(f->text,
            "memory-bound: 4.0 FLOP/byte against a ridge of 184; 1.5 TB/s moved, 36% of the measured copy ceiling "
            "(4.2 TB/s)");
  EXPECT_EQ(f->severity, Severity::Info);
  EXPECT_DOUBLE_EQ(f->figures.at("memory_bound"), 1);
  EXPECT_NEAR(f->figures.at("intensity_flop_per_byte"), flops / 67174400.0, 1e-12);
  EXPECT_NEAR(f->figures.at("ridge_flop_per_byte"), 774e12 / 4200e9, 1e-9);
  EXPECT_NEAR(f->figures.at("limit_pct"), gbs / 4200 * 100, 1e-9);
  EXPECT_DOUBLE_EQ(f->figures.at("io_bytes_per_forward"), 67174400);
}

TEST(Bound, LongPrefillIsComputeBoundAndSaysHowCloseToTheMatmulCeiling) {
  // The reference shape (8x16x1024x64, bf16, causal) in 160 us per forward.
  RunResult r;
  r.backend = "naive";
  r.problem.device = Device::Cuda;
  r.problem.normalize();
  r.eligibility.eligible = true;
  r.trace = attention_trace();
  r.metrics = analysis::measure(r.trace, r.problem, 774, 4200);
  const double flops = 4.0 * 8 * 16 * (1024.0 * 1025 / 2) * 64;
  ASSERT_DOUBLE_EQ(r.problem.flops(), flops);
  ASSERT_EQ(r.problem.io_bytes(), 4u * 8 * 16 * 1024 * 64 * 2);
  const auto fs = analysis::findings(r, {r}, {});
  const Finding* f = by_rule(fs, "bound");
  ASSERT_TRUE(f) << dump(fs);
  // 256 FLOP/byte; 17.2 GFLOP in 160 us is 107.5 TFLOP/s, 13.9% of 774.
  EXPECT_EQ(f->text,
            "compute-bound: 256 FLOP/byte against a ridge of 184; 107 TFLOP/s, 14% of the measured matmul ceiling "
            "(774 TFLOP/s)");
  EXPECT_DOUBLE_EQ(f->figures.at("memory_bound"), 0);
  EXPECT_NEAR(f->figures.at("limit_pct"), flops / 160e-6 / 1e12 / 774 * 100, 1e-9);
}

TEST(Bound, SilentWhereACeilingIsUnknownOrTheProblemIs) {
  for (const auto& [tflops, gbs] : std::vector<std::pair<double, double>>{{0, 4200}, {774, 0}, {0, 0}}) {
    const RunResult r = decode_run({}, tflops, gbs);
    EXPECT_EQ(r.metrics.ceiling_tflops.has_value(), tflops > 0);
    EXPECT_EQ(r.metrics.copy_ceiling_gbs.has_value(), gbs > 0);
    EXPECT_EQ(r.metrics.copy_ceiling_pct.has_value(), gbs > 0);
    EXPECT_TRUE(r.metrics.gbs) << "GB/s needs no ceiling";
    const auto fs = analysis::findings(r, {r}, {});
    EXPECT_FALSE(by_rule(fs, "bound")) << tflops << " / " << gbs << ": " << dump(fs);
  }
  // A trace read from a file: its problem is not known.
  RunResult read = decode_run({});
  read.source = "trace.json";
  EXPECT_FALSE(by_rule(analysis::findings(read, {read}, {}), "bound"));
}

TEST(Bound, AcrossGpusTheCeilingsAreEveryGpus) {
  RunResult r = decode_run({});
  r.trace.world_size = 2;
  r.metrics = analysis::measure(r.trace, r.problem, 774, 4200);
  ASSERT_TRUE(r.metrics.copy_ceiling_pct && r.metrics.gbs);
  EXPECT_NEAR(*r.metrics.copy_ceiling_pct, *r.metrics.gbs / 8400 * 100, 1e-9);
  const auto fs = analysis::findings(r, {r}, {});
  const Finding* f = by_rule(fs, "bound");
  ASSERT_TRUE(f);
  EXPECT_NE(f->text.find("18% of the measured copy ceiling (2 x 4.2 TB/s)"), std::string::npos) << f->text;
}

}  // namespace
}  // namespace attnprof
