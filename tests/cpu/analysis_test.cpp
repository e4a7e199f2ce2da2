// The analysis layer on hand-built traces: name normalisation, the trace
// index, the findings as records (ids, severities, evidence, figures) on a GPU
// trace and on a trace spelled as PyTorch's profiler spells it. The index and
// rules over a million events: analysis_scale_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "analysis/findings.h"
#include "analysis/metrics.h"
#include "analysis/normalize.h"
#include "analysis/rules.h"
#include "analysis/trace_index.h"
#include "findings_lookup.h"
#include "synthetic_trace.h"

namespace attnprof {
namespace {

using testing::by_rule;
using testing::dump;

using analysis::EventIndex;
using analysis::kNone;
using analysis::TraceIndex;
using testing::allocation;
using testing::attention_trace;
using testing::host;
using testing::kBase;
using T = ActivityType;

// ---- Normalisation

TEST(Normalize, PyTorchOpNames) {
  using analysis::normalize_op;
  EXPECT_EQ(normalize_op("aten::masked_fill"), "masked_fill");
  EXPECT_EQ(normalize_op("aten::masked_fill_"), "masked_fill_");
  EXPECT_EQ(normalize_op("aten::_safe_softmax"), "_safe_softmax");
  EXPECT_EQ(normalize_op("aten::_softmax"), "softmax");
  EXPECT_EQ(normalize_op("aten::softmax"), "softmax");
  EXPECT_EQ(normalize_op("aten::to"), "to");
  EXPECT_EQ(normalize_op("aten::_to_copy"), "to");
  EXPECT_EQ(normalize_op("aten::copy_"), "copy_");
  for (const char* mm : {"aten::mm", "aten::bmm", "aten::matmul", "aten::baddbmm", "aten::addmm"}) {
    EXPECT_EQ(normalize_op(mm), "matmul") << mm;
  }
  EXPECT_EQ(normalize_op("aten::ones"), "ones");
  EXPECT_EQ(normalize_op("aten::tril"), "tril");
  EXPECT_EQ(normalize_op("aten::where"), "where");
  // Our own spellings are already normalised.
  for (const char* ours : {"matmul", "mul", "masked_fill", "masked_fill_", "copy_", "softmax", "_safe_softmax", "to"}) {
    EXPECT_EQ(normalize_op(ours), ours);
  }
}

TEST(Normalize, PyTorchDtypeNames) {
  using analysis::normalize_dtype;
  for (const char* s : {"c10::BFloat16", "BFloat16", "bf16", "bfloat16", "torch.bfloat16"}) {
    EXPECT_EQ(normalize_dtype(s), "bf16") << s;
  }
  for (const char* s : {"c10::Half", "Half", "fp16", "float16"}) EXPECT_EQ(normalize_dtype(s), "fp16") << s;
  for (const char* s : {"c10::Float8_e4m3fn", "Float8_e4m3fn", "fp8"}) EXPECT_EQ(normalize_dtype(s), "fp8") << s;
  for (const char* s : {"float", "Float", "fp32", "float32"}) EXPECT_EQ(normalize_dtype(s), "fp32") << s;
  EXPECT_EQ(normalize_dtype("double"), "fp64");
  EXPECT_EQ(normalize_dtype("long int"), "int64");
  EXPECT_EQ(normalize_dtype("bool"), "bool");
  EXPECT_EQ(normalize_dtype("Scalar"), "scalar");
  EXPECT_EQ(normalize_dtype(""), "");
  // PyTorch's "Input type" list, blanks kept in place.
  EXPECT_EQ(analysis::normalize_dtypes("c10::BFloat16, Scalar, , float"), "bf16, scalar, , fp32");
  EXPECT_EQ(analysis::normalize_dtypes("bf16, bf16"), "bf16, bf16");
  EXPECT_EQ(analysis::first_dtype("fp32, bf16"), "fp32");
  EXPECT_EQ(analysis::first_dtype("bf16"), "bf16");
}

TEST(Normalize, OneFunctionPerActivity) {
  Activity op = host(T::CpuOp, "aten::bmm", 0, 10, 0);
  op.input_dtypes = "c10::Half, c10::Half";
  const auto n = analysis::normalize(op);
  EXPECT_EQ(n.op, "matmul");
  EXPECT_EQ(n.dtypes, "fp16, fp16");
  // Kernel names are the library's, never rewritten.
  Activity k = testing::device(T::Kernel, "aten::mm_kernel", 0, 10, 1);
  EXPECT_EQ(analysis::normalize(k).op, "aten::mm_kernel");
}

// ---- The index

EventIndex find(const TraceIndex& ix, ActivityType type, std::string_view name, int nth = 0) {
  const auto& v = ix.trace().activities;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (v[i].type == type && v[i].name == name && nth-- == 0) return static_cast<EventIndex>(i);
  }
  return kNone;
}

TEST(TraceIndex, RelatesLaunchesOpsForwardsAndSteps) {
  const Trace t = attention_trace();
  const TraceIndex ix(t);
  ASSERT_EQ(ix.forwards().size(), 1u);
  std::vector<std::string> ops;
  for (EventIndex i : ix.forward_ops(0)) ops.emplace_back(ix.op(i));
  EXPECT_EQ(ops, (std::vector<std::string>{"matmul", "mul", "masked_fill", "softmax", "matmul"}));

  const EventIndex step = find(ix, T::UserAnnotation, "ProfilerStep#1");
  const EventIndex fwd = find(ix, T::UserAnnotation, "forward");
  const EventIndex fill = find(ix, T::CpuOp, "masked_fill");
  const EventIndex copy = find(ix, T::CpuOp, "copy_");
  EXPECT_EQ(ix.parent(step), kNone);
  EXPECT_EQ(ix.parent(fwd), step);
  EXPECT_EQ(ix.parent(fill), fwd);
  EXPECT_EQ(ix.parent(copy), fill);
  EXPECT_EQ(ix.copy_owner(copy), fill);
  EXPECT_FALSE(ix.is_conversion_copy(copy));

  // The memcpy: launched by cudaMemcpyAsync inside copy_ inside masked_fill.
  const EventIndex memcpy = find(ix, T::Memcpy, "Memcpy DtoD (Device -> Device)");
  EXPECT_EQ(ix.launch_call(memcpy), find(ix, T::CudaRuntime, "cudaMemcpyAsync"));
  EXPECT_EQ(ix.launching_op(memcpy), copy);
  EXPECT_EQ(ix.launching_op(memcpy, /*outermost=*/true), fill);
  // The second GEMM: through the driver's extended launch.
  const EventIndex gemm2 = find(ix, T::Kernel, "ampere_bf16_s16816gemm_bf16_128x64", 1);
  EXPECT_EQ(ix.at(ix.launch_call(gemm2)).name, "cuLaunchKernelEx");
  EXPECT_EQ(ix.launching_op(gemm2), find(ix, T::CpuOp, "matmul", 1));

  EXPECT_EQ(ix.device_activities().size(), 6u);
  EXPECT_EQ(ix.forward_device(0).size(), 6u);
  EXPECT_EQ(ix.forward_of(memcpy), 0);
  EXPECT_EQ(ix.forward_of(copy), 0);
  EXPECT_EQ(ix.forward_of(step), -1);

  ASSERT_EQ(ix.profiler_steps().size(), 1u);
  EXPECT_EQ(ix.step_at(kBase + 500'000), 0);
  EXPECT_EQ(ix.step_at(kBase + 950'000), -1);
  EXPECT_EQ(ix.forward_at(kBase + 5'000), -1);
  EXPECT_EQ(ix.forward_at(kBase + 100'000), 0);

  EXPECT_EQ(ix.ops_named("matmul").size(), 2u);
  EXPECT_TRUE(ix.ops_named("bmm").empty());
  EXPECT_EQ(ix.dtypes(find(ix, T::CpuOp, "matmul")), "bf16, bf16");
  EXPECT_EQ(ix.allocations().size(), 2u);
  EXPECT_DOUBLE_EQ(ix.allocated_bytes_between(kBase + 200'000, kBase + 290'000), 33'554'432.0);
  EXPECT_DOUBLE_EQ(ix.allocated_bytes_between(kBase + 206'000, kBase + 900'000), 0.0);  // the free counts nothing

  const EventRef r = ix.ref(memcpy);
  EXPECT_EQ(r.index, memcpy);
  EXPECT_EQ(r.category, "gpu_memcpy");
  EXPECT_DOUBLE_EQ(r.ts_us, 245.0);
  EXPECT_DOUBLE_EQ(r.dur_us, 40.0);
  EXPECT_EQ(r.correlation, 3u);
}

TEST(TraceIndex, NestsByTimeWhenTheTraceHasNoDepths) {
  // PyTorch's traces carry no depth: nesting comes from the intervals alone.
  Trace t;
  t.activities = {host(T::UserAnnotation, "forward", 0, 100, 0), host(T::CpuOp, "aten::matmul", 0, 50, 0),
                  host(T::CpuOp, "aten::bmm", 10, 30, 0), host(T::CpuOp, "aten::add", 50, 20, 0)};
  const TraceIndex ix(t);
  EXPECT_EQ(ix.parent(1), 0);
  EXPECT_EQ(ix.parent(2), 1);
  EXPECT_EQ(ix.parent(3), 0);  // starts where matmul ends: a sibling
  ASSERT_EQ(ix.forward_ops(0).size(), 2u);
  EXPECT_EQ(ix.op(2), "matmul");
  EXPECT_EQ(ix.enclosing_op(2), 1);
}

// ---- Findings as records

// A rule of the table, at its severity or above (a rule may raise it on a finding that flags something).
bool known_rule(const Finding& f) {
  const auto table = analysis::rule_table();
  return std::any_of(table.begin(), table.end(),
                     [&](const analysis::Rule& r) { return r.id == f.rule && f.severity >= r.severity; });
}

RunResult run_of(Trace t, Device device, const std::string& backend = "naive") {
  RunResult r;
  r.backend = backend;
  r.problem.device = device;
  r.eligibility.eligible = true;
  r.trace = std::move(t);
  r.metrics = analysis::measure(r.trace, r.problem, 0);
  return r;
}

TEST(RuleTable, IdsAreUniqueAndKebabCase) {
  std::vector<std::string_view> ids;
  for (const auto& r : analysis::rule_table()) {
    ids.push_back(r.id);
    EXPECT_TRUE(std::all_of(r.id.begin(), r.id.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
    })) << r.id;
  }
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(std::adjacent_find(ids.begin(), ids.end()), ids.end());
  EXPECT_GE(ids.size(), 15u);
}

TEST(Findings, GpuTraceGivesRecordsWithEvidence) {
  RunResult r = run_of(attention_trace(), Device::Cuda);
  r.expectation.device_activities = 5;
  r.expectation.cpu_ops = {"matmul", "mul", "masked_fill", "softmax", "matmul"};
  ASSERT_EQ(r.metrics.steps, 1);
  ASSERT_EQ(r.metrics.kernels_per_forward, 6);
  const auto fs = analysis::findings(r, {r}, {{"naive", 6}});
  for (const auto& f : fs) EXPECT_TRUE(known_rule(f)) << f.rule;

  const Finding* mismatch = by_rule(fs, "expectation-mismatch");
  ASSERT_TRUE(mismatch) << dump(fs);
  EXPECT_EQ(mismatch->text, "expected 5 GPU activities per forward, saw 6");
  EXPECT_EQ(mismatch->severity, Severity::Warning);
  EXPECT_EQ(mismatch->evidence.size(), 6u);  // no memset to name: the forward's device activities
  EXPECT_DOUBLE_EQ(mismatch->figures.at("seen_per_forward"), 6);
  EXPECT_FALSE(by_rule(fs, "op-sequence-mismatch")) << dump(fs);

  const Finding* guess = by_rule(fs, "guess-confirmed");
  ASSERT_TRUE(guess) << dump(fs);
  EXPECT_EQ(guess->text, "guess confirmed: you expected 6 GPU activities per forward, the trace shows 6.0");
  EXPECT_EQ(guess->severity, Severity::Info);

  const Finding* copy = by_rule(fs, "hidden-copy");
  ASSERT_TRUE(copy) << dump(fs);
  EXPECT_EQ(copy->text, "hidden copy: masked_fill (its copy_) makes 1 device-to-device copy per forward (32.0 MiB)");
  EXPECT_EQ(copy->severity, Severity::Warning);
  ASSERT_EQ(copy->evidence.size(), 2u);
  EXPECT_EQ(copy->evidence[0].name, "masked_fill");
  EXPECT_EQ(copy->evidence[0].category, "cpu_op");
  EXPECT_EQ(copy->evidence[1].category, "gpu_memcpy");
  EXPECT_EQ(copy->evidence[1].correlation, 3u);
  EXPECT_EQ(r.trace.activities[static_cast<std::size_t>(copy->evidence[1].index)].name,
            "Memcpy DtoD (Device -> Device)");
  EXPECT_DOUBLE_EQ(copy->figures.at("copies_per_forward"), 1);
  EXPECT_DOUBLE_EQ(copy->figures.at("bytes_per_forward"), 33'554'432);

  const Finding* occ = by_rule(fs, "low-occupancy");
  ASSERT_TRUE(occ) << dump(fs);
  EXPECT_EQ(occ->text, "heavy blocks at low occupancy: 12% (128 registers/thread, 48 KiB shared per block)");
  EXPECT_DOUBLE_EQ(occ->figures.at("occupancy_pct"), 12.5);
  ASSERT_EQ(occ->evidence.size(), 1u);
  EXPECT_EQ(occ->evidence[0].correlation, 1u);  // the first of the two equally long GEMMs

  const Finding* bound = by_rule(fs, "cpu-bound");
  ASSERT_TRUE(bound) << dump(fs);
  EXPECT_EQ(bound->text, "CPU-bound: 800 us of host time per call for 160 us of GPU work");
  // The heaviest kernel went through cudaLaunchKernel: nothing to say about the launch.
  EXPECT_FALSE(by_rule(fs, "launch-kernel-ex")) << dump(fs);
  EXPECT_FALSE(by_rule(fs, "one-fused-kernel")) << dump(fs);
}

TEST(Findings, TheTrainingStorySavedTensorsRecomputeAndBackwardOverForward) {
  RunResult r = run_of(attention_trace(), Device::Cuda);
  r.problem.batch = 2, r.problem.heads = 4, r.problem.seq = 256, r.problem.kv_seq = 256;
  r.problem.pass = Pass::Backward;
  const double probs = 2.0 * 4 * 256 * 256;
  ASSERT_TRUE(r.metrics.device_time_us);
  const double bwd = *r.metrics.device_time_us;

  // The composites keep the probabilities; nothing about recomputation.
  r.metrics.saved_bytes = 2 * probs;
  r.metrics.forward_device_time_us = bwd / 2.5;
  auto fs = analysis::findings(r, {r}, {});
  const Finding* saved = by_rule(fs, "saved-for-backward");
  ASSERT_TRUE(saved) << dump(fs);
  EXPECT_EQ(saved->text, "saves 1.0 MiB for the backward: the B*H*S*Skv = 524288 probabilities (2.0 bytes each)");
  EXPECT_DOUBLE_EQ(saved->figures.at("probabilities"), probs);
  EXPECT_FALSE(by_rule(fs, "backward-recompute")) << dump(fs);
  const Finding* ratio = by_rule(fs, "backward-over-forward");
  ASSERT_TRUE(ratio) << dump(fs);
  EXPECT_NEAR(ratio->figures.at("ratio"), 2.5, 1e-12);
  EXPECT_EQ(ratio->text.rfind("backward takes 2.50x the forward's time", 0), 0u) << ratio->text;
  EXPECT_NE(ratio->text.find("its FLOPs are 2.5x, so it runs at 1.00x the forward's FLOP rate"), std::string::npos)
      << ratio->text;
  // Its kernels by the names people read, with their shares of its device time.
  const Finding* kernels = by_rule(fs, "backward-kernels");
  ASSERT_TRUE(kernels) << dump(fs);
  EXPECT_EQ(kernels->text,
            "backward kernels: ampere_bf16_s16816gemm_bf16_128x64 50%, elementwise_kernel 17%, masked_fill_kernel "
            "12%, softmax_warp_forward 21%");
  EXPECT_EQ(kernels->evidence.size(), 4u);
  for (Activity& a : r.trace.activities) {
    if (a.name == "softmax_warp_forward") {
      a.name = "void attnprof::cuda::kernels::flash_bwd_sm90_kernel<attnprof::Cfg<128, 64>, (MaskMode)1>(BwdArgs)";
    }
  }
  r.metrics.forward_device_time_us = bwd / 3.125;  // 3.125x the forward's time: 0.80x its FLOP rate
  fs = analysis::findings(r, {r}, {});
  kernels = by_rule(fs, "backward-kernels");
  ASSERT_TRUE(kernels) << dump(fs);
  EXPECT_NE(kernels->text.find(", flash_bwd_sm90_kernel 21%"), std::string::npos) << kernels->text;
  ratio = by_rule(fs, "backward-over-forward");
  ASSERT_TRUE(ratio) << dump(fs);
  EXPECT_NEAR(ratio->figures.at("flop_rate_over_forward"), 0.8, 1e-12);

  // A fused backward keeps only the log-sum-exp and says how dQ is summed.
  r.metrics.saved_bytes = 2.0 * 4 * 256 * 4;
  r.traits.backward_recomputes = r.traits.backward_dq_unordered = true;
  fs = analysis::findings(r, {r}, {});
  saved = by_rule(fs, "saved-for-backward");
  ASSERT_TRUE(saved) << dump(fs);
  EXPECT_EQ(saved->text, "saves 8.0 KiB for the backward: only each row's log-sum-exp, beside O");
  const Finding* re = by_rule(fs, "backward-recompute");
  ASSERT_TRUE(re) << dump(fs);
  EXPECT_NE(re->text.find("in the order its blocks finish"), std::string::npos) << re->text;
  r.problem.deterministic = true;
  fs = analysis::findings(r, {r}, {});
  re = by_rule(fs, "backward-recompute");
  ASSERT_TRUE(re) << dump(fs);
  EXPECT_NE(re->text.find("fixed order (deterministic=true)"), std::string::npos) << re->text;

  // A forward run says none of this.
  r.problem.pass = Pass::Forward;
  r.problem.deterministic = false;
  r.metrics.saved_bytes.reset();
  fs = analysis::findings(r, {r}, {});
  for (const char* id : {"saved-for-backward", "backward-recompute", "backward-over-forward", "backward-kernels"}) {
    EXPECT_FALSE(by_rule(fs, id)) << id << ": " << dump(fs);
  }
}

TEST(Findings, WithCuptiOffNothingIsCountedAndNothingIsCalledAMismatch) {
  // What the device-event fallback records: the host ranges and one
  // "forward (device events)" span per forward, no kernels, copies or memsets.
  Trace t = attention_trace();
  std::erase_if(t.activities, [](const Activity& a) { return a.on_device(); });
  Activity span = testing::device(ActivityType::GpuUserAnnotation, "forward (device events)", 1'000, 160'000, 0);
  t.activities.push_back(span);
  t.collector_note = "CUPTI unavailable (disabled by ATTNPROF_NO_CUPTI): GPU time from device events";
  RunResult r = run_of(std::move(t), Device::Cuda);
  r.expectation.device_activities = 1;
  ASSERT_EQ(r.metrics.steps, 1);
  EXPECT_FALSE(r.metrics.kernels_per_forward) << "not counted, rather than 0";
  ASSERT_TRUE(r.metrics.device_time_us);
  EXPECT_DOUBLE_EQ(*r.metrics.device_time_us, 160.0);
  const auto fs = analysis::findings(r, {r}, {{"naive", 1}});
  EXPECT_FALSE(by_rule(fs, "expectation-mismatch")) << dump(fs);
  EXPECT_FALSE(by_rule(fs, "guess-missed")) << dump(fs);
  const Finding* off = by_rule(fs, "activities-not-counted");
  ASSERT_TRUE(off) << dump(fs);
  EXPECT_EQ(off->severity, Severity::Warning);
  EXPECT_NE(off->text.find("ATTNPROF_NO_CUPTI"), std::string::npos) << off->text;
  EXPECT_NE(off->text.find("not checked"), std::string::npos) << off->text;
}

TEST(Findings, DriverExtendedLaunchOfTheMainKernel) {
  Trace t = attention_trace();
  for (auto& a : t.activities) {
    if (a.type == T::Kernel && a.correlation == 6) a.dur_ns = 35'000;  // the cuLaunchKernelEx GEMM is the heaviest
  }
  const RunResult r = run_of(std::move(t), Device::Cuda);
  const auto fs = analysis::findings(r, {}, {});
  const Finding* ex = by_rule(fs, "launch-kernel-ex");
  ASSERT_TRUE(ex) << dump(fs);
  EXPECT_EQ(ex->text,
            "main kernel launched through the driver's cuLaunchKernelEx; occupancy 12% computed from its record");
  ASSERT_EQ(ex->evidence.size(), 2u);
  EXPECT_EQ(ex->evidence[0].name, "cuLaunchKernelEx");
  EXPECT_EQ(ex->evidence[0].category, "cuda_driver");
  EXPECT_EQ(ex->evidence[1].category, "kernel");
  EXPECT_EQ(ex->evidence[0].correlation, ex->evidence[1].correlation);
}

// A math-style forward as PyTorch's profiler records it: aten:: names, c10
// dtypes, no depths, conversions through _to_copy and copy_, products through
// matmul -> bmm, an out-of-place masked_fill through clone -> copy_.
Trace pytorch_style_trace() {
  Trace t;
  t.base_ns = kBase;
  auto op = [&](const char* name, std::int64_t start, std::int64_t dur, const char* dtypes = "") {
    Activity a = host(T::CpuOp, name, start, dur, 0);
    a.input_dtypes = dtypes;
    t.activities.push_back(a);
  };
  auto upcast = [&](std::int64_t s, const char* from) {
    op("aten::to", s, 40, from);
    op("aten::_to_copy", s + 2, 36, from);
    op("aten::empty_strided", s + 3, 2);
    op("aten::copy_", s + 6, 30, "float, c10::BFloat16, bool");
  };
  t.activities.push_back(host(T::UserAnnotation, "ProfilerStep#0", 0, 1000, 0));
  t.activities.push_back(host(T::UserAnnotation, "forward", 5, 990, 0));
  upcast(10, "c10::BFloat16, Scalar, Scalar, bool, bool");
  upcast(60, "c10::BFloat16, Scalar, Scalar, bool, bool");
  upcast(110, "c10::BFloat16, Scalar, Scalar, bool, bool");
  op("aten::ones", 160, 10, "Scalar");
  op("aten::tril", 170, 10, "bool, Scalar");
  op("aten::where", 180, 10, "bool, float, float");
  op("aten::matmul", 200, 100, "float, float");
  op("aten::bmm", 210, 80, "float, float");
  op("aten::masked_fill", 300, 100, "float, bool, Scalar");
  op("aten::clone", 305, 45, "float, ");
  op("aten::empty_like", 306, 2, "float");
  t.activities.push_back(allocation(307, 1 << 20, 4 << 20));
  op("aten::copy_", 310, 35, "float, float, bool");
  op("aten::masked_fill_", 350, 45, "float, bool, Scalar");
  op("aten::_safe_softmax", 400, 50, "float, Scalar, ");
  op("aten::matmul", 450, 100, "float, float");
  op("aten::bmm", 455, 90, "float, float");
  upcast(550, "float, Scalar, Scalar, bool, bool");  // the downcast: not an upcast
  t.steps_recorded = 1;
  return t;
}

TEST(Findings, TheSameRulesReadPyTorchSpelledTraces) {
  const RunResult r = run_of(pytorch_style_trace(), Device::Cpu, "torch_math");
  ASSERT_EQ(r.metrics.steps, 1);
  // Direct children of forward: 3 upcasts, ones, tril, where, 2 matmuls, masked_fill, softmax, the downcast.
  EXPECT_DOUBLE_EQ(r.metrics.ops_per_forward, 11);
  EXPECT_DOUBLE_EQ(r.metrics.copies_per_forward, 1);  // masked_fill's; the conversions' copies are not copies
  const auto fs = analysis::findings(r, {}, {});
  for (const auto& f : fs) EXPECT_TRUE(known_rule(f)) << f.rule;

  const Finding* up = by_rule(fs, "upcast-fp32");
  ASSERT_TRUE(up) << dump(fs);
  EXPECT_EQ(up->text, "upcasts 3 bf16 tensors to FP32 per forward");
  EXPECT_EQ(up->evidence.size(), 3u);
  for (const auto& e : up->evidence) EXPECT_EQ(e.name, "aten::to");

  const Finding* gemm = by_rule(fs, "fp32-gemm");
  ASSERT_TRUE(gemm) << dump(fs);
  EXPECT_EQ(gemm->text, "FP32 GEMM on bf16 inputs");
  EXPECT_DOUBLE_EQ(gemm->figures.at("fp32_matmuls_per_forward"), 2);  // matmul, not matmul and its bmm

  const Finding* mask = by_rule(fs, "mask-rebuilt");
  ASSERT_TRUE(mask) << dump(fs);
  EXPECT_EQ(mask->text, "mask rebuilt on every call (ones, tril, where)");
  ASSERT_TRUE(by_rule(fs, "nan-safe-softmax")) << dump(fs);

  // One hidden copy, pinned on masked_fill (above its clone), none on the conversions.
  ASSERT_EQ(std::count_if(fs.begin(), fs.end(), [](const Finding& f) { return f.rule == "hidden-copy"; }), 1)
      << dump(fs);
  const Finding* copy = by_rule(fs, "hidden-copy");
  EXPECT_EQ(copy->text, "hidden copy: masked_fill (out of place) allocates and copies 1.0 MiB per forward");
  ASSERT_EQ(copy->evidence.size(), 2u);
  EXPECT_EQ(copy->evidence[0].name, "aten::masked_fill");
  EXPECT_EQ(copy->evidence[1].name, "aten::copy_");
}

}  // namespace
}  // namespace attnprof
