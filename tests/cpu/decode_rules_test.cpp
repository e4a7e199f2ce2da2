// The rules that read a decode's trace, on hand-made ones (a split kernel
// and, when the keys are split, a combine): `split-kv` (the splits, the CTAs
// against the SMs, the combine's share) and `bound` (memory- or compute-bound
// on either side of the roofline's ridge, against the copy and matmul
// ceilings). The roofline's figures themselves are roofline_test.cpp's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "analysis/findings.h"
#include "analysis/metrics.h"
#include "analysis/rules.h"
#include "attnprof/runner.h"
#include "backends/cuda/fused_params.h"
#include "findings_lookup.h"
#include "synthetic_trace.h"

namespace attnprof {
namespace {

using testing::by_rule;
using testing::dump;

using testing::attention_trace;
using testing::host;
using T = ActivityType;

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
  Problem p;
  p.batch = 4;
  p.heads = 32;
  p.kv_heads = 8;
  p.seq = 1;
  p.kv_seq = 4096;
  p.head_dim = 128;
  p.dtype = DType::BF16;
  p.mask = MaskKind::CausalBottomRight;
  p.normalize().validate();
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

TEST(SplitKv, FlagsACombineAboveFifteenPercentThatOutlastsTheSplitKernel) {
  // The H100's 32 splits at batch 1 and 2048 keys: the combine 7.2 us after a 5.7 us split kernel (16 ran faster).
  const RunResult r = decode_run({.splits = 32, .rows = 8, .batch = 1, .split_ns = 5'700, .combine_ns = 7'200});
  const auto fs = analysis::findings(r, {r}, {});
  const Finding* f = by_rule(fs, "split-kv");
  ASSERT_TRUE(f) << dump(fs);
  EXPECT_EQ(f->severity, Severity::Warning);
  EXPECT_NEAR(f->figures.at("combine_share_pct"), 7.2 / 12.9 * 100, 1e-9);
  EXPECT_NE(f->text.find("combine kernel 7.2 us per forward, 55.8% of the device time; the combine is over 15% of the "
                         "device time and longer than the split kernel: fewer splits"),
            std::string::npos)
      << f->text;
  // Its 16 splits, the fastest count: a combine of 41%, shorter than the split kernel, is said and not flagged;
  // 128 CTAs leave 4 SMs idle, and one split more (8 CTAs) would not fit one an SM.
  const RunResult best = decode_run({.splits = 16, .rows = 8, .batch = 1, .split_ns = 6'500, .combine_ns = 4'500});
  const auto best_fs = analysis::findings(best, {best}, {});
  const Finding* g = by_rule(best_fs, "split-kv");
  ASSERT_TRUE(g) << dump(best_fs);
  EXPECT_EQ(g->severity, Severity::Info) << g->text;
  EXPECT_EQ(g->text,
            "split-KV decode: 16 splits (grid 16 x 8 x 1, 128 CTAs on 132 SMs); combine kernel 4.5 us per forward, "
            "40.9% of the device time; the combine is over 15% of the device time but shorter than the split kernel: "
            "mostly a second kernel's fixed cost, which fewer splits do not remove; 128 CTAs leave 4 of the 132 SMs "
            "idle: one split more (8 CTAs) would put two on some SMs");
  // 14% stays a report.
  const RunResult ok = decode_run({.split_ns = 43'000, .combine_ns = 7'000});
  const auto ok_fs = analysis::findings(ok, {ok}, {});
  const Finding* h = by_rule(ok_fs, "split-kv");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->severity, Severity::Info) << h->text;
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

  // Where the backend declared one kernel a forward, its last split merges (ATTNPROF_DECODE_FUSED_COMBINE=1).
  RunResult fused = decode_run({.splits = 4, .combine_ns = 0});
  fused.expectation.device_activities = 1;
  const auto fused_fs = analysis::findings(fused, {fused}, {});
  f = by_rule(fused_fs, "split-kv");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->severity, Severity::Info) << f->text;
  EXPECT_NE(f->text.find("no combine kernel: the last split of each tile merges them"), std::string::npos) << f->text;

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
