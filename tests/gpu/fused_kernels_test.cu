// Our fused attention forwards (flash on the path the device takes, flash's
// sm80 path on its own, efficient) against a float64 CPU
// reference on fresh random inputs, with the output poisoned with NaN before
// every launch: every element must be written, fully masked rows must be
// exactly zero, and the error must sit within 16-bit rounding. With an lse
// buffer (also poisoned), each row's log-sum-exp is checked the same way
// (+inf on fully masked rows).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/fused_kernels.h"
#include "backends/cuda/kernels/flash_fwd_sm90.cuh"

namespace {

using attnprof::MaskKind;
using attnprof::cuda::FusedParams;

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

#define SKIP_WITHOUT_SM80()                          \
  do {                                               \
    std::string why_;                                \
    if (!usable_device(&why_)) GTEST_SKIP() << why_; \
  } while (0)

// 192 runs on flash's sm90a kernel only.
#define SKIP_WHERE_HEAD_DIM_IS_NOT_BUILT(kc)                                                \
  if ((kc).c.head_dim == 192 && !attnprof::cuda::flash_sm90_runs_here()) {                  \
    GTEST_SKIP() << "head_dim 192 runs on flash's sm90a kernel only; this GPU is not sm90"; \
  }

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

struct Case {
  const char* name;
  int batch, heads, kv_heads, seq_q, seq_k, head_dim;
  MaskKind mask;
  int window = 0;
  bool bf16 = true;
  bool bshd = false;    // [B, S, H, D] storage: head and row strides swapped
  float scale = 0.f;    // 0: 1/sqrt(head_dim)
  float softcap = 0.f;  // scores c tanh(s / c); 0: none (flash's sm90 kernels only)
};

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

struct Outcome {
  double rel_error = 0, max_abs = 0;
  std::int64_t nan_count = 0, masked_nonzero = 0, masked_rows = 0;
  // With an lse buffer: the largest |got - ref| / (1 + |ref|) over rows that
  // see a key, NaN (unwritten) entries, and fully masked rows not at +inf.
  double lse_max_err = 0;
  std::int64_t lse_nan = 0, lse_masked_wrong = 0;
};

// Runs one kernel on fresh inputs drawn from `seed` and compares with float64.
// Besides the public launchers, two choices of flash's sm90a kernel that the
// defaults do not take but that stay built (docs/perf/fused-kernels.md, runs
// 11-12): the key loop without the intra-warpgroup overlap (S, softmax, P V in
// turn), and the persistent scheduler, here with a 256 KB L2 budget so that
// small problems are cut into several head sections, the last one short, and
// on a few CTAs (FewCtas below).
enum class Kernel { Flash, FlashSm80, Efficient, FlashSm90InTurn, FlashSm90Persistent };

const char* kernel_name(Kernel k) {
  switch (k) {
    case Kernel::Flash:
      return "flash";
    case Kernel::FlashSm80:
      return "flash_sm80";
    case Kernel::Efficient:
      return "efficient";
    case Kernel::FlashSm90InTurn:
      return "flash_sm90_in_turn";
    case Kernel::FlashSm90Persistent:
      return "flash_sm90_persistent";
  }
  return "?";
}

namespace kern = attnprof::cuda::kernels;

// The persistent scheduler on at most 5 CTAs, so that every CTA takes several
// tiles (on 132 SMs the test problems would give each CTA one): Q handed back
// between tiles, the K/V pipeline state and the pingpong turns carried over,
// an empty tile followed by a full one.
template <kern::MaskMode kMask, int kBlockM, int kD>
struct FewCtas : kern::PersistentTileScheduler<kMask, kBlockM, kD, std::int64_t{256} << 10> {
  static dim3 grid(const kern::FwdArgs& a, int /*sms*/) {
    return dim3(std::min(kern::PersistentTileScheduler<kMask, kBlockM, kD, std::int64_t{256} << 10>::tiles(a), 5));
  }
};

template <int kD, kern::MaskMode kMask, bool kLse>
cudaError_t launch_sm90_choice(Kernel k, const kern::FwdArgs& a) {
  using Default = kern::FlashSm90DefaultCfg<kD>;
  if (k == Kernel::FlashSm90InTurn) {
    using InTurn = kern::FlashSm90Cfg<kD, Default::kBlockN, 2, 2, false, true, false, false>;
    return kern::run_flash_fwd_sm90<InTurn, kMask, kern::Bf16, kLse>(a, nullptr);
  }
  return kern::run_flash_fwd_sm90<Default, kMask, kern::Bf16, kLse, FewCtas<kMask, Default::kBlockM, kD>>(a, nullptr);
}

template <int kD>
cudaError_t launch_sm90_choice(Kernel k, const FusedParams& p) {
  const kern::FwdArgs a = kern::FwdArgs::from(p);
  const auto with_lse = [&]<kern::MaskMode kMask>() {
    return a.lse != nullptr ? launch_sm90_choice<kD, kMask, true>(k, a) : launch_sm90_choice<kD, kMask, false>(k, a);
  };
  return kern::with_mask_mode(p.mask, cudaErrorInvalidValue, with_lse);
}

cudaError_t launch(Kernel k, const FusedParams& p) {
  switch (k) {
    case Kernel::Flash:
      return attnprof::cuda::launch_flash(p, nullptr);
    case Kernel::FlashSm80:
      return attnprof::cuda::launch_flash_sm80(p, nullptr);
    case Kernel::Efficient:
      return attnprof::cuda::launch_efficient(p, nullptr);
    case Kernel::FlashSm90InTurn:
    case Kernel::FlashSm90Persistent:
      // Built for bf16 at head dims 64 and 128 (the cases below).
      if (!p.bf16) return cudaErrorNotSupported;
      if (p.head_dim == 64) return launch_sm90_choice<64>(k, p);
      if (p.head_dim == 128) return launch_sm90_choice<128>(k, p);
      return cudaErrorNotSupported;
  }
  return cudaErrorInvalidValue;
}

void run_case(const Case& c, Kernel kernel, std::uint32_t seed, Outcome* out, bool with_lse = false) {
  const bool flash = kernel != Kernel::Efficient;
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
  CUDA_OK(launch(kernel, p));
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

struct KernelCase {
  Case c;
  Kernel kernel;
};

class FusedKernels : public ::testing::TestWithParam<KernelCase> {};

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
    std::printf("  %-10s %-34s seed %10u  rel %.2e  max_abs %.2e  masked rows %lld\n", kernel_name(kc.kernel),
                kc.c.name, seed, o.rel_error, o.max_abs, static_cast<long long>(o.masked_rows));
  }
}

