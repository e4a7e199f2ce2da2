// Soft-capping (issue 22 item 3): s <- tanh(s / c) * c on the scaled scores,
// before the mask. The float64 reference against a tiny case worked out here;
// every CPU backend's forward and backward against it on fresh random inputs;
// a wrong cap seen; the field's parsing and its refusals; and every backend
// whose traits do not take a cap refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/error.h"
#include "attnprof/problem_spec.h"
#include "attnprof/reference.h"
#include "attnprof/report.h"
#include "attnprof/runner.h"
#include "backends/composite/composite_backend.h"
#include "backends/cpu/cpu_isa.h"
#include "backends/cpu/flash_kernels.h"
#include "common/test_problem.h"
#include "common/varlen_cases.h"

namespace attnprof {
namespace {

using testing::Shape;

// ---- the reference against a hand-worked case ---------------------------------------

// One query, two keys, head dim 1, scale 1: s_j = c tanh(q k_j / c),
// O = sum_j softmax(s)_j v_j. Its value and its gradients (central differences
// of this closed form) are what the reference must give.
struct Tiny {
  double q = 2, k0 = 1.5, k1 = -1, v0 = 1, v1 = -0.5, cap = 1;
  double out() const {
    const double s0 = cap * std::tanh(q * k0 / cap), s1 = cap * std::tanh(q * k1 / cap);
    const double p0 = 1 / (1 + std::exp(s1 - s0));
    return p0 * v0 + (1 - p0) * v1;
  }
  template <class F>
  double diff(double Tiny::*x, F f) const {
    Tiny up = *this, down = *this;
    const double h = 1e-6;
    up.*x += h;
    down.*x -= h;
    return (f(up) - f(down)) / (2 * h);
  }
};

Problem tiny_problem(double cap) {
  Problem p{.batch = 1, .heads = 1, .seq = 1, .kv_seq = 2, .head_dim = 1, .dtype = DType::F32, .mask = MaskKind::None};
  p.scale = 1.0;
  p.softcap = cap;
  p.normalize();
  p.validate();
  return p;
}

Inputs tiny_inputs(const Problem& p, const Tiny& t) {
  Inputs in = make_inputs(p, 1, cpu_allocator());
  in.q.set(0, 0, 0, 0, static_cast<float>(t.q));
  in.k.set(0, 0, 0, 0, static_cast<float>(t.k0));
  in.k.set(0, 0, 1, 0, static_cast<float>(t.k1));
  in.v.set(0, 0, 0, 0, static_cast<float>(t.v0));
  in.v.set(0, 0, 1, 0, static_cast<float>(t.v1));
  return in;
}

Tensor scalar(double x) {
  Tensor t = Tensor::empty({1, 1, 1, 1}, DType::F32, cpu_allocator());
  t.set(0, 0, 0, 0, static_cast<float>(x));
  return t;
}

TEST(SoftcapReference, MatchesATinyCaseWorkedByHand) {
  const Tiny t;  // q k0 = 3 is capped to tanh(3) = 0.995, q k1 = -2 to -0.964
  const Problem p = tiny_problem(t.cap);
  const Inputs in = tiny_inputs(p, t);
  // The value by hand: p0 = 1 / (1 + e^(-0.964 - 0.995)) = 0.8765, O = 0.8147.
  EXPECT_NEAR(t.out(), 0.8765 * 1 + 0.1235 * -0.5, 1e-3);
  const Tensor out = scalar(t.out());
  const RowSample rows = sample_rows(p, 8);
  EXPECT_LT(check_against_reference(p, in, out, rows).max_abs, 1e-7);
  // Uncapped the scores are 3 and -2, O = (e^5 - 0.5) / (e^5 + 1) = 0.990: far off.
  Tiny uncapped = t;
  uncapped.cap = 1e9;
  EXPECT_GT(std::abs(uncapped.out() - t.out()), 0.1);
  EXPECT_GT(check_against_reference(p, in, scalar(uncapped.out()), rows).max_abs, 0.1);

  // The gradients of L = O dO with dO = 1: dQ, dK and dV of the closed form.
  const auto f = [](const Tiny& x) { return x.out(); };
  Tensor dout = scalar(1.0);
  Tensor dk = Tensor::empty({1, 1, 2, 1}, DType::F32, cpu_allocator());
  Tensor dv = Tensor::empty({1, 1, 2, 1}, DType::F32, cpu_allocator());
  dk.set(0, 0, 0, 0, static_cast<float>(t.diff(&Tiny::k0, f)));
  dk.set(0, 0, 1, 0, static_cast<float>(t.diff(&Tiny::k1, f)));
  dv.set(0, 0, 0, 0, static_cast<float>(t.diff(&Tiny::v0, f)));
  dv.set(0, 0, 1, 0, static_cast<float>(t.diff(&Tiny::v1, f)));
  Gradients g{scalar(t.diff(&Tiny::q, f)), dk, dv};
  const RowSample kv = sample_kv_rows(p, 8);
  const GradientErrors e = check_gradients_against_reference(p, in, dout, g, rows, kv);
  for (const ErrorStats* s : {&e.dq, &e.dk, &e.dv}) EXPECT_LT(s->max_abs, 1e-6);
  // The cap's derivative matters: dQ without the 1 - tanh^2 factors is another number.
  const GradientErrors wrong = check_gradients_against_reference(tiny_problem(2.0), in, dout, g, rows, kv);
  EXPECT_GT(wrong.dq.max_abs, 1e-2);
}

// ---- every CPU backend against the reference ------------------------------------------

struct Case {
  const char* name;
  const char* backend;
  DType dtype;
  MaskKind mask;
  double cap;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// Scale 1 (not 1/sqrt(D)): the scores spread over about +-8, so a cap of 2
// bites hard and even 30 moves the largest ones. Ragged sizes: partial query
// and key blocks in flash, grouped-query heads.
Problem capped_problem(const Case& c, Pass pass) {
  Problem p = testing::to_problem(
      Shape{.batch = 2, .heads = 4, .kv_heads = 2, .seq = 70, .kv_seq = 150, .head_dim = 64}, c.dtype, c.mask);
  if (c.mask == MaskKind::Causal) p.kv_seq = p.seq + 9;  // keys past the last query: some never seen
  p.scale = 1.0;
  p.softcap = c.cap;
  p.pass = pass;
  p.validate();
  return p;
}

// What the runner's check allows: FP32 close to float64; 16-bit the
// acceptance rule, twice the yardstick's error plus a floor. The yardstick is
// math's error on the same inputs, or the backend's own without a cap where
// that is larger: naive and naive_inplace compute the scores in bf16, so at
// scale 1 (scores near +-8) they miss the math rule with no cap at all
// (rel 9e-3 against math's 1.7e-3 here), and the cap's three bf16 ops, as
// PyTorch's eager Gemma-2 runs them, add to that.
using testing::tolerated;

// One backend's forward, or training step, on `in`; outputs start NaN so a
// row left unwritten fails.
struct Ran {
  Tensor out;
  Gradients grads;
};

Ran run(const std::string& name, const Problem& p, const Inputs& in, const Tensor* dout) {
  Backend* b = find_backend(name, Device::Cpu);
  if (b == nullptr) ADD_FAILURE() << name << " missing";
  const Eligibility el = eligibility_of(*b, p);
  EXPECT_TRUE(el.eligible) << name << ": " << el.reason;
  Ran r{testing::nan_tensor(p, p.heads, p.seq), {}};
  RunContext ctx{.allocator = cpu_allocator(), .threads = 2};
  if (dout == nullptr) {
    b->forward(p, in, r.out, ctx);
    return r;
  }
  r.grads = {testing::nan_tensor(p, p.heads, p.seq), testing::nan_tensor(p, p.kv_heads, p.kv_seq),
             testing::nan_tensor(p, p.kv_heads, p.kv_seq)};
  Saved saved;
  b->forward_train(p, in, r.out, saved, ctx);
  b->backward(p, in, r.out, *dout, saved, r.grads, ctx);
  return r;
}

class SoftcapBackends : public ::testing::TestWithParam<Case> {};

TEST_P(SoftcapBackends, ForwardMatchesTheCappedReference) {
  const Case& c = GetParam();
  const Problem p = capped_problem(c, Pass::Forward);
  const Inputs in = make_inputs(p, 23, cpu_allocator());
  const RowSample rows = sample_rows(p, 1 << 20);
  const Ran r = run(c.backend, p, in, nullptr);
  Problem uncapped = p;
  uncapped.softcap = 0;
  const double math_rel =
      std::max(check_against_reference(p, in, run("math", p, in, nullptr).out, rows).rel,
               check_against_reference(uncapped, in, run(c.backend, uncapped, in, nullptr).out, rows).rel);
  const ErrorStats e = check_against_reference(p, in, r.out, rows);
  std::string why;
  EXPECT_TRUE(tolerated(p, e, math_rel, &why)) << c.name << ": " << why;

  // A wrong cap is caught: against the reference with half the cap, or none,
  // the same output fails the same rule. Cap 30 against none moves the
  // output by about 2% here, under naive's bf16 error: that pair is held to
  // FP32 and to the backends that compute in FP32.
  for (const double other : {c.cap * 0.5, 0.0}) {
    const bool bf16_scores = p.dtype != DType::F32 && std::string(c.backend).rfind("naive", 0) == 0;
    if (other == 0 && c.cap == 30 && bf16_scores) continue;
    Problem q = p;
    q.softcap = other;
    const ErrorStats off = check_against_reference(q, in, r.out, rows);
    EXPECT_FALSE(tolerated(q, off, math_rel, &why)) << c.name << " passed against cap " << other << ": " << why;
  }
}

TEST_P(SoftcapBackends, BackwardMatchesTheCappedGradientReference) {
  const Case& c = GetParam();
  const Problem p = capped_problem(c, Pass::Backward);
  const Inputs in = make_inputs(p, 29, cpu_allocator());
  const Tensor dout = make_dout(p, 29, cpu_allocator());
  const RowSample q_rows = sample_rows(p, 1 << 20), kv_rows = sample_kv_rows(p, 1 << 20);
  const auto errors = [&](const Problem& q, const Gradients& g) {
    return check_gradients_against_reference(q, in, dout, g, q_rows, kv_rows);
  };
  const Ran r = run(c.backend, p, in, &dout);
  Problem uncapped = p;
  uncapped.softcap = 0;
  GradientErrors math = errors(p, run("math", p, in, &dout).grads);
  const GradientErrors own = errors(uncapped, run(c.backend, uncapped, in, &dout).grads);
  math.dq.rel = std::max(math.dq.rel, own.dq.rel);  // the yardstick, as forward
  math.dk.rel = std::max(math.dk.rel, own.dk.rel);
  math.dv.rel = std::max(math.dv.rel, own.dv.rel);
  const GradientErrors e = errors(p, r.grads);
  std::string why;
  EXPECT_TRUE(tolerated(p, e.dq, math.dq.rel, &why)) << c.name << " dQ: " << why;
  EXPECT_TRUE(tolerated(p, e.dk, math.dk.rel, &why)) << c.name << " dK: " << why;
  EXPECT_TRUE(tolerated(p, e.dv, math.dv.rel, &why)) << c.name << " dV: " << why;

  // Another cap's gradients are not these: dQ and dK carry the cap's derivative.
  Problem q = p;
  q.softcap = c.cap * 0.5;
  const GradientErrors off = errors(q, r.grads);
  EXPECT_FALSE(tolerated(q, off.dq, math.dq.rel, &why)) << c.name << " dQ passed against half the cap: " << why;
  EXPECT_FALSE(tolerated(q, off.dk, math.dk.rel, &why)) << c.name << " dK passed against half the cap: " << why;
}

std::vector<Case> cases() {
  std::vector<Case> v;
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const char* b : {"naive", "naive_inplace", "math", "flash"})
      for (const char* d : {"fp32", "bf16"})
        for (const char* m : {"none", "causal"})
          for (const char* c : {"30", "2"}) n.push_back(std::string(b) + "_" + d + "_" + m + "_cap" + c);
    return n;
  }();
  std::size_t k = 0;
  for (const char* b : {"naive", "naive_inplace", "math", "flash"})
    for (const DType d : {DType::F32, DType::BF16})
      for (const MaskKind m : {MaskKind::None, MaskKind::Causal})
        for (const double c : {30.0, 2.0}) v.push_back(Case{names[k++].c_str(), b, d, m, c});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cpu, SoftcapBackends, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return std::string(info.param.name); });

