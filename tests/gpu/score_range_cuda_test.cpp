// Issue 57 item 6 on CUDA, NaN from finite inputs. The fused kernels' online
// softmax (softmax_online.cuh) and the decode kernel's merge (flash_decode.cuh)
// took each exponent as one FMA, s x scale_log2 - base, against a base rounded
// to FP32: half an ulp of the base apart for the row's largest score, which
// from base 2^31 on is past ex2's range (p = inf, then inf / inf = NaN, or a
// rescale factor of 0). The CPU kernels had the same fault (commit
// "NaN from finite inputs"); both now round the product first.
// - Inside the documented range (attnprof/limits.h, scores_in_range), the
//   CPU's cases (tests/cpu/score_range_cases.h) on efficient and flash, the
//   tiled kernels and (one and three queries) flash's decode kernel: no NaN
//   row, and within the dtype's tolerance of float64.
// - The issue's case (scale 2^60, |q| near 1e20, k up to 4, outside the
//   range): a row NaN only where the row's own base-2 logits, in float64,
//   pass FP32's 2^128 (where SDPA's float32 is NaN too); the CPU flash's NaN
//   rows are recorded beside it (its fp32 path pre-scales q, so it reaches
//   inf sooner), not compared row by row.
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

std::vector<bool> nan_rows(const Problem& p, const Tensor& out) {
  std::vector<bool> r;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t h = 0; h < p.heads; ++h) {
      for (std::int64_t i = 0; i < p.seq; ++i) {
        bool nan = false;
        for (std::int64_t d = 0; d < p.head_dim; ++d) nan |= std::isnan(out.get(b, h, i, d));
        r.push_back(nan);
      }
    }
  }
  return r;
}

TEST(ScoreRangeCuda, TheIssuesCaseGivesNanOnlyWhereARowsLogitsPassFp32) {
  REQUIRE_GPU();
  // The issue's case: scale 2^60, |q| near 1e20, k up to 4 (make_inputs'
  // uniform [-1, 1) times 4); no mask, as SDPA was called.
  Problem host_p = testing::to_problem(
      testing::Shape{.heads = 2, .seq = 40, .kv_seq = 150, .head_dim = 64, .scale = limits::kScaleAbsMax}, DType::BF16,
      MaskKind::None);
  host_p.validate();
  ASSERT_FALSE(limits::scores_in_range(host_p.dtype, limits::kScaleAbsMax, 64, 1e20, 4.0));
  // q's factor, a power of two near 1e20 (exact in bf16), puts the median
  // row's largest logit at 2^128: about half the rows on each side.
  Inputs host = make_inputs(host_p, 57, cpu_allocator());
  testing::scale_tensor(host.k, 4.0f);
  std::vector<double> logits = row_logit_max(host_p, host);
  std::vector<double> sorted = logits;
  std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
  const double factor = std::exp2(std::round(std::log2(0x1p128 / sorted[sorted.size() / 2])));
  ASSERT_GT(factor, 1e18);
  ASSERT_LT(factor, 1e22);
  // Each row's own power of two around it, 4x up on even rows and down on
  // odd ones: a row's largest logit is within a factor of two of the median
  // (150 keys), so one factor alone put every row past 2^128 on an H100.
  std::size_t r = 0;
  for (std::int64_t b = 0; b < host_p.batch; ++b) {
    for (std::int64_t h = 0; h < host_p.heads; ++h) {
      for (std::int64_t i = 0; i < host_p.seq; ++i, ++r) {
        const double f = factor * (r % 2 == 0 ? 4.0 : 0.25);
        for (std::int64_t d = 0; d < host_p.head_dim; ++d) {
          host.q.set(b, h, i, d, static_cast<float>(double{host.q.get(b, h, i, d)} * f));  // exact: a power of two
        }
        logits[r] *= f;
      }
    }
  }
  std::int64_t past = 0;
  for (const double l : logits) past += l >= 0x1p128;
  // Both kinds of row, or the case proves nothing.
  ASSERT_GT(past, 0);
  ASSERT_LT(past, static_cast<std::int64_t>(logits.size()));

  Backend* cpu_flash = find_backend("flash", Device::Cpu);
  ASSERT_NE(cpu_flash, nullptr);
  Tensor cpu_out = testing::nan_tensor(host_p, host_p.heads, host_p.seq);
  RunContext cpu_ctx{.allocator = cpu_allocator(), .threads = 2};
  cpu_flash->forward(host_p, host, cpu_out, cpu_ctx);
  const std::vector<bool> cpu_nan = nan_rows(host_p, cpu_out);
  ::testing::Test::RecordProperty("cpu_flash_nan_rows",
                                  static_cast<int>(std::count(cpu_nan.begin(), cpu_nan.end(), true)));
  ::testing::Test::RecordProperty("rows_past_fp32", static_cast<int>(past));

  for (const char* name : {"efficient", "flash"}) {
    Backend* b = find_backend(name, Device::Cuda);
    ASSERT_NE(b, nullptr) << name;
    if (!eligible_on_cuda(*b, host_p)) continue;
    const std::vector<bool> nan = nan_rows(host_p, forward_on_cuda(*b, host_p, host));
    int count = 0;
    for (std::size_t r = 0; r < nan.size(); ++r) {
      count += nan[r];
      // 2^127.9: a margin for the FP32 GEMM's own rounding of the scores.
      EXPECT_FALSE(nan[r] && logits[r] < 0x1p127 * 1.866)
          << name << ": row " << r << " is NaN though its largest base-2 logit is " << logits[r] << " (< 2^127.9)";
    }
    ::testing::Test::RecordProperty(std::string(name) + "_nan_rows", count);
  }
}

}  // namespace
}  // namespace attnprof
