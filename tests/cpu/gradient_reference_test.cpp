// The float64 gradient reference (reference.h: check_gradients_against_reference),
// itself checked against central finite differences of a float64 forward:
// every backward pass of issue 9 is judged by it, so it is judged first.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "attnprof/reference.h"
#include "common/test_problem.h"

namespace attnprof {
namespace {

using testing::for_each_index;
using testing::Shape;
using testing::to_problem;

// L = sum O . dO in float64, O = softmax(scale Q K^T + mask) V, a fully
// masked row giving zeros. q, k, v are the inputs widened to double.
struct Dense {
  const Problem& p;
  const Inputs& in;
  const Tensor& dout;
  std::vector<double> q, k, v;  // [B,H,S,D], [B,Hkv,Skv,D] flattened

  Dense(const Problem& p_, const Inputs& in_, const Tensor& dout_) : p(p_), in(in_), dout(dout_) {
    for (const auto& [dst, t] : {std::pair{&q, &in.q}, std::pair{&k, &in.k}, std::pair{&v, &in.v}}) {
      for_each_index(*t, [&](auto a, auto b, auto c, auto d) { dst->push_back(t->get(a, b, c, d)); });
    }
  }
  std::size_t qi(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t d) const {
    return static_cast<std::size_t>(((b * p.heads + h) * p.seq + i) * p.head_dim + d);
  }
  std::size_t ki(std::int64_t b, std::int64_t hk, std::int64_t j, std::int64_t d) const {
    return static_cast<std::size_t>(((b * p.kv_heads + hk) * p.kv_seq + j) * p.head_dim + d);
  }
  bool keep(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    if (p.mask == MaskKind::Boolean) return in.mask.get(b, h, i, j) != 0.0f;
    return p.mask == MaskKind::Bias || p.visible(i, j);
  }
  double loss() const {
    double total = 0;
    const double scale = p.softmax_scale();
    for (std::int64_t b = 0; b < p.batch; ++b) {
      for (std::int64_t h = 0; h < p.heads; ++h) {
        const std::int64_t hk = h / p.group();
        for (std::int64_t i = 0; i < p.seq; ++i) {
          std::vector<double> s(static_cast<std::size_t>(p.kv_seq), -INFINITY);
          double mx = -INFINITY;
          for (std::int64_t j = 0; j < p.kv_seq; ++j) {
            if (!keep(b, h, i, j)) continue;
            double x = 0;
            for (std::int64_t d = 0; d < p.head_dim; ++d) x += q[qi(b, h, i, d)] * k[ki(b, hk, j, d)];
            x *= scale;
            if (p.mask == MaskKind::Bias) x += in.bias.get(b, h, i, j);
            s[static_cast<std::size_t>(j)] = x;
            mx = std::max(mx, x);
          }
          if (mx == -INFINITY) continue;  // fully masked: O = 0
          double sum = 0;
          for (auto& x : s) sum += (x = std::exp(x - mx));
          for (std::int64_t d = 0; d < p.head_dim; ++d) {
            double o = 0;
            for (std::int64_t j = 0; j < p.kv_seq; ++j) o += s[static_cast<std::size_t>(j)] / sum * v[ki(b, hk, j, d)];
            total += o * dout.get(b, h, i, d);
          }
        }
      }
    }
    return total;
  }
  // dL/dx by central differences, written into a float tensor shaped like `like`.
  Tensor gradient(std::vector<double>& x, const Tensor& like) {
    Tensor g = Tensor::empty(like.sizes(), DType::F32, cpu_allocator());
    std::size_t n = 0;
    for_each_index(g, [&](auto a, auto b, auto c, auto d) {
      const double h = 1e-5, keep_x = x[n];
      x[n] = keep_x + h;
      const double up = loss();
      x[n] = keep_x - h;
      const double down = loss();
      x[n] = keep_x;
      g.data_as<float>()[((a * g.size(1) + b) * g.size(2) + c) * g.size(3) + d] =
          static_cast<float>((up - down) / (2 * h));
      ++n;
    });
    return g;
  }
};

struct Case {
  const char* name;
  Shape shape;
  MaskKind mask;
};

class GradientReference : public ::testing::TestWithParam<Case> {};

TEST_P(GradientReference, AgreesWithFiniteDifferences) {
  const Case& c = GetParam();
  const Problem p = to_problem(c.shape, DType::F32, c.mask);
  const Inputs in = make_inputs(p, 11, cpu_allocator());
  const Tensor dout = make_dout(p, 11, cpu_allocator());
  Dense dense(p, in, dout);
  const Gradients fd{dense.gradient(dense.q, in.q), dense.gradient(dense.k, in.k), dense.gradient(dense.v, in.v)};
  const RowSample all_q = sample_rows(p, 1 << 20), all_kv = sample_kv_rows(p, 1 << 20);
  ASSERT_EQ(all_q.rows.size(), static_cast<std::size_t>(p.batch * p.heads * p.seq));
  ASSERT_EQ(all_kv.rows.size(), static_cast<std::size_t>(p.batch * p.kv_heads * p.kv_seq));
  const GradientErrors e = check_gradients_against_reference(p, in, dout, fd, all_q, all_kv);
  for (const ErrorStats* s : {&e.dq, &e.dk, &e.dv}) {
    EXPECT_LT(s->rel, 1e-6) << c.name << " rel " << s->rel;  // about 2e-8 here: the stored gradients are float
    EXPECT_EQ(s->nan_rows, 0) << c.name;
  }

  // A wrong gradient is seen: one element of each off by a little.
  for (Tensor* t : {const_cast<Tensor*>(&fd.dq), const_cast<Tensor*>(&fd.dk), const_cast<Tensor*>(&fd.dv)}) {
    t->data_as<float>()[t->numel() / 2] += 1e-2f;
  }
  const GradientErrors off = check_gradients_against_reference(p, in, dout, fd, all_q, all_kv);
  for (const ErrorStats* s : {&off.dq, &off.dk, &off.dv}) EXPECT_GT(s->max_abs, 5e-3) << c.name;
}

INSTANTIATE_TEST_SUITE_P(
    Cpu, GradientReference,
    ::testing::Values(
        Case{"none", {.batch = 1, .heads = 2, .seq = 5, .kv_seq = 7, .head_dim = 4}, MaskKind::None},
        Case{"causal_gqa", {.batch = 2, .heads = 4, .kv_heads = 2, .seq = 6, .head_dim = 3}, MaskKind::Causal},
        Case{"bottom_right_q7_k4",
             {.batch = 1, .heads = 2, .kv_heads = 1, .seq = 7, .kv_seq = 4, .head_dim = 4},
             MaskKind::CausalBottomRight},
        Case{"window", {.heads = 2, .seq = 6, .head_dim = 4, .window = 2}, MaskKind::SlidingWindow},
        Case{"bias", {.heads = 1, .seq = 4, .kv_seq = 5, .head_dim = 3}, MaskKind::Bias}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(GradientReference, FullyMaskedRowsHaveZeroGradientsAndNaNIsCounted) {
  // Bottom-right causal with more queries than keys: the first rows see no key.
  const Problem p =
      to_problem(Shape{.heads = 1, .seq = 6, .kv_seq = 3, .head_dim = 4}, DType::F32, MaskKind::CausalBottomRight);
  const Inputs in = make_inputs(p, 3, cpu_allocator());
  const Tensor dout = make_dout(p, 3, cpu_allocator());
  Dense dense(p, in, dout);
  Gradients g{dense.gradient(dense.q, in.q), dense.gradient(dense.k, in.k), dense.gradient(dense.v, in.v)};
  for (std::int64_t d = 0; d < p.head_dim; ++d) EXPECT_EQ(g.dq.get(0, 0, 0, d), 0.0f) << "row 0 sees no key";
  const GradientErrors ok =
      check_gradients_against_reference(p, in, dout, g, sample_rows(p, 64), sample_kv_rows(p, 64));
  EXPECT_LT(ok.dq.rel, 1e-6);
  g.dq.data_as<float>()[1] = NAN;  // row 0, fully masked
  const GradientErrors bad =
      check_gradients_against_reference(p, in, dout, g, sample_rows(p, 64), sample_kv_rows(p, 64));
  EXPECT_EQ(bad.dq.nan_rows, 1);
  EXPECT_EQ(bad.dq.nan_rows_fully_masked, 0) << "a gradient has no NaN convention: zeros are the answer";
}

TEST(GradientReference, KvRowSampleIsBoundedAndKeepsTheEdges) {
  const Problem p = to_problem(Shape{.batch = 4, .heads = 16, .kv_heads = 4, .seq = 1024, .head_dim = 64}, DType::BF16,
                               MaskKind::Causal);
  const RowSample s = sample_kv_rows(p, 96);
  EXPECT_LE(s.rows.size(), 96u);
  EXPECT_GE(s.rows.size(), 6u);
  EXPECT_EQ(s.rows.front(), 0);                                   // the first key of the first pair
  EXPECT_EQ(s.rows.back(), p.batch * p.kv_heads * p.kv_seq - 1);  // the last key of the last pair
  EXPECT_TRUE(std::is_sorted(s.rows.begin(), s.rows.end()));
}

}  // namespace
}  // namespace attnprof