// 0 is the default and means no cap; a cap far past every score is the
// identity to float precision, on the capped path of flash too.
TEST(Softcap, AHugeCapChangesNothing) {
  Problem p = testing::to_problem(Shape{.heads = 2, .seq = 100, .head_dim = 32}, DType::F32, MaskKind::Causal);
  EXPECT_EQ(p.softcap, 0.0);
  p.validate();
  const Inputs in = make_inputs(p, 5, cpu_allocator());
  Tensor a = Tensor::empty({p.batch, p.heads, p.seq, p.head_dim}, p.dtype, cpu_allocator());
  Tensor b = Tensor::empty({p.batch, p.heads, p.seq, p.head_dim}, p.dtype, cpu_allocator());
  RunContext ctx{.allocator = cpu_allocator(), .threads = 1};
  Backend* flash = find_backend("flash", Device::Cpu);
  ASSERT_NE(flash, nullptr);
  flash->forward(p, in, a, ctx);
  Problem capped = p;
  capped.softcap = 1e30;  // tanh(s / c) * c == s to float precision
  flash->forward(capped, in, b, ctx);
  EXPECT_LT(check_against_reference(p, in, b, sample_rows(p, 1 << 20)).rel, 1e-5);
  EXPECT_LT(check_against_reference(p, in, a, sample_rows(p, 1 << 20)).rel, 1e-5);
}

