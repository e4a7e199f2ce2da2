// Problem validation (each error names its flag) and the structural masks.
#include "attnprof/problem.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>

#include "attnprof/backend.h"
#include "attnprof/dtype.h"
#include "attnprof/error.h"
#include "attnprof/problem_spec.h"
#include "attnprof/profiler.h"
#include "attnprof/reference.h"
#include "attnprof/runner.h"
#include "attnprof/tensor.h"
#include "mask_oracle.h"

namespace attnprof {
namespace {

// ---------------------------------------------------------------- problem

Problem small(MaskKind mask = MaskKind::None) {
  Problem p;
  p.batch = 2;
  p.heads = 4;
  p.seq = 16;
  p.head_dim = 32;
  p.mask = mask;
  p.normalize();
  return p;
}

bool names_field(const Error& e, const std::string& field) {
  return std::find(e.fields().begin(), e.fields().end(), field) != e.fields().end();
}

// validate() must throw InvalidArgument whose message names `field` (the
// Problem's spelling, never a CLI flag) and lists it among the error's fields;
// `field` may also be a word of the message ("overflow").
void expect_invalid(Problem p, const std::string& field) {
  try {
    p.validate();
    ADD_FAILURE() << "validate() accepted " << p.describe() << "; expected an error naming " << field;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument) << e.what();
    const std::string what = e.what();
    EXPECT_NE(what.find(field), std::string::npos) << "message '" << what << "' lacks " << field;
    EXPECT_EQ(what.find("--"), std::string::npos) << "a library message names a CLI flag: " << what;
    if (field != "overflow") EXPECT_TRUE(names_field(e, field)) << what << ": fields() lacks " << field;
  }
}

TEST(Problem, DefaultsAndNormalize) {
  Problem p;
  p.normalize();
  EXPECT_EQ(p.kv_heads, p.heads);
  EXPECT_EQ(p.kv_seq, p.seq);
  EXPECT_NO_THROW(p.validate());
  EXPECT_DOUBLE_EQ(p.softmax_scale(), 1.0 / 8.0);
  p.scale = 0.25;
  EXPECT_DOUBLE_EQ(p.softmax_scale(), 0.25);
  EXPECT_EQ(small().shape_key(), "2_4_16_32");
  Problem g = small();
  g.kv_heads = 1;
  EXPECT_NO_THROW(g.validate());
  EXPECT_EQ(g.group(), 4);
  g.head_dim = 256;
  EXPECT_NO_THROW(g.validate());
  EXPECT_EQ(small().q_bytes(), static_cast<std::size_t>(2 * 4 * 16 * 32 * 2));
  EXPECT_EQ(g.kv_bytes(), static_cast<std::size_t>(2 * 1 * 16 * 256 * 2));
}

TEST(Problem, ValidateNamesTheField) {
  auto with = [](std::function<void(Problem&)> f) {
    Problem p = small();
    f(p);
    return p;
  };
  expect_invalid(with([](Problem& p) { p.batch = 0; }), "batch");
  expect_invalid(with([](Problem& p) { p.batch = -1; }), "batch");
  expect_invalid(with([](Problem& p) { p.heads = 0; }), "heads");
  expect_invalid(with([](Problem& p) { p.heads = -8; }), "heads");
  expect_invalid(with([](Problem& p) { p.kv_heads = -2; }), "kv_heads");
  expect_invalid(with([](Problem& p) { p.seq = 0; }), "seq");
  expect_invalid(with([](Problem& p) { p.seq = -5; }), "seq");
  expect_invalid(with([](Problem& p) { p.kv_seq = -1; }), "kv_seq");
  expect_invalid(with([](Problem& p) { p.head_dim = 0; }), "head_dim");
  expect_invalid(with([](Problem& p) { p.head_dim = 257; }), "head_dim");
  expect_invalid(with([](Problem& p) { p.head_dim = 1000; }), "head_dim");
  expect_invalid(with([](Problem& p) { p.kv_heads = 3; }), "kv_heads");  // 3 does not divide 4
  expect_invalid(with([](Problem& p) { p.kv_heads = 8; }), "kv_heads");  // more than heads
  expect_invalid(with([](Problem& p) { p.seq = 99999999999; }), "seq");
  expect_invalid(with([](Problem& p) { p.kv_seq = std::int64_t{1} << 40; }), "kv_seq");
  expect_invalid(with([](Problem& p) { p.batch = std::int64_t{1} << 30; }), "batch");
  expect_invalid(with([](Problem& p) {  // the product would overflow int64
                   p.batch = std::int64_t{1} << 32;
                   p.heads = std::int64_t{1} << 32;
                   p.kv_heads = 1;
                 }),
                 "batch");
  expect_invalid(with([](Problem& p) { p.mask = MaskKind::SlidingWindow; }), "window");
  expect_invalid(with([](Problem& p) { p.window = 4; }), "window");
  expect_invalid(with([](Problem& p) { p.scale = std::numeric_limits<double>::quiet_NaN(); }), "scale");
  expect_invalid(with([](Problem& p) { p.scale = std::numeric_limits<double>::infinity(); }), "scale");
  expect_invalid(with([](Problem& p) { p.scale = -std::numeric_limits<double>::infinity(); }), "scale");
  expect_invalid(with([](Problem& p) { p.dtype = DType::Bool; }), "dtype");
  // A scale whose scores overflow the dtype: |scale| x head_dim past its largest finite value.
  expect_invalid(with([](Problem& p) { p.scale = 1e300; }), "overflow");
  expect_invalid(with([](Problem& p) {
                   p.dtype = DType::F16;
                   p.head_dim = 64;
                   p.scale = -1100.0;  // 64 x 1100 > 65504
                 }),
                 "scale");
  Problem fp16_edge = with([](Problem& p) {
    p.dtype = DType::F16;
    p.head_dim = 64;
    p.scale = 1000.0;  // 64000 <= 65504
  });
  EXPECT_NO_THROW(fp16_edge.validate());
  // The mismatched-heads message names both fields.
  expect_invalid(with([](Problem& p) {
                   p.heads = 8;
                   p.kv_heads = 3;
                 }),
                 "heads");
  Problem ok = with([](Problem& p) {
    p.mask = MaskKind::SlidingWindow;
    p.window = 4;
    p.scale = -0.5;  // negative but finite scales are legal
  });
  EXPECT_NO_THROW(ok.validate());
}

TEST(Problem, MaskNames) {
  for (MaskKind m : {MaskKind::None, MaskKind::Causal, MaskKind::CausalBottomRight, MaskKind::SlidingWindow,
                     MaskKind::Boolean, MaskKind::Bias}) {
    const auto name = mask_name(m);
    EXPECT_EQ(parse_mask(name), m) << name;
    EXPECT_NE(mask_choices().find(name), std::string_view::npos) << name;
  }
  EXPECT_EQ(parse_mask("causal-top-left"), MaskKind::Causal);
  EXPECT_FALSE(parse_mask("diagonal").has_value());
}

using testing::expected_visible;

struct MaskCase {
  MaskKind mask;
  std::int64_t seq, kv_seq, window;
  std::int64_t pairs, fully_masked;  // worked out by hand
};

class MaskTest : public ::testing::TestWithParam<MaskCase> {};

TEST_P(MaskTest, VisiblePairsAndFullyMaskedRows) {
  const MaskCase& c = GetParam();
  Problem p = small(c.mask);
  p.seq = c.seq;
  p.kv_seq = c.kv_seq;
  p.window = c.window;
  ASSERT_NO_THROW(p.validate());
  std::int64_t pairs = 0, masked_rows = 0;
  for (std::int64_t i = 0; i < p.seq; ++i) {
    std::int64_t row = 0;
    for (std::int64_t j = 0; j < p.kv_seq; ++j) {
      ASSERT_EQ(p.visible(i, j), expected_visible(p, i, j)) << "row " << i << " key " << j;
      row += p.visible(i, j);
    }
    pairs += row;
    masked_rows += row == 0;
  }
  EXPECT_EQ(pairs, c.pairs);
  EXPECT_EQ(p.visible_pairs(), c.pairs);
  EXPECT_EQ(masked_rows, c.fully_masked);
  EXPECT_EQ(p.fully_masked_rows(), c.fully_masked);
  EXPECT_DOUBLE_EQ(p.flops(), 4.0 * 2 * 4 * static_cast<double>(c.pairs) * 32);
}

INSTANTIATE_TEST_SUITE_P(
    Masks, MaskTest,
    ::testing::Values(MaskCase{MaskKind::None, 4, 6, 0, 24, 0},                       //
                      MaskCase{MaskKind::Causal, 4, 4, 0, 10, 0},                     // 1+2+3+4
                      MaskCase{MaskKind::Causal, 4, 6, 0, 10, 0},                     // top-left ignores the extra keys
                      MaskCase{MaskKind::Causal, 6, 4, 0, 1 + 2 + 3 + 4 + 4 + 4, 0},  //
                      MaskCase{MaskKind::CausalBottomRight, 4, 4, 0, 10, 0},          // square: same as top-left
                      MaskCase{MaskKind::CausalBottomRight, 4, 6, 0, 18, 0},          // 3+4+5+6
                      MaskCase{MaskKind::CausalBottomRight, 6, 4, 0, 10, 2},          // 0+0+1+2+3+4
                      MaskCase{MaskKind::CausalBottomRight, 5, 1, 0, 1, 4},           // only the last row sees the key
                      MaskCase{MaskKind::SlidingWindow, 5, 5, 2, 9, 0},               // 1+2+2+2+2
                      MaskCase{MaskKind::SlidingWindow, 4, 8, 3, 12, 0},              // 3 each
                      MaskCase{MaskKind::SlidingWindow, 6, 4, 2, 7, 2},               // 0+0+1+2+2+2
                      MaskCase{MaskKind::SlidingWindow, 5, 5, 1, 5, 0},               // the diagonal
                      MaskCase{MaskKind::Boolean, 4, 6, 0, 24, 0},                    // tensors decide
                      MaskCase{MaskKind::Bias, 3, 5, 0, 15, 0}));

TEST(Problem, DescribeMentionsEverything) {
  Problem p = small(MaskKind::SlidingWindow);
  p.window = 3;
  p.kv_heads = 2;
  p.kv_seq = 20;
  p.dtype = DType::F16;
  const std::string d = p.describe();
  for (const char* want :
       {"batch 2", "heads 4", "kv 2", "seq 16", "kv 20", "head_dim 32", "fp16", "sliding-window 3", "cpu"}) {
    EXPECT_NE(d.find(want), std::string::npos) << d << " lacks " << want;
  }
}

}  // namespace
}  // namespace attnprof

