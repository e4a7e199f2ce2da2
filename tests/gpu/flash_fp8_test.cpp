// flash's FP8 (e4m3) forward on sm90a at the kernel's own interface
// (FusedParams, launch_flash): random reals quantized per tensor with descale
// amax / 448, the bf16 output poisoned with NaN before the launch, checked
// against a float64 reference computed from the dequantized inputs (so what
// is measured is the kernel's arithmetic: P rounded to e4m3 for P V, FP32
// accumulation), on masks none, causal top-left and bottom-right and the
// window, kv_seq != seq, grouped-query heads and bshd strides, on both tile
// widths (128 keys, and 192 from 2048 keys); and the refusals, each in one line.
//
// Tolerance: P is rounded to e4m3 (3 mantissa bits: a relative error of at
// most 2^-4, about 2.5% RMS over a uniform spread), and O = sum p v / sum p
// carries that relative error in its RMS whatever the attention's spread, so
// the relative L2 error of O is held to 0.04 and the largest element error
// to 0.15 of O's largest magnitude; a wrong key order or P scale gives
// errors of order 1. bf16's output rounding (2^-9) is below both.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "attnprof/dtype.h"
#include "attnprof/problem.h"
#include "backends/cuda/launch/fused_kernels.h"
#include "gpu_test.h"