// The composites' plan: the cap's ops in the expectation, as PyTorch's eager
// Gemma-2 runs them, and the refuse-before-allocating estimate covering the
// planned peak with its extra score buffers (the saved tanh included).
TEST(Softcap, CompositePlansShowTheCapsOpsAndFitTheEstimate) {
  for (const char* name : {"naive", "naive_inplace", "math"}) {
    const auto* c = dynamic_cast<const composite::CompositeBackend*>(find_backend(name, Device::Cpu));
    ASSERT_NE(c, nullptr) << name;
    for (const MaskKind mask : {MaskKind::None, MaskKind::Causal, MaskKind::Boolean, MaskKind::Bias}) {
      for (const DType dt : {DType::F32, DType::BF16}) {
        for (const Pass pass : {Pass::Forward, Pass::Backward, Pass::Train}) {
          Problem p = testing::to_problem(Shape{.batch = 2, .heads = 4, .seq = 96, .head_dim = 32}, dt, mask);
          p.softcap = 30;
          p.pass = pass;
          p.validate();
          const std::string what = std::string(name) + " " + p.describe();
          EXPECT_GE(c->workspace_bytes(p), c->planned_workspace_bytes(p)) << what;
          const std::vector<std::string> ops = c->expectation(p).cpu_ops;
          const auto count = [&](const char* op) { return std::count(ops.begin(), ops.end(), op); };
          EXPECT_EQ(count("tanh"), pass == Pass::Backward ? 0 : 1) << what;
          EXPECT_EQ(count("tanh_backward"), pass == Pass::Forward ? 0 : 1) << what;
          Problem plain = p;
          plain.softcap = 0;
          const std::vector<std::string> uncapped = c->expectation(plain).cpu_ops;
          EXPECT_EQ(std::count(uncapped.begin(), uncapped.end(), "tanh"), 0) << what;
          EXPECT_EQ(ops.size(), uncapped.size() + (pass == Pass::Forward    ? 3u
                                                   : pass == Pass::Backward ? 1u
                                                                            : 4u))
              << what;
        }
      }
    }
  }
}

