// The float64 check of the fused forwards (fused_forward_check.h).
#include "fused_forward_check.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace attnprof::testing::fused {
namespace {

#define CUDA_OK(call)                                                          \
  do {                                                                         \
    const cudaError_t err_ = (call);                                           \
    ASSERT_EQ(err_, cudaSuccess) << #call << ": " << cudaGetErrorString(err_); \
  } while (0)

std::uint16_t to_bits(float x, bool bf16) {
  std::uint16_t bits;
  if (bf16) {
    const __nv_bfloat16 h = __float2bfloat16(x);
    std::memcpy(&bits, &h, 2);
  } else {
    const __half h = __float2half(x);
    std::memcpy(&bits, &h, 2);
  }
  return bits;
}

double from_bits(std::uint16_t bits, bool bf16) {
  if (bf16) {
    __nv_bfloat16 h;
    std::memcpy(&h, &bits, 2);
    return __bfloat162float(h);
  }
  __half h;
  std::memcpy(&h, &bits, 2);
  return __half2float(h);
}

struct Strides {
  std::int64_t batch, head, row;
};

Strides strides_of(int heads, int seq, int d, bool bshd) {
  if (bshd) return {std::int64_t(seq) * heads * d, d, std::int64_t(heads) * d};
  return {std::int64_t(heads) * seq * d, std::int64_t(seq) * d, d};
}

bool visible(const Case& c, int i, int j) {
  const int off = c.mask == MaskKind::Causal ? 0 : c.seq_k - c.seq_q;
  switch (c.mask) {
    case MaskKind::None:
      return true;
    case MaskKind::Causal:
    case MaskKind::CausalBottomRight:
      return j <= i + off;
    case MaskKind::SlidingWindow:
      return j <= i + off && j > i + off - c.window;
    case MaskKind::Boolean:
    case MaskKind::Bias:
      break;
  }
  return false;
}

struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(std::size_t bytes) {
    if (cudaMalloc(&ptr, bytes) != cudaSuccess) ptr = nullptr;
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

}  // namespace

bool usable_device(std::string* why) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    *why = "no CUDA device: the fused kernels need an sm80 or newer GPU";
    return false;
  }
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess || major < 8) {
    *why = "the CUDA device is older than sm80";
    return false;
  }
  return true;
}

void run_case(const Case& c, const Launcher& kernel, std::uint32_t seed, Outcome* out, bool with_lse) {
  const bool flash = kernel.flash;
  const int B = c.batch, H = c.heads, Hk = c.kv_heads, Sq = c.seq_q, Sk = c.seq_k, D = c.head_dim;
  const double scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(double(D));
  const Strides sq = strides_of(H, Sq, D, c.bshd), sk = strides_of(Hk, Sk, D, c.bshd);
  const std::size_t nq = std::size_t(B) * H * Sq * D, nk = std::size_t(B) * Hk * Sk * D;

  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  std::vector<std::uint16_t> hq(nq), hk(nk), hv(nk);
  for (auto& x : hq) x = to_bits(normal(rng), c.bf16);
  for (auto& x : hk) x = to_bits(normal(rng), c.bf16);
  for (auto& x : hv) x = to_bits(uniform(rng), c.bf16);

  const std::size_t nl = std::size_t(B) * H * Sq;
  DeviceBuffer dq(nq * 2), dk(nk * 2), dv(nk * 2), dout(nq * 2), dlse(with_lse ? nl * 4 : 4);
  ASSERT_TRUE(dq.ptr && dk.ptr && dv.ptr && dout.ptr && dlse.ptr) << "cudaMalloc failed";
  CUDA_OK(cudaMemcpy(dq.ptr, hq.data(), nq * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dk.ptr, hk.data(), nk * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dv.ptr, hv.data(), nk * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(dout.ptr, 0xFF, nq * 2));                // all-ones bits: NaN in bf16 and fp16
  if (with_lse) CUDA_OK(cudaMemset(dlse.ptr, 0xFF, nl * 4));  // NaN in f32

  const FusedParams p{
      .q = dq.ptr,
      .k = dk.ptr,
      .v = dv.ptr,
      .o = dout.ptr,
      .lse = with_lse ? static_cast<float*>(dlse.ptr) : nullptr,
      .q_batch_stride = sq.batch,
      .q_head_stride = sq.head,
      .q_row_stride = sq.row,
      .k_batch_stride = sk.batch,
      .k_head_stride = sk.head,
      .k_row_stride = sk.row,
      .v_batch_stride = sk.batch,
      .v_head_stride = sk.head,
      .v_row_stride = sk.row,
      .o_batch_stride = sq.batch,
      .o_head_stride = sq.head,
      .o_row_stride = sq.row,
      .batch = B,
      .heads = H,
      .kv_heads = Hk,
      .seq_q = Sq,
      .seq_k = Sk,
      .head_dim = D,
      .scale = float(scale),
      .mask = c.mask,
      .window = c.window,
      .bf16 = c.bf16,
      .softcap = c.softcap,
  };
  const char* reason = attnprof::cuda::fused_unsupported_reason(p, flash);
  ASSERT_EQ(reason, nullptr) << reason;
  CUDA_OK(kernel.launch(p));
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<std::uint16_t> ho(nq);
  CUDA_OK(cudaMemcpy(ho.data(), dout.ptr, nq * 2, cudaMemcpyDeviceToHost));
  std::vector<float> hl(with_lse ? nl : 0);
  if (with_lse) CUDA_OK(cudaMemcpy(hl.data(), dlse.ptr, nl * 4, cudaMemcpyDeviceToHost));

  double err2 = 0, ref2 = 0;
  std::vector<double> score(Sk), acc(D);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < H; ++h) {
      const int hk_ = h / (H / Hk);
      for (int i = 0; i < Sq; ++i) {
        const std::int64_t qrow = b * sq.batch + h * sq.head + i * sq.row;
        double mx = -INFINITY;
        for (int j = 0; j < Sk; ++j) {
          if (!visible(c, i, j)) continue;
          const std::int64_t krow = b * sk.batch + hk_ * sk.head + j * sk.row;
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += from_bits(hq[qrow + d], c.bf16) * from_bits(hk[krow + d], c.bf16);
          score[j] = c.softcap > 0 ? c.softcap * std::tanh(dot * scale / c.softcap) : dot * scale;
          mx = std::max(mx, score[j]);
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        double sum = 0;
        for (int j = 0; j < Sk; ++j) {
          if (!visible(c, i, j)) continue;
          const double e = std::exp(score[j] - mx);
          sum += e;
          const std::int64_t vrow = b * sk.batch + hk_ * sk.head + j * sk.row;
          for (int d = 0; d < D; ++d) acc[d] += e * from_bits(hv[vrow + d], c.bf16);
        }
        const bool masked_row = sum == 0;
        out->masked_rows += masked_row;
        if (with_lse) {
          const double got = hl[(std::size_t(b) * H + h) * Sq + i];
          if (std::isnan(got)) {
            ++out->lse_nan;
          } else if (masked_row) {
            out->lse_masked_wrong += !(std::isinf(got) && got > 0);
          } else {
            const double ref = mx + std::log(sum);
            out->lse_max_err = std::max(out->lse_max_err, std::abs(got - ref) / (1 + std::abs(ref)));
          }
        }
        for (int d = 0; d < D; ++d) {
          const double ref = masked_row ? 0.0 : acc[d] / sum;
          const double got = from_bits(ho[qrow + d], c.bf16);
          if (std::isnan(got)) {
            ++out->nan_count;
            continue;
          }
          if (masked_row && got != 0.0) ++out->masked_nonzero;
          err2 += (got - ref) * (got - ref);
          ref2 += ref * ref;
          out->max_abs = std::max(out->max_abs, std::abs(got - ref));
        }
      }
    }
  }
  out->rel_error = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
}

