// Issue 57 item 6 on CUDA, NaN from finite inputs. The fused kernels' online
// softmax (softmax_online.cuh) takes each bf16/fp16 exponent as one FMA,
// s x scale_log2 - base, against a base rounded to FP32: the row max's own p
// is 2^(half an ulp of the base at most), past ex2's range from base 2^31 on.
// Rounding every product first (fa395bc) held to 2^126 but cost the H100's
// forward 4-6% (docs/perf/forward.md, 2026-12-07), so bf16's documented range stops
// at 2^30 (limits.h), and a row past it is NaN, never zeros or inf.
// - Inside the documented range (attnprof/limits.h, scores_in_range), the
//   CPU's in-range cases (tests/cpu/score_range_cases.h) on efficient and
//   flash, the tiled kernels and (one and three queries) flash's decode
//   kernel: no NaN row, and within the dtype's tolerance of float64.
// - Past it, rows on both sides of 2^31 and the issue's own case (scale
//   2^60, |q| near 1e20, rows near 2^128): a row below 2^30.9 is never NaN,
//   and every row is NaN or finite and not all zeros (a p that under- or
//   overflowed is caught by OnlineSoftmax::finish).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/limits.h"
#include "attnprof/reference.h"
#include "attnprof/runner.h"
#include "backends/cuda/cuda_backends.h"
#include "cpu/score_range_cases.h"
#include "gpu/gpu_test.h"

namespace attnprof {
namespace {

// b's forward of the host problem `host_p` on the GPU, downloaded.
Tensor forward_on_cuda(Backend& b, const Problem& host_p, const Inputs& host) {
  DeviceRuntime& rt = cuda::runtime();
  Problem p = host_p;
  p.device = Device::Cuda;
  p.validate();
  const Inputs in = rt.upload(host);
  Tensor out = rt.upload(testing::nan_tensor(host_p, host_p.heads, host_p.seq));
  RunContext ctx{rt.allocator(), rt.stream(), 0};
  b.forward(p, in, out, ctx);
  rt.synchronize();
  return rt.download(out);
}

bool eligible_on_cuda(Backend& b, Problem p) {
  p.device = Device::Cuda;
  p.validate();
  return eligibility_of(b, p).eligible;
}

TEST(ScoreRangeCuda, LargeScoresInsideTheRangeMatchFloat64) {
  REQUIRE_GPU();
  int ran = 0;
  for (const char* name : {"efficient", "flash"}) {
    Backend* b = find_backend(name, Device::Cuda);
    ASSERT_NE(b, nullptr) << name;
    for (const testing::LargeScoreCase& c : testing::large_score_cases()) {
      if (c.cpu_only) continue;  // past bf16's bound: the test below
      // The tiled kernels (40 queries), and flash's decode kernel (1 and 3).
      for (const std::int64_t seq : {std::int64_t{40}, std::int64_t{1}, std::int64_t{3}}) {
        Problem host_p = testing::large_score_problem(c);
        host_p.seq = seq;
        host_p.validate();
        if (!eligible_on_cuda(*b, host_p)) continue;  // fp32 has no fused kernel
        ++ran;
        const std::string label = std::string(name) + " " + c.name + " seq " + std::to_string(seq);
        const Inputs host = testing::large_score_inputs(c, host_p);
        const Tensor out = forward_on_cuda(*b, host_p, host);
        const ErrorStats e = check_against_reference(host_p, host, out, sample_rows(host_p, 1 << 20));
        testing::expect_flash_accurate(host_p, e, label);
      }
    }
  }
  EXPECT_GE(ran, 8) << "the bf16 cases on efficient and flash, tiled and decode";
}

// Per query row (b, h, i) of a dense problem: the largest |scale x q . k x
// log2 e| over its keys (its mask's), in float64.
std::vector<double> row_logit_max(const Problem& p, const Inputs& in) {
  std::vector<double> m;
  const double f = std::abs(p.softmax_scale()) * std::numbers::log2e;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t h = 0; h < p.heads; ++h) {
      const std::int64_t hk = h / p.group();
      for (std::int64_t i = 0; i < p.seq; ++i) {
        double best = 0;
        for (std::int64_t j = 0; j < p.kv_seq; ++j) {
          double s = 0;
          for (std::int64_t d = 0; d < p.head_dim; ++d) s += double{in.q.get(b, h, i, d)} * in.k.get(b, hk, j, d);
          best = std::max(best, std::abs(s) * f);
        }
        m.push_back(best);
      }
    }
  }
  return m;
}