// flash's vector tanh against std::tanh at every kernel level this CPU runs
// (the others are skipped by name, see FlashIsa in flash_isa_test.cpp): both
// branches, the switch at 0.1, tiny arguments (a large cap puts every score
// there), saturation, signs.
TEST(Softcap, FlashVectorTanhMatchesStdTanh) {
  std::vector<float> xs = {0.0f, -0.0f, 1e-30f, 1e-8f, 1e-4f, 0.0999999f, 0.1f,  0.1000001f,
                           0.5f, 1.0f,  3.0f,   9.0f,  20.0f, 44.0f,      90.0f, 1e30f};
  for (float x = 1e-6f; x < 60.0f; x *= 1.07f) xs.push_back(x);
  const std::size_t n = xs.size();
  for (std::size_t i = 0; i < n; ++i) xs.push_back(-xs[i]);
  while (xs.size() % 16 != 0) xs.push_back(0.25f);
  int levels = 0;
  for (cpu::CpuIsa isa : cpu::kAllCpuIsas) {
    if (!cpu::isa_missing(isa).empty()) continue;
    ++levels;
    const std::string level(cpu::isa_name(isa));
    std::vector<float> got(xs.size(), std::numeric_limits<float>::quiet_NaN());
    cpu::flash::kernels_of(isa).vector_tanh(xs.data(), got.data(), static_cast<std::int64_t>(xs.size()));
    double worst = 0;
    for (std::size_t i = 0; i < xs.size(); ++i) {
      const double want = std::tanh(static_cast<double>(xs[i]));
      const double err = std::abs(got[i] - want) / std::max(std::abs(want), 1e-30);
      worst = std::max(worst, err);
      EXPECT_LT(err, 1e-6) << level << ": tanh(" << xs[i] << ") = " << got[i] << ", want " << want;
      EXPECT_EQ(std::signbit(got[i]), std::signbit(xs[i])) << level << " " << xs[i];
    }
    EXPECT_GT(worst, 0.0) << level << " compared something";
  }
  EXPECT_GE(levels, 1) << "the scalar level runs everywhere";
}