TEST_P(FusedKernels, MatchesFloat64Reference) {
  SKIP_WITHOUT_SM80();
  const KernelCase& kc = GetParam();
  SKIP_WHERE_HEAD_DIM_IS_NOT_BUILT(kc);
  expect_matches_float64(kc);
}

class FusedSm90Choices : public ::testing::TestWithParam<KernelCase> {};

TEST_P(FusedSm90Choices, MatchesFloat64Reference) {
  SKIP_WITHOUT_SM80();
  if (!attnprof::cuda::flash_sm90_runs_here()) GTEST_SKIP() << "flash's sm90a kernel runs on sm90 GPUs only";
  expect_matches_float64(GetParam());
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
  std::printf("  %-10s %-34s lse max err %.2e  masked rows %lld\n", kernel_name(kc.kernel), kc.c.name, o.lse_max_err,
              static_cast<long long>(o.masked_rows));
}

TEST_P(FusedKernels, LogSumExpMatchesFloat64) {
  SKIP_WITHOUT_SM80();
  const KernelCase& kc = GetParam();
  SKIP_WHERE_HEAD_DIM_IS_NOT_BUILT(kc);
  expect_lse_matches_float64(kc);
}

TEST_P(FusedSm90Choices, LogSumExpMatchesFloat64) {
  SKIP_WITHOUT_SM80();
  if (!attnprof::cuda::flash_sm90_runs_here()) GTEST_SKIP() << "flash's sm90a kernel runs on sm90 GPUs only";
  expect_lse_matches_float64(GetParam());
}