// Per row: whether it holds a NaN, and whether it is all zeros.
struct RowKinds {
  std::vector<bool> nan, zero;
  bool any_inf = false;
};
RowKinds row_kinds(const Problem& p, const Tensor& out) {
  RowKinds k;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t h = 0; h < p.heads; ++h) {
      for (std::int64_t i = 0; i < p.seq; ++i) {
        bool nan = false, zero = true;
        for (std::int64_t d = 0; d < p.head_dim; ++d) {
          const float x = out.get(b, h, i, d);
          nan |= std::isnan(x);
          zero &= x == 0.f;
          k.any_inf |= std::isinf(x);
        }
        k.nan.push_back(nan);
        k.zero.push_back(zero);
      }
    }
  }
  return k;
}

// The problem (scale 2^60, k up to 4: make_inputs' uniform [-1, 1)
// times 4, no mask, as SDPA was called) with q scaled by powers of two (exact
// in bf16) so that the median row's largest base-2 logit is `median`, each
// row 4x up (even rows) or down (odd ones): a row's largest logit is within
// a factor of two of the median (150 keys), so both sides of a bound near
// the median are present. `logits` gets each row's, in float64.
Inputs rows_around(const Problem& host_p, double median, std::vector<double>& logits) {
  Inputs host = make_inputs(host_p, 57, cpu_allocator());
  testing::scale_tensor(host.k, 4.0f);
  logits = row_logit_max(host_p, host);
  std::vector<double> sorted = logits;
  std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
  const double factor = std::exp2(std::round(std::log2(median / sorted[sorted.size() / 2])));
  std::size_t r = 0;
  for (std::int64_t b = 0; b < host_p.batch; ++b) {
    for (std::int64_t h = 0; h < host_p.heads; ++h) {
      for (std::int64_t i = 0; i < host_p.seq; ++i, ++r) {
        const double f = factor * (r % 2 == 0 ? 4.0 : 0.25);
        for (std::int64_t d = 0; d < host_p.head_dim; ++d) {
          host.q.set(b, h, i, d, static_cast<float>(double{host.q.get(b, h, i, d)} * f));
        }
        logits[r] *= f;
      }
    }
  }
  return host;
}

TEST(ScoreRangeCuda, PastTheRangeARowIsNanNeverZerosOrInf) {
  REQUIRE_GPU();
  ASSERT_FALSE(limits::scores_in_range(DType::BF16, limits::kScaleAbsMax, 64, 1e20, 4.0));
  int ran = 0;
  // The fused kernels' bound (2^31), and the case (FP32's 2^128; q
  // near 1e20); the tiled kernels (40 queries) and flash's decode kernel (1).
  for (const std::int64_t seq : {std::int64_t{40}, std::int64_t{1}}) {
    for (const double median : {0x1p31, 0x1p128}) {
      Problem host_p = testing::to_problem(
          testing::Shape{.heads = 2, .seq = seq, .kv_seq = 150, .head_dim = 64, .scale = limits::kScaleAbsMax},
          DType::BF16, MaskKind::None);
      host_p.validate();
      std::vector<double> logits;
      const Inputs host = rows_around(host_p, median, logits);
      std::int64_t below = 0;
      for (const double l : logits) below += l < 0x1p30 * 1.866;  // 2^30.9: a margin for the GEMM's rounding
      if (seq > 1 && median < 0x1p64) {
        ASSERT_GT(below, 0);  // both kinds of row, or the case proves nothing
        ASSERT_LT(below, static_cast<std::int64_t>(logits.size()));
      }
      for (const char* name : {"efficient", "flash"}) {
        Backend* b = find_backend(name, Device::Cuda);
        ASSERT_NE(b, nullptr) << name;
        if (!eligible_on_cuda(*b, host_p)) continue;
        ++ran;
        const std::string label = std::string(name) + " seq " + std::to_string(seq) + " rows around 2^" +
                                  std::to_string(static_cast<int>(std::log2(median)));
        const RowKinds k = row_kinds(host_p, forward_on_cuda(*b, host_p, host));
        EXPECT_FALSE(k.any_inf) << label;
        int nan = 0;
        for (std::size_t r = 0; r < k.nan.size(); ++r) {
          nan += k.nan[r];
          EXPECT_FALSE(k.nan[r] && logits[r] < 0x1p30 * 1.866)
              << label << ": row " << r << " is NaN though its largest base-2 logit is " << logits[r] << " (< 2^30.9)";
          EXPECT_FALSE(k.zero[r]) << label << ": row " << r << " is zeros (logit " << logits[r] << ")";
        }
        ::testing::Test::RecordProperty(label + " nan_rows", nan);
      }
    }
  }
  EXPECT_GE(ran, 4);
}

}  // namespace
}  // namespace attnprof