// ---- the field --------------------------------------------------------------------

std::string refusal(const std::string& text) {
  Problem p;
  try {
    set_problem_field(p, "softcap", text);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument) << text;
    EXPECT_EQ(e.fields(), std::vector<std::string>{"softcap"}) << text;
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << "one line: " << what;
    return what;
  }
  ADD_FAILURE() << "softcap " << text << " was taken";
  return {};
}

TEST(Softcap, FieldRefusesZeroOrLessAndNonNumbers) {
  EXPECT_NE(refusal("0").find("softcap must be positive"), std::string::npos);
  EXPECT_NE(refusal("-30").find("softcap must be positive"), std::string::npos);
  EXPECT_NE(refusal("-0").find("softcap must be positive"), std::string::npos);
  EXPECT_NE(refusal("nan").find("softcap"), std::string::npos);
  EXPECT_NE(refusal("inf").find("finite"), std::string::npos);
  EXPECT_NE(refusal("thirty").find("expects a decimal number"), std::string::npos);
  Problem p;
  set_problem_field(p, "softcap", "30");
  EXPECT_EQ(p.softcap, 30.0);
  set_problem_field(p, "softcap", "2.5");
  EXPECT_EQ(p.softcap, 2.5);
}

TEST(Softcap, ValidateRefusesWhatCodeCanHold) {
  for (const double bad : {-1.0, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    Problem p;
    p.normalize();
    p.softcap = bad;
    try {
      p.validate();
      ADD_FAILURE() << "softcap " << bad << " passed validate()";
    } catch (const Error& e) {
      EXPECT_EQ(e.fields(), std::vector<std::string>{"softcap"});
      EXPECT_NE(std::string(e.what()).find("softcap must be a finite number from 2^-60 to 2^60"), std::string::npos)
          << e.what();
    }
  }
}

TEST(Softcap, IsInTheDescriptionTheFileStemAndTheJson) {
  Problem p = testing::to_problem(Shape{.batch = 8, .heads = 16, .seq = 1024}, DType::BF16, MaskKind::Causal);
  const std::string plain = p.file_stem();
  EXPECT_EQ(problem_json(p).find("\"softcap\": null"), problem_json(p).find("\"softcap\""));
  p.softcap = 30;
  EXPECT_NE(p.describe().find("causal, soft cap 30 on cpu"), std::string::npos) << p.describe();
  EXPECT_EQ(p.file_stem(), "8_16_1024_64_softcap30");
  EXPECT_NE(p.file_stem(), plain);
  EXPECT_NE(problem_json(p).find("\"softcap\": 30.0"), std::string::npos) << problem_json(p);
  p.softcap = 2.5;
  EXPECT_EQ(p.file_stem(), "8_16_1024_64_softcap2.5");
  Problem other = p;
  other.softcap = 0;
  EXPECT_NE(p, other) << "the plan caches' key tells them apart";
}

// ---- refusals by name ---------------------------------------------------------------

// A backend that declares nothing (as every CUDA backend does, none taking a
// soft cap yet): eligibility_of() refuses it before asking it.
class Undeclared final : public Backend {
 public:
  explicit Undeclared(Device d) : device_(d) {}
  std::string_view name() const override { return "efficient"; }
  Device device() const override { return device_; }
  Eligibility eligibility(const Problem&) const override { return {true, "would run"}; }
  std::size_t workspace_bytes(const Problem&) const override { return 0; }
  Expectation expectation(const Problem&) const override { return {}; }
  void forward(const Problem&, const Inputs&, Tensor&, RunContext&) override {}

 private:
  Device device_;
};

TEST(Softcap, BackendsWithoutItAreRefusedByName) {
  Problem p;
  p.normalize();
  p.device = Device::Cuda;
  const Undeclared cuda(Device::Cuda);
  EXPECT_TRUE(eligibility_of(cuda, p).eligible) << "no cap: its own answer";
  p.softcap = 30;
  const Eligibility el = eligibility_of(cuda, p);
  EXPECT_FALSE(el.eligible);
  EXPECT_EQ(el.reason, "soft-capping is not built for efficient on cuda yet") << "why only: explain() names takers";
  p.device = Device::Cpu;
  const Undeclared cpu(Device::Cpu);
  EXPECT_EQ(eligibility_of(cpu, p).reason, "soft-capping is not built for efficient on cpu yet");
}

TEST(Softcap, ExplainKeepsEveryCpuBackendAndSaysSo) {
  Problem p = testing::to_problem(Shape{.heads = 2, .seq = 128}, DType::BF16, MaskKind::Causal);
  p.softcap = 50;
  p.validate();
  int eligible = 0;
  for (const Explanation& e : explain(p)) {
    if (!e.eligible) continue;
    ++eligible;
    EXPECT_NE(e.reason.find("soft"), std::string::npos) << e.backend << ": " << e.reason;
  }
  EXPECT_EQ(eligible, 4) << "naive, naive_inplace, math and flash on the CPU";
}

}  // namespace
}  // namespace attnprof