void expect_matches_float64(const KernelCase& kc) {
  // Two draws: a kernel that is right on one input by accident is caught on the next.
  for (std::uint32_t seed : {1234u + kc.c.seq_q, 99u + kc.c.seq_k * 7u}) {
    Outcome o;
    run_case(kc.c, kc.kernel, seed, &o);
    if (::testing::Test::HasFatalFailure()) return;
    const double rel_tol = kc.c.bf16 ? 1e-2 : 3e-3;
    const double abs_tol = kc.c.bf16 ? 4e-2 : 1e-2;
    EXPECT_EQ(o.nan_count, 0) << "NaN (or unwritten) outputs";
    EXPECT_EQ(o.masked_nonzero, 0) << "fully masked rows must be zeros (" << o.masked_rows << " such rows)";
    EXPECT_LT(o.rel_error, rel_tol) << "max abs error " << o.max_abs;
    EXPECT_LT(o.max_abs, abs_tol) << "relative error " << o.rel_error;
    ::testing::Test::RecordProperty("rel_error_" + std::to_string(seed), std::to_string(o.rel_error));
    std::printf("  %-10s %-34s seed %10u  rel %.2e  max_abs %.2e  masked rows %lld\n", kc.kernel.name, kc.c.name, seed,
                o.rel_error, o.max_abs, static_cast<long long>(o.masked_rows));
  }
}

// The same cases with an lse buffer: O as above, and every row's log-sum-exp
// within f32 rounding of float64's (scores, exponentials and the log are f32
// on the device). The soft-capped bf16 kernel's is the log of the sums O is
// divided by, of p as P V reads it (rounded to bf16, at most 2^-9 off): within
// 2^-9 of float64's.
void expect_lse_matches_float64(const KernelCase& kc) {
  Outcome o;
  run_case(kc.c, kc.kernel, 4321u + kc.c.seq_q, &o, /*with_lse=*/true);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_EQ(o.nan_count, 0) << "NaN (or unwritten) outputs";
  EXPECT_EQ(o.masked_nonzero, 0);
  EXPECT_LT(o.rel_error, kc.c.bf16 ? 1e-2 : 3e-3);
  EXPECT_EQ(o.lse_nan, 0) << "NaN (or unwritten) log-sum-exp entries";
  EXPECT_EQ(o.lse_masked_wrong, 0) << "fully masked rows must have lse +inf (" << o.masked_rows << " such rows)";
  EXPECT_LT(o.lse_max_err, kc.c.softcap > 0 && kc.c.bf16 ? 0x1p-9 : 1e-4);
  std::printf("  %-10s %-34s lse max err %.2e  masked rows %lld\n", kc.kernel.name, kc.c.name, o.lse_max_err,
              static_cast<long long>(o.masked_rows));
}

std::string case_name(const ::testing::TestParamInfo<KernelCase>& info) {
  return std::string(info.param.kernel.name) + "_" + info.param.c.name;
}

}  // namespace attnprof::testing::fused
