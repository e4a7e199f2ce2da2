// FP8 (issue 24) on the CPU: the problem (forward only, bf16 output, its
// bytes and names), the inputs (the bf16 problem's real values quantized per
// tensor, saturation counted), the composites in FP8 semantics against
// float64 within the stated tolerance, the runner's error beside bf16's, and
// the findings.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "analysis/findings.h"
#include "attnprof/backend.h"
#include "attnprof/error.h"
#include "attnprof/reference.h"
#include "attnprof/report.h"
#include "attnprof/runner.h"
#include "common/test_problem.h"
#include "findings_lookup.h"

namespace attnprof {
namespace {

Problem fp8(testing::Shape s, MaskKind mask = MaskKind::Causal) {
  Problem p = testing::to_problem(s, DType::F8E4M3, mask);
  p.validate();
  return p;
}

Backend& cpu(const std::string& name) {
  Backend* b = find_backend(name, Device::Cpu);
  if (b == nullptr) throw std::runtime_error("no CPU backend " + name);
  return *b;
}

using testing::refusal;

TEST(Fp8Problem, IsForwardOnlyWithABf16Output) {
  Problem p = fp8({.heads = 2, .seq = 64});
  for (const Pass pass : {Pass::Backward, Pass::Train}) {
    Problem b = p;
    b.pass = pass;
    const std::string why = refusal(b);
    EXPECT_NE(why.find("dtype fp8 is forward only"), std::string::npos) << why;
    EXPECT_NE(why.find("pass=forward"), std::string::npos) << why;
    try {
      b.validate();
    } catch (const Error& e) {
      EXPECT_EQ(e.fields(), (std::vector<std::string>{"pass", "dtype"}));
    }
  }
  // Q, K and V a byte an element, O two (bf16).
  const std::size_t elems = 2 * 64 * 64;
  EXPECT_EQ(p.q_bytes(), elems);
  EXPECT_EQ(p.kv_bytes(), elems);
  EXPECT_EQ(p.o_bytes(), 2 * elems);
  Problem none = p;
  none.mask = MaskKind::None;
  EXPECT_EQ(none.io_bytes(), 3 * elems + 2 * elems);
  Problem bias = none;
  bias.mask = MaskKind::Bias;
  EXPECT_EQ(bias.io_bytes(), none.io_bytes() + 64 * 64 * 2) << "a bias is bf16 with fp8 inputs";
  EXPECT_NE(p.describe().find("fp8 (e4m3 inputs with per-tensor descales, bf16 output)"), std::string::npos)
      << p.describe();
  EXPECT_EQ(p.file_stem(), "1_2_64_64_fp8");
  Problem b16 = p;
  b16.dtype = DType::BF16;
  EXPECT_NE(p.file_stem(), b16.file_stem()) << "an fp8 run would overwrite the bf16 run's files";
  EXPECT_EQ(fp8_real_problem(p), b16);
}

// FP8's real inputs are uniform in [-1, 1) as bf16's, and its scores are
// FP32: the reach is held to FP32's largest value, not e4m3's 448.
TEST(Fp8Problem, ScaleReachIsHeldToTheFp32Scores) {
  Problem p = testing::to_problem({.heads = 1, .seq = 16, .scale = 100.0}, DType::F8E4M3, MaskKind::None);
  EXPECT_NO_THROW(p.validate()) << "100 x 64 = 6400 is past 448 but FP32 holds it";
  p.scale = 1e37;
  const std::string why = refusal(p);
  EXPECT_NE(why.find("past the largest finite fp32"), std::string::npos) << why;
}

TEST(Fp8Inputs, AreTheBf16ProblemsRealValuesQuantizedPerTensor) {
  const Problem p = fp8({.heads = 2, .kv_heads = 1, .seq = 48, .kv_seq = 80});
  const Inputs real = make_inputs(fp8_real_problem(p), 7, cpu_allocator());
  const Fp8Quantized q = quantize_inputs(p, real, std::nullopt, cpu_allocator());
  ASSERT_EQ(q.tensors.size(), 3u);
  const Tensor* reals[] = {&real.q, &real.k, &real.v};
  const Tensor* stored[] = {&q.in.q, &q.in.k, &q.in.v};
  const float descales[] = {q.in.q_descale, q.in.k_descale, q.in.v_descale};
  for (int t = 0; t < 3; ++t) {
    const Fp8TensorQuantization& s = q.tensors[static_cast<std::size_t>(t)];
    EXPECT_EQ(s.name, std::string(1, "qkv"[t]));
    ASSERT_EQ(stored[t]->dtype(), DType::F8E4M3);
    ASSERT_EQ(stored[t]->sizes(), reals[t]->sizes());
    double amax = 0, largest_stored = 0;
    testing::for_each_index(*reals[t], [&](auto a, auto b, auto c, auto d) {
      const double x = reals[t]->get(a, b, c, d);
      amax = std::max(amax, std::abs(x));
      const float st = stored[t]->get(a, b, c, d);
      largest_stored = std::max(largest_stored, std::abs(double{st}));
      // stored = e4m3(real / descale), exactly as the conversion makes it
      ASSERT_EQ(float_to_e4m3(static_cast<float>(x / s.descale)),
                static_cast<const std::uint8_t*>(stored[t]->data())[stored[t]->index(a, b, c, d)]);
    });
    EXPECT_EQ(s.amax, amax);
    EXPECT_DOUBLE_EQ(s.descale, amax / 448.0);
    EXPECT_FLOAT_EQ(descales[t], static_cast<float>(s.descale));
    EXPECT_EQ(largest_stored, 448.0) << "the largest value maps to e4m3's largest";
    EXPECT_EQ(s.saturated, 0);
    EXPECT_EQ(s.elements, reals[t]->numel());
  }
  // make_inputs of the FP8 problem is the same quantization of the same draw.
  const Inputs direct = make_inputs(p, 7, cpu_allocator());
  EXPECT_EQ(direct.k_descale, q.in.k_descale);
  testing::for_each_index(
      direct.v, [&](auto a, auto b, auto c, auto d) { ASSERT_EQ(direct.v.get(a, b, c, d), q.in.v.get(a, b, c, d)); });
  EXPECT_EQ(auto_fp8_descale(0.0), 1.0);
}

TEST(Fp8Inputs, AFixedDescaleSaturatesAndCountsWhatItSaturated) {
  const Problem p = fp8({.heads = 2, .seq = 64});
  const Inputs real = make_inputs(fp8_real_problem(p), 3, cpu_allocator());
  const double fixed = 1.0 / 896;  // 448 x descale = 0.5: about half the uniform values pass it
  const Fp8Quantized q = quantize_inputs(p, real, fixed, cpu_allocator());
  std::int64_t past = 0;
  testing::for_each_index(real.k, [&](auto a, auto b, auto c, auto d) {
    past += std::abs(double{real.k.get(a, b, c, d)}) / fixed > 448.0;
    const float st = q.in.k.get(a, b, c, d);
    ASSERT_LE(std::abs(st), 448.0f);
  });
  EXPECT_EQ(q.tensors[1].saturated, past);
  EXPECT_GT(past, real.k.numel() / 3);
  EXPECT_LT(past, 2 * real.k.numel() / 3);
  EXPECT_EQ(q.in.q_descale, static_cast<float>(fixed));
  for (const double bad : {0.0, -1.0, std::nan(""), HUGE_VAL}) {
    EXPECT_THROW(quantize_inputs(p, real, bad, cpu_allocator()), Error) << bad;
  }
}

TEST(Fp8Inputs, KeepTheBshdLayoutAndThePackedOne) {
  const Problem p = fp8({.heads = 3, .seq = 32});
  const Inputs in = make_inputs(p, 1, cpu_allocator(), /*bshd=*/true);
  const Inputs real = make_inputs(fp8_real_problem(p), 1, cpu_allocator(), /*bshd=*/true);
  EXPECT_EQ(in.q.strides(), real.q.strides());
  EXPECT_FALSE(in.q.is_contiguous());
  EXPECT_EQ(in.q.dtype(), DType::F8E4M3);
  Problem packed = varlen_problem(fp8({.heads = 2, .seq = 16}), {16, 5, 0, 9});
  packed.normalize().validate();
  const Inputs pin = make_inputs(packed, 1, cpu_allocator());
  EXPECT_EQ(pin.q.sizes(), packed.q_dims());
  EXPECT_EQ(pin.q.dtype(), DType::F8E4M3);
}

// The reference reads an e4m3 tensor as stored x descale: a doubled descale
// on half the stored values is the same real input.
TEST(Fp8Reference, ReadsE4m3TimesTheDescale) {
  const Problem p = fp8({.heads = 2, .seq = 32}, MaskKind::None);
  Inputs in = make_inputs(p, 5, cpu_allocator());
  Inputs halved = in;
  halved.v = Tensor::empty(in.v.sizes(), DType::F8E4M3, cpu_allocator());
  testing::for_each_index(in.v, [&](auto a, auto b, auto c, auto d) {
    halved.v.set(a, b, c, d, in.v.get(a, b, c, d) / 2);  // exact: no subnormal halves here
  });
  halved.v_descale = in.v_descale * 2;
  Tensor out = Tensor::empty(p.q_dims(), DType::BF16, cpu_allocator());
  RunContext ctx{cpu_allocator(), nullptr, 1};
  cpu("math").forward(p, in, out, ctx);
  const RowSample rows = sample_rows(p, 1 << 20);
  const ErrorStats a = check_against_reference(p, in, out, rows), b = check_against_reference(p, halved, out, rows);
  EXPECT_LT(a.rel, 1e-2) << "against the dequantized inputs, math is FP32 then bf16";
  EXPECT_NEAR(a.rel, b.rel, 1e-3 * a.rel + 1e-9);
}

// The stated tolerance: 2 x math's error + 2^-4 / sqrt(3), as 16-bit is judged.
TEST(Fp8Reference, ToleranceIsTwiceMathsPlusOneE4m3Rounding) {
  EXPECT_NEAR(tolerance_floor(DType::F8E4M3), 0.0625 / std::sqrt(3.0), 1e-12);
  ErrorStats e;
  e.rel = 0.08;
  e.rows_checked = 1;
  const Acceptance with_math = accept(DType::F8E4M3, e, 0.03, false);
  EXPECT_TRUE(with_math.pass) << with_math.why;
  EXPECT_NEAR(with_math.tolerance, 0.06 + tolerance_floor(DType::F8E4M3), 1e-12);
  EXPECT_NE(with_math.why.find("2 x 3.00e-02 (math) + 3.6e-02"), std::string::npos) << with_math.why;
  e.rel = 0.1;
  EXPECT_FALSE(accept(DType::F8E4M3, e, 0.03, false).pass);
  EXPECT_FALSE(accept(DType::F8E4M3, e, std::nullopt, false).pass) << "alone: 2 x the floor, 7.2e-2";
  e.rel = 0.07;
  EXPECT_TRUE(accept(DType::F8E4M3, e, std::nullopt, false).pass);
}

struct Case {
  const char* label;
  testing::Shape shape;
  MaskKind mask;
};

// The composites in FP8 semantics, against the float64 output of the REAL
// inputs: within 2 x math's error + the floor (math is the yardstick, as for
// 16-bit), FP8 costing more than bf16 does on the same inputs; and, against
// their own dequantized inputs, the FP32 problem's answer (rounded to bf16).
TEST(Fp8Composites, MatchFloat64WithinTheStatedTolerance) {
  const Case cases[] = {
      {"causal", {.batch = 2, .heads = 4, .seq = 96, .head_dim = 64}, MaskKind::Causal},
      {"grouped-query bottom-right",
       {.heads = 8, .kv_heads = 2, .seq = 40, .kv_seq = 136, .head_dim = 32},
       MaskKind::CausalBottomRight},
      {"no mask, head dim 128", {.heads = 2, .seq = 64, .kv_seq = 72, .head_dim = 128}, MaskKind::None},
      {"bias", {.heads = 2, .seq = 33, .head_dim = 64}, MaskKind::Bias},
  };
  RunContext ctx{cpu_allocator(), nullptr, 1};
  for (const Case& c : cases) {
    const Problem p = fp8(c.shape, c.mask);
    const Problem real_p = fp8_real_problem(p);
    const Inputs real = make_inputs(real_p, 11, cpu_allocator());
    const Fp8Quantized q = quantize_inputs(p, real, std::nullopt, cpu_allocator());
    const RowSample rows = sample_rows(p, 1 << 20);
    // The FP32 problem on the dequantized values: what FP8 semantics compute.
    Problem p32 = p;
    p32.dtype = DType::F32;
    Inputs deq = q.in;
    for (auto [from, to, s] : {std::tuple{&q.in.q, &deq.q, q.in.q_descale}, std::tuple{&q.in.k, &deq.k, q.in.k_descale},
                               std::tuple{&q.in.v, &deq.v, q.in.v_descale}}) {
      *to = Tensor::empty(from->sizes(), DType::F32, cpu_allocator());
      testing::for_each_index(
          *from, [&](auto a, auto b, auto cc, auto d) { to->set(a, b, cc, d, from->get(a, b, cc, d) * s); });
    }
    std::optional<double> math_rel;
    for (const char* name : {"math", "naive", "naive_inplace"}) {
      const std::string what = std::string(c.label) + " " + name;
      Tensor out = Tensor::empty(p.q_dims(), DType::BF16, cpu_allocator());
      cpu(name).forward(p, q.in, out, ctx);
      const ErrorStats e = check_against_reference(p, real, out, rows);
      EXPECT_EQ(e.nan_rows, 0) << what;
      if (std::string(name) == "math") math_rel = e.rel;
      const Acceptance a = accept(p.dtype, e, math_rel, false);
      EXPECT_TRUE(a.pass) << what << ": " << a.why;
      EXPECT_GT(e.rel, 5e-3) << what << ": quantizing to e4m3 costs more than bf16's rounding";
      EXPECT_LT(e.rel, 6e-2) << what;
      // FP8 semantics: exactly the FP32 problem on the dequantized values, then bf16.
      Tensor out32 = Tensor::empty(p.q_dims(), DType::F32, cpu_allocator());
      cpu(name).forward(p32, deq, out32, ctx);
      testing::for_each_index(out, [&](auto a0, auto b0, auto c0, auto d0) {
        ASSERT_EQ(out.get(a0, b0, c0, d0), bf16_to_float(float_to_bf16(out32.get(a0, b0, c0, d0)))) << what;
      });
      // bf16 on the same real inputs errs less.
      Tensor out16 = Tensor::empty(p.q_dims(), DType::BF16, cpu_allocator());
      cpu(name).forward(real_p, real, out16, ctx);
      EXPECT_LT(check_against_reference(real_p, real, out16, rows).rel, e.rel / 4) << what;
    }
  }
}

// Every CPU backend takes FP8; flash says how (the stored values in bf16
// products, the descales as scales: flash_isa_test.cpp checks them at every
// kernel level). The refusal a backend without FP8 gives names those that take it.
TEST(Fp8Composites, EveryCpuBackendTakesItAndFlashSaysHow) {
  const Problem p = fp8({.heads = 2, .seq = 64});
  std::vector<std::string> takers;
  for (const Explanation& x : explain(p)) {
    if (find_backend(x.backend, Device::Cpu) == nullptr) continue;  // efficient and cudnn: CUDA only
    EXPECT_TRUE(x.eligible) << x.backend << ": " << x.reason;
    if (x.eligible) takers.push_back(x.backend);
  }
  EXPECT_EQ(takers.size(), 4u);
  const Eligibility e = eligibility_of(cpu("flash"), p);
  EXPECT_NE(e.reason.find("e4m3 inputs read as they are stored (q's and k's descales in the scale, v's on O)"),
            std::string::npos)
      << e.reason;
  EXPECT_EQ(no_fp8("x", Device::Cpu).reason, "fp8 (e4m3) inputs are not built for x on cpu");
}

// Descale tensors (Inputs::q_descale_tensor ...) are for a GPU's kernels,
// which read them on the caller's stream; the CPU's backends take the numbers
// and refuse a tensor by name rather than ignore it (issue 56 item 2).
TEST(Fp8Composites, DescaleTensorsAreRefusedOnTheCpuInOneLine) {
  const Problem p = fp8({.heads = 2, .seq = 32});
  const Inputs real = make_inputs(fp8_real_problem(p), 5, cpu_allocator());
  Inputs in = quantize_inputs(p, real, std::nullopt, cpu_allocator()).in;
  in.v_descale_tensor = Tensor::empty({1, 1, 1, 1}, DType::F32, cpu_allocator());
  in.v_descale_tensor.data_as<float>()[0] = in.v_descale;
  in.v_descale = 1.0f;
  ASSERT_TRUE(in.device_descales());
  for (const char* name : {"flash", "math", "naive"}) {
    Tensor out = Tensor::empty(p.q_dims(), DType::BF16, cpu_allocator());
    RunContext ctx{.allocator = cpu_allocator(), .threads = 1};
    try {
      cpu(name).forward(p, in, out, ctx);
      ADD_FAILURE() << name << " ran with a descale tensor it does not read";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
      EXPECT_NE(what.find("descales as numbers"), std::string::npos) << name << ": " << what;
    }
  }
}

RunOptions quick() {
  RunOptions o;
  o.schedule = {.wait = 0, .warmup = 1, .active = 1, .repeat = 1};
  o.check_rows = 512;
  o.threads = 1;
  return o;
}

TEST(Fp8Runs, CarryTheDescalesAndTheBf16ErrorBesideTheirOwn) {
  const Problem p = fp8({.heads = 2, .kv_heads = 1, .seq = 64});
  const RunResult r = run_backend(cpu("naive_inplace"), p, quick());
  ASSERT_FALSE(r.failure) << *r.failure;
  ASSERT_TRUE(r.error && r.fp8);
  EXPECT_EQ(r.trace.name, "1_2_64_64_fp8_naive_inplace");
  ASSERT_EQ(r.fp8->tensors.size(), 3u);
  EXPECT_TRUE(r.fp8->auto_descale);
  ASSERT_TRUE(r.fp8->bf16_error) << r.fp8->bf16_note;
  EXPECT_LT(r.fp8->bf16_error->rel, r.error->rel / 4);
  EXPECT_GT(r.error->rel, 5e-3);
  ASSERT_TRUE(r.acceptance);
  EXPECT_TRUE(r.acceptance->pass) << r.acceptance->why;
  // The bf16 forward is checked, not profiled: the trace holds the fp8 steps only.
  EXPECT_EQ(r.metrics.steps, 1);
}

// The amaxes a backend's own FP8 graph measured (cudnn's, read_fp8_amax)
// reach the finding and the JSON; a backend that measures none adds nothing.
TEST(Fp8Runs, TheGraphsMeasuredAmaxesAreReported) {
  const Problem p = fp8({.heads = 2, .kv_heads = 1, .seq = 64});
  RunResult r = run_backend(cpu("naive_inplace"), p, quick());
  ASSERT_FALSE(r.failure) << *r.failure;
  ASSERT_TRUE(r.fp8);
  EXPECT_FALSE(r.fp8->measured_amax) << "the composites measure no amax";
  auto quantization = [](const RunResult& run) {
    const std::vector<Finding> all = analysis::findings(run, {}, {});
    const Finding* f = testing::by_rule(all, "fp8-quantization");
    return f ? std::optional<Finding>(*f) : std::nullopt;
  };
  ASSERT_TRUE(quantization(r));
  EXPECT_EQ(quantization(r)->text.find("amax(P)"), std::string::npos);
  r.fp8->measured_amax = Fp8Amax{.s = 0.75f, .o = 2.5f};
  const std::optional<Finding> f = quantization(r);
  ASSERT_TRUE(f);
  EXPECT_NE(f->text.find("measured amax(P) 0.75, amax(O) 2.5"), std::string::npos) << f->text;
  EXPECT_DOUBLE_EQ(f->figures.at("amax_o"), 2.5);
}

TEST(Fp8Runs, FindingsSayTheDescalesTheErrorAndTheOverflow) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("attnprof-fp8-" + std::to_string(std::random_device{}()));
  PipelineOptions o;
  o.run = quick();
  o.trace_dir = dir / "traces";
  const Problem p = fp8({.heads = 2, .seq = 64});
  const PipelineReport rep = compare(p, o, {"naive", "math", "flash"});
  ASSERT_EQ(rep.results.size(), 3u);
  EXPECT_TRUE(rep.accepted());
  for (std::size_t i = 0; i < 3; ++i) {
    const RunResult& r = rep.results[i];
    const Finding* f = testing::by_rule(r.findings, "fp8-quantization");
    ASSERT_NE(f, nullptr) << r.backend << testing::dump(r.findings);
    EXPECT_NE(f->text.find("descales q "), std::string::npos) << f->text;
    EXPECT_NE(f->text.find("against bf16's"), std::string::npos) << f->text;
    EXPECT_DOUBLE_EQ(f->figures.at("bf16_rel_error"), r.fp8->bf16_error->rel);
    EXPECT_DOUBLE_EQ(f->figures.at("q_descale"), r.fp8->tensors[0].descale);
    // The composites dequantize in ops of their own; flash reads the stored values in its one op.
    EXPECT_EQ(testing::by_rule(r.findings, "fp8-dequantize") != nullptr, r.backend != "flash")
        << r.backend << testing::dump(r.findings);
    EXPECT_EQ(testing::by_rule(r.findings, "fp8-saturation"), nullptr) << "auto descales saturate nothing";
    EXPECT_TRUE(fs::exists(rep.outputs[i].trace)) << rep.outputs[i].trace;
  }
  ASSERT_TRUE(rep.results[2].eligibility.eligible) << rep.results[2].eligibility.reason;
  ASSERT_TRUE(rep.results[2].acceptance);
  EXPECT_TRUE(rep.results[2].acceptance->pass) << rep.results[2].acceptance->why;
  const std::string table = compare_table(rep.results);
  EXPECT_NE(table.find("bf16 error"), std::string::npos) << table;
  const std::string json = rep.json();
  EXPECT_NE(json.find("\"bf16_rel_error\""), std::string::npos);

  o.run.fp8_descale = 1.0 / 896;
  const PipelineReport sat = compare(p, o, {"math"});
  ASSERT_EQ(sat.results.size(), 1u);
  const RunResult& m = sat.results[0];
  ASSERT_TRUE(m.fp8);
  EXPECT_FALSE(m.fp8->auto_descale);
  int warnings = 0;
  for (const Finding& f : m.findings) {
    if (f.rule != "fp8-saturation") continue;
    ++warnings;
    EXPECT_EQ(f.severity, Severity::Warning);
    EXPECT_NE(f.text.find("past e4m3's 448 x its descale"), std::string::npos) << f.text;
    EXPECT_GT(f.figures.at("saturated_pct"), 30.0);
    EXPECT_LT(f.figures.at("saturated_pct"), 70.0);
  }
  EXPECT_EQ(warnings, 3) << testing::dump(m.findings);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace attnprof