constexpr MaskKind kNone = MaskKind::None, kCausal = MaskKind::Causal, kBR = MaskKind::CausalBottomRight,
                   kWin = MaskKind::SlidingWindow;

std::vector<KernelCase> all_cases() {
  const std::vector<Case> cases = {
      // name, B, H, Hkv, Sq, Sk, D, mask, window, bf16, bshd, scale
      {"d64_none", 2, 3, 3, 256, 256, 64, kNone},
      {"d64_causal_200", 2, 3, 3, 200, 200, 64, kCausal},
      {"d64_causal_q200_k333", 1, 2, 2, 200, 333, 64, kCausal},
      {"d64_causal_q333_k200", 1, 2, 2, 333, 200, 64, kCausal},
      {"d64_bottomright_q333_k200", 1, 2, 2, 333, 200, 64, kBR},  // 133 fully masked rows
      {"d64_bottomright_q200_k333", 1, 2, 2, 200, 333, 64, kBR},
      {"d64_window64_300", 1, 2, 2, 300, 300, 64, kWin, 64},
      {"d64_window17_q333_k200", 1, 2, 2, 333, 200, 64, kWin, 17},
      {"d64_none_q333_k200_scale", 1, 2, 2, 333, 200, 64, kNone, 0, true, false, 0.3f},
      {"d128_none_q200_k333", 1, 2, 2, 200, 333, 128, kNone},
      {"d128_causal_333", 1, 2, 2, 333, 333, 128, kCausal},
      {"d128_bottomright_q333_k200", 1, 2, 2, 333, 200, 128, kBR},
      {"d128_window100_q200_k333", 1, 2, 2, 200, 333, 128, kWin, 100},
      {"fp16_d64_causal_200", 2, 2, 2, 200, 200, 64, kCausal, 0, false},
      {"fp16_d128_none_q333_k200", 1, 2, 2, 333, 200, 128, kNone, 0, false},
      {"fp16_d64_bottomright_q333_k200", 1, 2, 2, 333, 200, 64, kBR, 0, false},
      {"gqa4_d64_causal", 2, 8, 2, 200, 200, 64, kCausal},
      {"mqa_d128_bottomright_q200_k333", 1, 4, 1, 200, 333, 128, kBR},
      {"bshd_d64_causal", 2, 3, 3, 200, 200, 64, kCausal, 0, true, true},
      {"bshd_gqa_d128_none_q333_k200", 1, 4, 2, 333, 200, 128, kNone, 0, true, true},
      {"bshd_fp16_d64_window_q200_k333", 1, 4, 2, 200, 333, 64, kWin, 50, false, true},
      {"decode_d64_bottomright_q1_k77", 2, 2, 2, 1, 77, 64, kBR},
      {"d32_causal_200", 1, 2, 2, 200, 200, 32, kCausal},
      {"d96_bottomright_q333_k200", 1, 2, 2, 333, 200, 96, kBR},
      {"d256_causal_q200_k333", 1, 2, 2, 200, 333, 256, kCausal},
      {"d256_none_q333_k200", 1, 2, 1, 333, 200, 256, kNone},
      {"fp16_d256_bottomright_q200_k333", 1, 2, 2, 200, 333, 256, kBR, 0, false},
      {"gqa_d96_window64_300", 1, 4, 2, 300, 300, 96, kWin, 64},
      {"bshd_d96_none_q200_k333", 1, 2, 2, 200, 333, 96, kNone, 0, true, true},
      // 192: flash on sm90 only (kFlashSm90HeadDims).
      {"d192_causal_333", 1, 2, 2, 333, 333, 192, kCausal},
      {"gqa_d192_none_q200_k333", 1, 4, 2, 200, 333, 192, kNone},
      {"bshd_fp16_d192_bottomright_q333_k200", 1, 4, 2, 333, 200, 192, kBR, 0, false, true},
      // Few queries: flash takes its split-KV decode kernel (one split here: no workspace).
      {"decode_gqa4_d128_q16_k1000", 2, 8, 2, 16, 1000, 128, kBR},
      {"decode_mqa_d256_q3_k300_none", 1, 4, 1, 3, 300, 256, kNone},
      {"decode_window100_d64_q8_k500", 1, 4, 2, 8, 500, 64, kWin, 100},
      {"decode_fp16_bshd_d128_q4_k777", 2, 4, 4, 4, 777, 128, kBR, 0, false, true},
      // Soft-capped: bf16 on the fixed base (its row sums from the tensor cores), fp16 and a cap past the
      // fixed base's bound on the running max.
      {"softcap30_gqa_d64_causal_q200_k333", 1, 4, 2, 200, 333, 64, kCausal, 0, true, false, 0.f, 30.f},
      {"softcap50_d128_none_q333_k200", 2, 4, 4, 333, 200, 128, kNone, 0, true, false, 0.f, 50.f},
      {"softcap30_d256_bottomright_q333_k200", 1, 2, 2, 333, 200, 256, kBR, 0, true, false, 0.f, 30.f},
      {"softcap60_d128_window40_333", 1, 4, 4, 333, 333, 128, kWin, 40, true, false, 0.f, 60.f},
      {"fp16_softcap30_d96_causal_333", 1, 4, 4, 333, 333, 96, kCausal, 0, false, false, 0.f, 30.f},
  };
  std::vector<KernelCase> out;
  for (Kernel k : {Kernel::Flash, Kernel::FlashSm80, Kernel::Efficient})
    for (const Case& c : cases) {
      if ((c.head_dim == 192 || c.softcap > 0) && k != Kernel::Flash) continue;  // sm90 only
      out.push_back({c, k});
    }
  return out;
}

