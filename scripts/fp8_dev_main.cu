// Dev harness of flash's FP8 (e4m3) forward: the host entry
// launch_flash_sm90_fp8 (flash_fp8_launch.cu), its kernel TU, and variants
// of the kernel's Cfg (the share of exponentials on the FMA pipe), so that
// they can be tried on the GPU machine without the rest of attnprof. Built by
// scripts/fp8_dev.sh. Correctness: sampled rows against a float64 reference of the
// dequantized inputs (the GPU test tests/gpu/flash_fp8_test.cpp is the full
// check); timing: CUDA events over back-to-back forwards, the V^T pre-pass
// included and on its own.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "attnprof/dtype.h"
#include "backends/cuda/kernels/flash_fwd_sm90_fp8.cuh"
#include "backends/cuda/kernels/transpose_v_fp8.cuh"
#include "backends/cuda/launch/fused_kernels.h"

using attnprof::MaskKind;
using attnprof::cuda::FusedParams;

#define CK(call)                                                                                 \
  do {                                                                                           \
    const cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

// One forward through a variant: the pre-pass, then the kernel of Cfg.
template <int kFma, int kBlockN, bool kSkip>
cudaError_t forward_variant(const FusedParams& p) {
  namespace k = attnprof::cuda::kernels;
  if (const cudaError_t e =
          k::launch_transpose_v_e4m3(p.v, p.v_batch_stride, p.v_head_stride, p.v_row_stride, p.v_t, p.batch, p.kv_heads,
                                     p.seq_k, int(attnprof::cuda::fp8_vt_cols(p.seq_k)), p.head_dim, nullptr);
      e != cudaSuccess) {
    return e;
  }
  const k::FwdArgs a = k::fp8_fwd_args(p);
  using Cfg = k::FlashSm90Fp8Cfg<128, kFma, kBlockN, kSkip>;
  return p.mask == MaskKind::Causal ? k::run_flash_fwd_sm90<Cfg, k::MaskMode::Causal, k::E4m3>(a, nullptr, p.v_descale)
                                    : k::run_flash_fwd_sm90<Cfg, k::MaskMode::None, k::E4m3>(a, nullptr, p.v_descale);
}
using Forward = cudaError_t (*)(const FusedParams&);
struct Variant {
  const char* name;
  Forward run;
};
constexpr Variant kVariants[] = {
    {"f0n128", &forward_variant<0, 128, false>}, {"f1n128s", &forward_variant<1, 128, true>},
    {"f0n192", &forward_variant<0, 192, false>}, {"f1n192", &forward_variant<1, 192, false>},
    {"f1n192s", &forward_variant<1, 192, true>}, {"f2n192s", &forward_variant<2, 192, true>},
};

struct Shape {
  int b, h, s;
  MaskKind mask;
};

int main() {
  constexpr int kD = 128;
  const Shape shapes[] = {{2, 16, 8192, MaskKind::None},   {2, 16, 8192, MaskKind::Causal},
                          {4, 16, 4096, MaskKind::None},   {4, 16, 4096, MaskKind::Causal},
                          {8, 16, 2048, MaskKind::Causal}, {16, 16, 1024, MaskKind::None},
                          {1, 4, 1000, MaskKind::Causal}};
  // FP8_DEV_SMALL=1: the last (ragged) shape only, for compute-sanitizer.
  const bool small = std::getenv("FP8_DEV_SMALL") != nullptr;
  std::printf("%-22s %8s %10s %10s %9s %9s %9s\n", "shape", "fma", "fwd us", "vt us", "TFLOP/s", "rel_l2", "max_err");
  for (const Shape& sh : shapes) {
    if (small && &sh != &shapes[std::size(shapes) - 1]) continue;
    const std::size_t n = static_cast<std::size_t>(sh.b) * sh.h * sh.s * kD;
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<std::uint8_t> hq(n), hk(n), hv(n);
    const float dq = 4.f / 448.f, dk = 4.f / 448.f, dv = 3.f / 448.f;
    for (std::size_t i = 0; i < n; ++i) {
      hq[i] = attnprof::float_to_e4m3(1.2f * normal(rng) / dq);
      hk[i] = attnprof::float_to_e4m3(1.2f * normal(rng) / dk);
      hv[i] = attnprof::float_to_e4m3(normal(rng) / dv);
    }
    FusedParams p;
    p.batch = sh.b, p.heads = p.kv_heads = sh.h, p.seq_q = p.seq_k = sh.s, p.head_dim = kD;
    p.scale = 1.f / std::sqrt(float(kD));
    p.mask = sh.mask;
    p.fp8 = true;
    p.q_descale = dq, p.k_descale = dk, p.v_descale = dv;
    void *q, *k, *v, *o, *vt;
    CK(cudaMalloc(&q, n));
    CK(cudaMalloc(&k, n));
    CK(cudaMalloc(&v, n));
    CK(cudaMalloc(&o, n * 2));
    CK(cudaMalloc(&vt, attnprof::cuda::fp8_vt_bytes(p)));
    CK(cudaMemcpy(q, hq.data(), n, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(k, hk.data(), n, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(v, hv.data(), n, cudaMemcpyHostToDevice));
    CK(cudaMemset(o, 0xff, n * 2));
    p.q = q, p.k = k, p.v = v, p.o = o, p.v_t = vt;
    p.q_row_stride = p.k_row_stride = p.v_row_stride = p.o_row_stride = kD;
    p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = std::int64_t(sh.s) * kD;
    p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = std::int64_t(sh.h) * sh.s * kD;
    for (int variant = -1; variant < int(std::size(kVariants)); ++variant) {
      // variant -1: the library's entry (launch_flash_sm90_fp8), else kVariants[variant].
      auto forward = [&] {
        return variant < 0 ? attnprof::cuda::launch_flash_sm90_fp8(p, nullptr) : kVariants[variant].run(p);
      };
      CK(cudaMemset(o, 0xff, n * 2));
      CK(forward());
      CK(cudaDeviceSynchronize());
      std::vector<std::uint16_t> ho(n);
      CK(cudaMemcpy(ho.data(), o, n * 2, cudaMemcpyDeviceToHost));
      // Sampled rows against float64.
      double err2 = 0, ref2 = 0, max_err = 0;
      std::mt19937 pick(3);
      for (int sample = 0; sample < 24; ++sample) {
        const int bh = pick() % (sh.b * sh.h), i = pick() % sh.s;
        const std::size_t base = std::size_t(bh) * sh.s * kD;
        const int hi = sh.mask == MaskKind::Causal ? i + 1 : sh.s;
        std::vector<double> s(hi), acc(kD, 0.0);
        double mx = -INFINITY, l = 0;
        for (int j = 0; j < hi; ++j) {
          double dot = 0;
          for (int d = 0; d < kD; ++d)
            dot += double(attnprof::e4m3_to_float(hq[base + i * kD + d])) * dq *
                   double(attnprof::e4m3_to_float(hk[base + std::size_t(j) * kD + d])) * dk;
          s[j] = dot * p.scale;
          mx = std::max(mx, s[j]);
        }
        for (int j = 0; j < hi; ++j) {
          const double e = std::exp(s[j] - mx);
          l += e;
          for (int d = 0; d < kD; ++d)
            acc[d] += e * double(attnprof::e4m3_to_float(hv[base + std::size_t(j) * kD + d])) * dv;
        }
        for (int d = 0; d < kD; ++d) {
          const double want = acc[d] / l, got = attnprof::bf16_to_float(ho[base + i * kD + d]);
          err2 += (got - want) * (got - want);
          ref2 += want * want;
          max_err = std::max(max_err, std::isnan(got) ? INFINITY : std::fabs(got - want));
        }
      }
      // Timing.
      cudaEvent_t a, b;
      CK(cudaEventCreate(&a));
      CK(cudaEventCreate(&b));
      const int iters = sh.s >= 4096 ? 20 : 50;
      for (int w = 0; w < 3; ++w) CK(forward());
      CK(cudaEventRecord(a));
      for (int it = 0; it < iters; ++it) CK(forward());
      CK(cudaEventRecord(b));
      CK(cudaEventSynchronize(b));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, a, b));
      const double fwd_us = 1e3 * ms / iters;
      CK(cudaEventRecord(a));
      for (int it = 0; it < iters; ++it)
        CK(attnprof::cuda::kernels::launch_transpose_v_e4m3(v, p.v_batch_stride, p.v_head_stride, p.v_row_stride, vt,
                                                            sh.b, sh.h, sh.s, int(attnprof::cuda::fp8_vt_cols(sh.s)),
                                                            kD, nullptr));
      CK(cudaEventRecord(b));
      CK(cudaEventSynchronize(b));
      CK(cudaEventElapsedTime(&ms, a, b));
      const double vt_us = 1e3 * ms / iters;
      const double pairs = sh.mask == MaskKind::Causal ? double(sh.s) * (sh.s + 1) / 2 : double(sh.s) * sh.s;
      const double flops = 4.0 * sh.b * sh.h * pairs * kD;
      char name[64];
      std::snprintf(name, sizeof name, "%dx%dx%dx%d %s", sh.b, sh.h, sh.s, kD,
                    sh.mask == MaskKind::Causal ? "causal" : "full");
      // FP8_DEV_SMALL=1: the last (ragged) shape only, for compute-sanitizer.
      const bool small = std::getenv("FP8_DEV_SMALL") != nullptr;
      std::printf("%-22s %8s %10.1f %10.1f %9.1f %9.4f %9.4f\n", name, variant < 0 ? "lib" : kVariants[variant].name,
                  fwd_us, vt_us, flops / (fwd_us * 1e-6) / 1e12, std::sqrt(err2 / ref2), max_err);
    }
    for (void* ptr : {q, k, v, o, vt}) CK(cudaFree(ptr));
  }
  return 0;
}