namespace attnprof {
namespace {

TEST(Problem, PassNamesFlopsAndDeterminism) {
  EXPECT_EQ(parse_pass("backward"), Pass::Backward);
  EXPECT_EQ(parse_pass("train"), Pass::Train);
  EXPECT_FALSE(parse_pass("Backward"));
  for (Pass x : {Pass::Forward, Pass::Backward, Pass::Train}) EXPECT_EQ(parse_pass(pass_name(x)), x);

  Problem p;
  p.batch = 2, p.heads = 4, p.seq = 128, p.head_dim = 64, p.mask = MaskKind::None;
  p.normalize().validate();
  const double fwd = 4.0 * 2 * 4 * 128 * 128 * 64;
  EXPECT_DOUBLE_EQ(p.flops(), fwd);
  EXPECT_EQ(p.gradient_bytes(), 0u);
  p.pass = Pass::Backward;
  EXPECT_DOUBLE_EQ(p.flops(), 2.5 * fwd);  // five products to the forward's two
  EXPECT_DOUBLE_EQ(p.forward_flops(), fwd);
  EXPECT_EQ(p.gradient_bytes(), 4 * p.q_bytes());  // dO, dQ, dK, dV (no grouping here)
  p.pass = Pass::Train;
  EXPECT_DOUBLE_EQ(p.flops(), 3.5 * fwd);
  EXPECT_NE(p.describe().find("train pass"), std::string::npos) << p.describe();
  // Runs of one shape with another pass write other files.
  EXPECT_EQ(p.file_stem(), "2_4_128_64_train");
  p.pass = Pass::Forward;
  EXPECT_EQ(p.file_stem(), p.shape_key());
  p.pass = Pass::Train;

  p.deterministic = true;
  EXPECT_NO_THROW(p.validate());
  p.pass = Pass::Forward;
  try {
    p.validate();
    FAIL() << "deterministic on a forward must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("deterministic applies to the backward"), std::string::npos) << e.what();
    EXPECT_TRUE(names_field(e, "deterministic")) << e.what();
  }
}

// A backend with a forward only: Backward and Train are refused by name,
// whatever its own eligibility says, and its base backward refuses too.
class ForwardOnly final : public Backend {
 public:
  std::string_view name() const override { return "forward_only"; }
  Device device() const override { return Device::Cpu; }
  Eligibility eligibility(const Problem&) const override { return {true, "runs anything"}; }
  std::size_t workspace_bytes(const Problem&) const override { return 0; }
  Expectation expectation(const Problem&) const override { return {}; }
  void forward(const Problem&, const Inputs&, Tensor&, RunContext&) override {}
};

TEST(Problem, BackendsWithoutABackwardAreRefusedForBackwardAndTrain) {
  ForwardOnly b;
  Problem p;
  p.normalize();
  EXPECT_TRUE(eligibility_of(b, p).eligible);
  for (Pass x : {Pass::Backward, Pass::Train}) {
    p.pass = x;
    const Eligibility e = eligibility_of(b, p);
    EXPECT_FALSE(e.eligible);
    EXPECT_EQ(e.reason, "forward_only has no backward pass: use pass=forward, or a backend with one");
  }
  Saved saved;
  Gradients g;
  Tensor out;
  RunContext ctx{cpu_allocator()};
  EXPECT_THROW(b.forward_train(p, Inputs{}, out, saved, ctx), Error);
  EXPECT_THROW(b.backward(p, Inputs{}, out, out, saved, g, ctx), Error);
}

}  // namespace
}  // namespace attnprof