// Every head dim the kernels are built for has at least one case above.
TEST(FusedKernelsSupport, CasesCoverEveryBuiltHeadDim) {
  const std::vector<KernelCase> cases = all_cases();
  for (const int d : attnprof::cuda::kFusedHeadDims) {
    EXPECT_TRUE(std::any_of(cases.begin(), cases.end(), [d](const KernelCase& kc) { return kc.c.head_dim == d; }))
        << "no case at head_dim " << d;
  }
}

INSTANTIATE_TEST_SUITE_P(All, FusedKernels, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<KernelCase>& info) {
                           return std::string(kernel_name(info.param.kernel)) + "_" + info.param.c.name;
                         });

// Ragged tiles, every mask, grouped heads, fully masked rows; at 16 (batch,
// head) pairs and these lengths, the 256 KB budget makes sections of 2-10
// pairs.
std::vector<KernelCase> sm90_choice_cases() {
  const std::vector<Case> cases = {
      {"d64_causal_q333_k200", 2, 8, 8, 333, 200, 64, kCausal},
      {"d64_window17_q333_k200", 2, 8, 4, 333, 200, 64, kWin, 17},
      {"d128_none_q200_k333", 2, 8, 2, 200, 333, 128, kNone},
      {"d128_bottomright_q333_k200", 2, 8, 8, 333, 200, 128, kBR},  // 133 fully masked rows a head
      {"bshd_d128_causal_q200_k333", 1, 16, 4, 200, 333, 128, kCausal, 0, true, true},
  };
  std::vector<KernelCase> out;
  for (Kernel k : {Kernel::FlashSm90InTurn, Kernel::FlashSm90Persistent})
    for (const Case& c : cases) out.push_back({c, k});
  return out;
}

INSTANTIATE_TEST_SUITE_P(All, FusedSm90Choices, ::testing::ValuesIn(sm90_choice_cases()),
                         [](const ::testing::TestParamInfo<KernelCase>& info) {
                           return std::string(kernel_name(info.param.kernel)) + "_" + info.param.c.name;
                         });