namespace attnprof {
namespace {

using cuda::FusedParams;

#define CUDA_OK(call)                                                          \
  do {                                                                         \
    const cudaError_t err_ = (call);                                           \
    ASSERT_EQ(err_, cudaSuccess) << #call << ": " << cudaGetErrorString(err_); \
  } while (0)

#define REQUIRE_FP8_KERNEL() \
  REQUIRE_GPU();             \
  if (!cuda::flash_sm90_runs_here()) GTEST_SKIP() << "flash's FP8 kernel runs on sm90a only (SKIPPED)"

struct Case {
  int batch, heads, kv_heads, seq_q, seq_k;
  MaskKind mask;
  int window = 0;
  bool bshd = false;  // [B, S, H, D] storage
};

// A tensor of reals quantized to e4m3 with descale amax / 448.
struct Quantized {
  std::vector<std::uint8_t> bits;
  float descale = 1.f;
  double at(std::size_t i) const { return static_cast<double>(e4m3_to_float(bits[i])) * descale; }
};

Quantized quantize(const std::vector<float>& real) {
  float amax = 0.f;
  for (const float x : real) amax = std::max(amax, std::fabs(x));
  Quantized q;
  q.descale = amax > 0.f ? amax / 448.f : 1.f;
  q.bits.resize(real.size());
  for (std::size_t i = 0; i < real.size(); ++i) q.bits[i] = float_to_e4m3(real[i] / q.descale);
  return q;
}

// The structural mask, as Problem::visible says it.
Problem mask_of(const Case& c) {
  Problem p{.batch = c.batch, .heads = c.heads, .kv_heads = c.kv_heads, .seq = c.seq_q, .kv_seq = c.seq_k};
  p.mask = c.mask;
  p.window = c.window;
  return p;
}

struct Result {
  double rel_l2 = 0, max_err = 0, max_ref = 0;
  std::int64_t nan = 0, nonzero_masked = 0;
};

// Element strides of a [B, H, S, D] view over [B, H, S, D] or [B, S, H, D] storage.
struct Strides {
  std::int64_t b, h, s;
};
Strides strides_of(const Case& c, int heads, int seq, int d) {
  if (c.bshd) return {static_cast<std::int64_t>(seq) * heads * d, d, static_cast<std::int64_t>(heads) * d};
  return {static_cast<std::int64_t>(heads) * seq * d, static_cast<std::int64_t>(seq) * d, d};
}

void run_case(const Case& c, std::uint32_t seed, Result& r) {
  constexpr int kD = cuda::kFlashFp8HeadDim;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto draw = [&](std::size_t n, float sd) {
    std::vector<float> x(n);
    for (float& v : x) v = sd * normal(rng);
    return x;
  };
  const std::size_t nq = static_cast<std::size_t>(c.batch) * c.heads * c.seq_q * kD;
  const std::size_t nk = static_cast<std::size_t>(c.batch) * c.kv_heads * c.seq_k * kD;
  // Scores of a few units: a softmax neither flat nor one-hot.
  const Quantized q = quantize(draw(nq, 1.5f)), k = quantize(draw(nk, 1.5f)), v = quantize(draw(nk, 1.f));
  const Strides sq = strides_of(c, c.heads, c.seq_q, kD), sk = strides_of(c, c.kv_heads, c.seq_k, kD);

  void *dq = nullptr, *dk = nullptr, *dv = nullptr, *dout = nullptr, *dvt = nullptr;
  FusedParams p;
  p.batch = c.batch;
  p.heads = c.heads;
  p.kv_heads = c.kv_heads;
  p.seq_q = c.seq_q;
  p.seq_k = c.seq_k;
  p.head_dim = kD;
  p.scale = 1.f / std::sqrt(static_cast<float>(kD));
  p.mask = c.mask;
  p.window = c.window;
  p.fp8 = true;
  p.bf16 = false;
  p.q_descale = q.descale;
  p.k_descale = k.descale;
  p.v_descale = v.descale;
  CUDA_OK(cudaMalloc(&dq, nq));
  CUDA_OK(cudaMalloc(&dk, nk));
  CUDA_OK(cudaMalloc(&dv, nk));
  CUDA_OK(cudaMalloc(&dout, nq * 2));
  CUDA_OK(cudaMalloc(&dvt, cuda::fp8_vt_bytes(p)));
  // The host vectors are [B, H, S, D]; bshd storage is filled element by element.
  auto store = [&](const Quantized& t, int heads, int seq, const Strides& st, void* dst) {
    std::vector<std::uint8_t> buf(t.bits.size());
    for (int b = 0; b < c.batch; ++b)
      for (int h = 0; h < heads; ++h)
        for (int s = 0; s < seq; ++s)
          for (int d = 0; d < kD; ++d)
            buf[b * st.b + h * st.h + s * st.s + d] =
                t.bits[((static_cast<std::size_t>(b) * heads + h) * seq + s) * kD + d];
    return cudaMemcpy(dst, buf.data(), buf.size(), cudaMemcpyHostToDevice);
  };
  CUDA_OK(store(q, c.heads, c.seq_q, sq, dq));
  CUDA_OK(store(k, c.kv_heads, c.seq_k, sk, dk));
  CUDA_OK(store(v, c.kv_heads, c.seq_k, sk, dv));
  CUDA_OK(cudaMemset(dout, 0xff, nq * 2));                // bf16 NaN everywhere
  CUDA_OK(cudaMemset(dvt, 0x7f, cuda::fp8_vt_bytes(p)));  // e4m3 NaN: the pre-pass must write every byte
  p.q = dq;
  p.k = dk;
  p.v = dv;
  p.o = dout;
  p.v_t = dvt;
  p.q_batch_stride = sq.b, p.q_head_stride = sq.h, p.q_row_stride = sq.s;
  p.k_batch_stride = sk.b, p.k_head_stride = sk.h, p.k_row_stride = sk.s;
  p.v_batch_stride = sk.b, p.v_head_stride = sk.h, p.v_row_stride = sk.s;
  p.o_batch_stride = sq.b, p.o_head_stride = sq.h, p.o_row_stride = sq.s;
  const char* why = cuda::fused_unsupported_reason(p, /*flash=*/true);
  ASSERT_EQ(why, nullptr) << why;
  CUDA_OK(cuda::launch_flash(p, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<std::uint16_t> out(nq);
  CUDA_OK(cudaMemcpy(out.data(), dout, nq * 2, cudaMemcpyDeviceToHost));
  for (void* ptr : {dq, dk, dv, dout, dvt}) CUDA_OK(cudaFree(ptr));

  const int group = c.heads / c.kv_heads;
  const Problem mask = mask_of(c);
  double err2 = 0, ref2 = 0;
  std::vector<double> s(c.seq_k), o(kD);
  for (int b = 0; b < c.batch; ++b) {
    for (int h = 0; h < c.heads; ++h) {
      const std::size_t q0 = (static_cast<std::size_t>(b) * c.heads + h) * c.seq_q * kD;
      const std::size_t k0 = (static_cast<std::size_t>(b) * c.kv_heads + h / group) * c.seq_k * kD;
      for (int i = 0; i < c.seq_q; ++i) {
        double mx = -INFINITY;
        for (int j = 0; j < c.seq_k; ++j) {
          if (!mask.visible(i, j)) {
            s[j] = -INFINITY;
            continue;
          }
          double dot = 0;
          for (int d = 0; d < kD; ++d) dot += q.at(q0 + i * kD + d) * k.at(k0 + j * kD + d);
          s[j] = dot * p.scale;
          mx = std::max(mx, s[j]);
        }
        std::fill(o.begin(), o.end(), 0.0);
        double l = 0;
        for (int j = 0; j < c.seq_k && mx > -INFINITY; ++j) {
          if (s[j] == -INFINITY) continue;
          const double e = std::exp(s[j] - mx);
          l += e;
          for (int d = 0; d < kD; ++d) o[d] += e * v.at(k0 + j * kD + d);
        }
        for (int d = 0; d < kD; ++d) {
          const double want = l > 0 ? o[d] / l : 0.0;
          const double got = bf16_to_float(out[b * sq.b + h * sq.h + i * sq.s + d]);
          if (std::isnan(got)) {
            ++r.nan;
            continue;
          }
          if (l == 0 && got != 0.0) ++r.nonzero_masked;
          err2 += (got - want) * (got - want);
          ref2 += want * want;
          r.max_err = std::max(r.max_err, std::fabs(got - want));
          r.max_ref = std::max(r.max_ref, std::fabs(want));
        }
      }
    }
  }
  r.rel_l2 = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
}

class FlashFp8 : public ::testing::TestWithParam<Case> {};

TEST_P(FlashFp8, MatchesFloat64OfTheDequantizedInputs) {
  REQUIRE_FP8_KERNEL();
  const Case& c = GetParam();
  Result r;
  run_case(c, 24u + static_cast<std::uint32_t>(c.seq_q * 7 + c.seq_k), r);
  if (HasFatalFailure()) return;
  EXPECT_EQ(r.nan, 0) << "elements left unwritten (NaN)";
  EXPECT_EQ(r.nonzero_masked, 0) << "fully masked rows must be zeros";
  EXPECT_LE(r.rel_l2, 0.04) << "relative L2 error";
  EXPECT_LE(r.max_err, 0.15 * r.max_ref) << "largest element error";
  std::cout << "[fp8] rel_l2 " << r.rel_l2 << " max_err " << r.max_err << " of " << r.max_ref << "\n";
}

INSTANTIATE_TEST_SUITE_P(
    Sm90, FlashFp8,
    ::testing::Values(Case{2, 4, 4, 256, 256, MaskKind::None}, Case{2, 4, 4, 256, 256, MaskKind::Causal},
                      Case{1, 4, 2, 200, 333, MaskKind::CausalBottomRight},   // ragged, kv_seq > seq, GQA
                      Case{1, 2, 2, 333, 200, MaskKind::CausalBottomRight},   // fully masked rows
                      Case{1, 4, 1, 300, 517, MaskKind::SlidingWindow, 100},  // MQA, window
                      Case{2, 4, 2, 129, 1000, MaskKind::None, 0, true},      // bshd strides
                      Case{1, 2, 2, 1024, 1024, MaskKind::Causal, 0, true},
                      // 192-key tiles (from kFp8WideTileKeys keys): ragged, bottom-right, GQA
                      Case{1, 2, 1, 130, 2100, MaskKind::None}, Case{1, 4, 2, 300, 2500, MaskKind::CausalBottomRight},
                      Case{1, 2, 2, 2049, 2049, MaskKind::SlidingWindow, 300},
                      // Rows of 12000 keys: their sums are taken on the tensor cores, whose e4m3
                      // products add with about 14 bits kept (summed whole: 0.15 relative error).
                      Case{1, 2, 2, 64, 12000, MaskKind::None}));

// The refusals, one line each: a head dim it is not built for, a descale of
// zero or not finite, a saved log-sum-exp (a backward), a packed batch.
TEST(FlashFp8, RefusesWhatItDoesNotTake) {
  REQUIRE_FP8_KERNEL();
  FusedParams p;
  p.batch = p.heads = p.kv_heads = 1;
  p.seq_q = p.seq_k = 64;
  p.head_dim = cuda::kFlashFp8HeadDim;
  p.scale = 0.1f;
  p.fp8 = true;
  void* const stand_in = reinterpret_cast<void*>(std::uintptr_t{256});
  p.q = p.k = p.v = p.o = p.v_t = stand_in;
  p.q_row_stride = p.k_row_stride = p.v_row_stride = p.o_row_stride = p.head_dim;
  p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = 64 * p.head_dim;
  p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = 64 * p.head_dim;
  ASSERT_EQ(cuda::fused_unsupported_reason(p, true), nullptr);
  auto refused = [&](FusedParams bad, const std::string& needle) {
    const char* why = cuda::fused_unsupported_reason(bad, true);
    ASSERT_NE(why, nullptr) << needle;
    const std::string text = why;
    EXPECT_NE(text.find(needle), std::string::npos) << text;
    EXPECT_EQ(text.find('\n'), std::string::npos) << text;
  };
  FusedParams bad = p;
  bad.head_dim = 64;
  bad.q_row_stride = bad.k_row_stride = bad.v_row_stride = bad.o_row_stride = 64;
  refused(bad, "head_dim 128");
  bad = p;
  bad.v_descale = 0.f;
  refused(bad, "descales");
  bad = p;
  bad.k_descale = INFINITY;
  refused(bad, "descales");
  bad = p;
  bad.lse = static_cast<float*>(stand_in);
  refused(bad, "forward only");
  bad = p;
  bad.softcap = 30.f;
  refused(bad, "soft cap");
  EXPECT_NE(cuda::fused_unsupported_reason(p, /*flash=*/false), nullptr) << "efficient takes no fp8";
}

}  // namespace
}  // namespace attnprof