// A shape-only problem (nothing is launched on it): 4 heads over 2 KV heads,
// 8 rows, every stride one head_dim-wide row.
FusedParams shape_only(int head_dim) {
  alignas(16) static std::uint16_t dummy[8];
  const std::int64_t r = head_dim;
  return FusedParams{.q = dummy,
                     .k = dummy,
                     .v = dummy,
                     .o = dummy,
                     .q_batch_stride = r,
                     .q_head_stride = r,
                     .q_row_stride = r,
                     .k_batch_stride = r,
                     .k_head_stride = r,
                     .k_row_stride = r,
                     .v_batch_stride = r,
                     .v_head_stride = r,
                     .v_row_stride = r,
                     .o_batch_stride = r,
                     .o_head_stride = r,
                     .o_row_stride = r,
                     .batch = 1,
                     .heads = 4,
                     .kv_heads = 2,
                     .seq_q = 8,
                     .seq_k = 8,
                     .head_dim = head_dim,
                     .scale = 0.125f,
                     .mask = MaskKind::Causal};
}

TEST(FusedKernelsSupport, ReasonsSayWhatToChange) {
  SKIP_WITHOUT_SM80();
  const FusedParams p = shape_only(64);
  EXPECT_EQ(attnprof::cuda::fused_unsupported_reason(p, true), nullptr);
  EXPECT_EQ(attnprof::cuda::fused_unsupported_reason(p, false), nullptr);

  FusedParams bad = p;
  bad.head_dim = 80;
  const char* reason = attnprof::cuda::fused_unsupported_reason(bad, true);
  ASSERT_NE(reason, nullptr);
  EXPECT_NE(std::string(reason).find("head_dim 80"), std::string::npos) << reason;
  EXPECT_EQ(attnprof::cuda::launch_flash_sm80(bad, nullptr), cudaErrorInvalidValue);

  bad = p;
  bad.kv_heads = 3;
  EXPECT_NE(attnprof::cuda::fused_unsupported_reason(bad, false), nullptr);
  bad = p;
  bad.q_row_stride = 60;
  EXPECT_NE(attnprof::cuda::fused_unsupported_reason(bad, true), nullptr);
  bad = p;
  bad.mask = MaskKind::SlidingWindow;
  bad.window = 0;
  EXPECT_NE(attnprof::cuda::fused_unsupported_reason(bad, true), nullptr);
}

// Hopper takes the sm90a kernel at the head dims of kFlashSm90HeadDims (our
// builds always include sm_90a), and the sm80 kernel at the others; other GPUs
// never take it. Every built head dim is accepted by both kernels.
TEST(FusedKernelsSupport, Sm90PathWhereItApplies) {
  SKIP_WITHOUT_SM80();
  int major = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  for (const int d : attnprof::cuda::kFusedHeadDims) {
    FusedParams p = shape_only(d);
    p.seq_q = p.seq_k = 64;  // past the decode kernel's queries
    EXPECT_EQ(attnprof::cuda::fused_unsupported_reason(p, true), nullptr) << "head_dim " << d;
    EXPECT_EQ(attnprof::cuda::fused_unsupported_reason(p, false), nullptr) << "head_dim " << d;
    const bool sm90 = attnprof::cuda::flash_sm90_head_dim(d);
    EXPECT_EQ(attnprof::cuda::flash_sm90_applies(p), major == 9 && sm90) << "head_dim " << d;
    if (!sm90) EXPECT_EQ(attnprof::cuda::launch_flash_sm90(p, nullptr), cudaErrorNotSupported);
  }
  // 192: flash on sm90 only, efficient never.
  FusedParams p192 = shape_only(192);
  p192.seq_q = p192.seq_k = 64;
  EXPECT_EQ(attnprof::cuda::fused_unsupported_reason(p192, true) == nullptr, major == 9);
  EXPECT_NE(attnprof::cuda::fused_unsupported_reason(p192, false), nullptr);
  // 8 queries at a decode head dim: the decode kernel, not the sm90 prefill one.
  EXPECT_TRUE(attnprof::cuda::flash_decode_takes(shape_only(128)));
  EXPECT_FALSE(attnprof::cuda::flash_sm90_applies(shape_only(128)));
}

}  // namespace
