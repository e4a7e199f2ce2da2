// Standalone timing harness of our fused attention kernels (flash, efficient)
// and of a few flash tile variants, for the lent H200. Built and run by
// scripts/fused_dev.sh; numbers are recorded in docs/perf/fused-kernels.md.
// Inputs are random (never zeros); several input sets rotate so that repeated
// launches do not find their data in L2; times are the median of cudaEvent
// pairs around single launches after a warmup.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backends/cuda/kernels/efficient_fwd.cuh"
#include "backends/cuda/kernels/flash_decode.cuh"
#include "backends/cuda/kernels/flash_fwd_sm80.cuh"
#include "backends/cuda/kernels/flash_fwd_sm90.cuh"
#include "backends/cuda/launch/fused_kernels.h"

using attnprof::MaskKind;
using attnprof::cuda::FusedParams;
namespace k = attnprof::cuda::kernels;

static void check(cudaError_t err, const char* what, int line) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "CUDA error at line %d: %s: %s\n", line, what, cudaGetErrorString(err));
    std::exit(1);
  }
}
#define CK(x) check((x), #x, __LINE__)

// Uniform values in [-2, 2) from a hash of the index, rounded to bf16 (top 16 bits of f32).
__global__ void fill_random(std::uint16_t* p, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    std::uint32_t x = std::uint32_t(i) * 2654435761u ^ seed;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    const float f = (x >> 8) * (1.0f / 16777216.0f) * 4.f - 2.f;
    p[i] = std::uint16_t(__float_as_uint(f) >> 16);
  }
}

struct Shape {
  int b, h, s, d;
  MaskKind mask;
  double target_flash_ms, target_eff_ms;
};

static double visible_pairs(const Shape& s) {
  return s.mask == MaskKind::None ? double(s.s) * s.s : double(s.s) * (s.s + 1) / 2;
}

struct Set {
  std::uint16_t *q, *k, *v, *o;
};

static FusedParams params_of(const Shape& s, const Set& set) {
  const std::int64_t row = s.d, head = std::int64_t(s.s) * s.d, batch = head * s.h;
  return FusedParams{.q = set.q,
                     .k = set.k,
                     .v = set.v,
                     .o = set.o,
                     .q_batch_stride = batch,
                     .q_head_stride = head,
                     .q_row_stride = row,
                     .k_batch_stride = batch,
                     .k_head_stride = head,
                     .k_row_stride = row,
                     .v_batch_stride = batch,
                     .v_head_stride = head,
                     .v_row_stride = row,
                     .o_batch_stride = batch,
                     .o_head_stride = head,
                     .o_row_stride = row,
                     .batch = s.b,
                     .heads = s.h,
                     .kv_heads = s.h,
                     .seq_q = s.s,
                     .seq_k = s.s,
                     .head_dim = s.d,
                     .scale = float(1.0 / std::sqrt(double(s.d))),
                     .mask = s.mask,
                     .window = 0,
                     .bf16 = true};
}

using Launch = std::function<cudaError_t(const FusedParams&)>;

// The launchers a variant may go through; each takes a tile config and a mask.
struct Sm80 {
  template <class Cfg, k::MaskMode kMask>
  static cudaError_t run(const k::FwdArgs& a) {
    return k::run_flash_fwd_sm80<Cfg, kMask, k::Bf16>(a, nullptr);
  }
};
struct Sm90 {
  template <class Cfg, k::MaskMode kMask>
  static cudaError_t run(const k::FwdArgs& a) {
    return k::run_flash_fwd_sm90<Cfg, kMask, k::Bf16>(a, nullptr);
  }
};
// The sm90 kernel as flash launches it (its default Cfg and scheduler for the head dim).
struct Sm90Default {
  template <class Cfg, k::MaskMode kMask>
  static cudaError_t run(const k::FwdArgs& a) {
    return k::launch_flash_fwd_sm90<Cfg::kHeadDim, kMask, k::Bf16, false>(a, nullptr);
  }
};
// The sm90 kernel under the persistent, longest-first tile scheduler (tile_scheduler.cuh).
struct Sm90Persistent {
  template <class Cfg, k::MaskMode kMask>
  static cudaError_t run(const k::FwdArgs& a) {
    return k::run_flash_fwd_sm90<Cfg, kMask, k::Bf16, false,
                                 k::PersistentTileScheduler<kMask, Cfg::kBlockM, Cfg::kHeadDim>>(a, nullptr);
  }
};

template <class Launcher, class Cfg, k::MaskMode kMask>
static Launch variant() {
  return [](const FusedParams& p) { return Launcher::template run<Cfg, kMask>(k::FwdArgs::from(p)); };
}

static double median_ms(const Launch& launch, const Shape& shape, const std::vector<Set>& sets, int reps) {
  for (int i = 0; i < 3 * int(sets.size()); ++i) CK(launch(params_of(shape, sets[i % sets.size()])));
  CK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> ms(reps);
  for (int r = 0; r < reps; ++r) {
    const FusedParams p = params_of(shape, sets[r % sets.size()]);
    CK(cudaEventRecord(a));
    CK(launch(p));
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    CK(cudaEventElapsedTime(&ms[r], a, b));
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[reps / 2];
}

static double bf16_to_double(std::uint16_t x) {
  const std::uint32_t bits = std::uint32_t(x) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// ||a - b|| / ||b|| over two device outputs, and NaN count of a.
static void compare(const Shape& s, const std::uint16_t* a, const std::uint16_t* b, double* rel, long* nans) {
  const std::size_t n = std::size_t(s.b) * s.h * s.s * s.d;
  std::vector<std::uint16_t> ha(n), hb(n);
  CK(cudaMemcpy(ha.data(), a, n * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hb.data(), b, n * 2, cudaMemcpyDeviceToHost));
  double e2 = 0, r2 = 0;
  *nans = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double x = bf16_to_double(ha[i]), y = bf16_to_double(hb[i]);
    if (std::isnan(x)) {
      ++*nans;
      continue;
    }
    e2 += (x - y) * (x - y);
    r2 += y * y;
  }
  *rel = std::sqrt(e2 / r2);
}

// `fused_dev_main decode`: flash's split-KV decode kernel at issue 12's decode
// row (batch 64, 32 query heads over 8 KV heads, 1 query, 4096 keys, D 128,
// bottom-right causal) against its variants (run 12: 2 splits; an L2::256B
// prefetch hint on the loads, since removed: no gain), with a 1 GiB device copy for the
// copy ceiling (bytes read + written). Outputs are compared with the default's.
static int decode_main() {
  namespace cu = attnprof::cuda;
  const int B = 64, H = 32, Hkv = 8, Sq = 1, Sk = 4096, D = 128;
  const std::size_t nq = std::size_t(B) * H * Sq * D, nk = std::size_t(B) * Hkv * Sk * D;
  struct DecodeSet {
    std::uint16_t *q, *k, *v, *o;
  };
  std::vector<DecodeSet> sets(2);
  std::uint32_t seed = 7;
  for (DecodeSet& set : sets) {
    for (auto [ptr, n] : {std::pair{&set.q, nq}, {&set.k, nk}, {&set.v, nk}, {&set.o, nq}}) {
      CK(cudaMalloc(ptr, n * 2));
      fill_random<<<1024, 256>>>(*ptr, n, seed++);
      CK(cudaGetLastError());
    }
  }
  const auto params = [&](const DecodeSet& set, float* workspace) {
    return FusedParams{.q = set.q,
                       .k = set.k,
                       .v = set.v,
                       .o = set.o,
                       .q_batch_stride = std::int64_t(H) * Sq * D,
                       .q_head_stride = std::int64_t(Sq) * D,
                       .q_row_stride = D,
                       .k_batch_stride = std::int64_t(Hkv) * Sk * D,
                       .k_head_stride = std::int64_t(Sk) * D,
                       .k_row_stride = D,
                       .v_batch_stride = std::int64_t(Hkv) * Sk * D,
                       .v_head_stride = std::int64_t(Sk) * D,
                       .v_row_stride = D,
                       .o_batch_stride = std::int64_t(H) * Sq * D,
                       .o_head_stride = std::int64_t(Sq) * D,
                       .o_row_stride = D,
                       .batch = B,
                       .heads = H,
                       .kv_heads = Hkv,
                       .seq_q = Sq,
                       .seq_k = Sk,
                       .head_dim = D,
                       .scale = float(1.0 / std::sqrt(double(D))),
                       .mask = MaskKind::CausalBottomRight,
                       .bf16 = true,
                       .workspace = workspace};
  };
  const cu::DecodePlan plan = cu::flash_decode_plan(params(sets[0], nullptr));
  float* workspace = nullptr;
  CK(cudaMalloc(&workspace, 2 * std::size_t(B) * H * Sq * (D + 1) * 4));
  const std::vector<std::pair<std::string, std::function<cudaError_t(const DecodeSet&)>>> variants = {
      {"default (launch_flash)", [&](const DecodeSet& set) { return cu::launch_flash(params(set, nullptr), nullptr); }},
      {"2 splits + combine",
       [&](const DecodeSet& set) {
         return k::launch_flash_decode_kernels<128, k::Bf16, false>(
             k::DecodeArgs::from(params(set, workspace), plan.rows, plan.row_blocks, 2), /*after_prior=*/true, nullptr);
       }},
  };
  std::printf("decode %dx%d/%dx%d/%dx%d, plan: %d split(s), %d row block(s)\n", B, H, Hkv, Sq, Sk, D, plan.splits,
              plan.row_blocks);
  std::uint16_t* ref = nullptr;
  CK(cudaMalloc(&ref, nq * 2));
  CK(variants[0].second({sets[0].q, sets[0].k, sets[0].v, ref}));
  CK(cudaDeviceSynchronize());
  const Shape shape{B, H, Sq, D, MaskKind::None, 0, 0};  // compare() reads B x H x S x D outputs
  const double kv_bytes = 2.0 * nk * 2;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (const auto& [name, launch] : variants) {
    CK(cudaMemset(sets[0].o, 0xFF, nq * 2));
    CK(launch(sets[0]));
    CK(cudaDeviceSynchronize());
    double rel = 0;
    long nans = 0;
    compare(shape, sets[0].o, ref, &rel, &nans);
    for (int i = 0; i < 6; ++i) CK(launch(sets[i % 2]));
    std::vector<float> ms(30);
    for (int r = 0; r < 30; ++r) {
      CK(cudaEventRecord(e0));
      CK(launch(sets[r % 2]));
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      CK(cudaEventElapsedTime(&ms[r], e0, e1));
    }
    std::sort(ms.begin(), ms.end());
    std::printf("| %-24s | %.1f us | %.2f TB/s K/V | rel vs default %.1e | NaN %ld |\n", name.c_str(), ms[15] * 1e3,
                kv_bytes / (ms[15] * 1e-3) * 1e-12, rel, nans);
  }
  // The copy ceiling: a 1 GiB device-to-device copy, bytes read + written, best of 10.
  const std::size_t copy = std::size_t(1) << 30;
  void *src = nullptr, *dst = nullptr;
  CK(cudaMalloc(&src, copy));
  CK(cudaMalloc(&dst, copy));
  float best = 1e30f;
  for (int r = 0; r < 10; ++r) {
    float t = 0;
    CK(cudaEventRecord(e0));
    CK(cudaMemcpyAsync(dst, src, copy, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&t, e0, e1));
    best = std::min(best, t);
  }
  std::printf("copy ceiling: %.2f TB/s (1 GiB copy, read + written, best of 10)\n", 2.0 * copy / (best * 1e-3) * 1e-12);
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "decode") return decode_main();
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  int driver = 0, runtime = 0;
  CK(cudaDriverGetVersion(&driver));
  CK(cudaRuntimeGetVersion(&runtime));
  std::printf("device %s sm%d%d, %d SMs, driver API %d, runtime %d\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, driver, runtime);

  const std::vector<Shape> shapes = {
      {1, 4, 333, 64, MaskKind::Causal, 1, 1},  // tails: a partial query tile and key tile
      {2, 4, 200, 128, MaskKind::None, 1, 1},
      {8, 16, 1024, 64, MaskKind::Causal, 0.152, 0.257},
      {4, 16, 4096, 64, MaskKind::Causal, 0.569, 1.217},
      {16, 16, 2048, 64, MaskKind::None, 0, 0},  // issue 12's ViT-like row
      {2, 16, 8192, 128, MaskKind::Causal, 1.791, 3.405},
      {2, 16, 8192, 128, MaskKind::None, 3.267, 6.447},
      {1, 16, 16384, 128, MaskKind::Causal, 3.550, 6.740},
      // Head dims the sm90 kernel took in run 11 (no PyTorch target: 0).
      {4, 16, 4096, 96, MaskKind::Causal, 0, 0},
      {2, 16, 4096, 192, MaskKind::Causal, 0, 0},
      {2, 16, 4096, 256, MaskKind::Causal, 0, 0},
      {2, 16, 4096, 256, MaskKind::None, 0, 0},
  };
  struct Row {
    std::string shape, kernel;
    double ms, tflops, target;
    double rel;
    long nans;
  };
  std::vector<Row> rows;
  for (const Shape& s : shapes) {
    const std::size_t n = std::size_t(s.b) * s.h * s.s * s.d;
    const int nsets = n * 2 * 4 < (std::size_t(200) << 20) ? 4 : 2;  // keep the rotation well past the 60 MB L2
    std::vector<Set> sets(nsets);
    std::uint32_t seed = 1;
    for (Set& set : sets) {
      for (std::uint16_t** p : {&set.q, &set.k, &set.v, &set.o}) {
        CK(cudaMalloc(p, n * 2));
        fill_random<<<1024, 256>>>(*p, n, seed++);
        CK(cudaGetLastError());
      }
    }
    std::uint16_t* ref = nullptr;
    CK(cudaMalloc(&ref, n * 2));
    char name[64];
    std::snprintf(name, sizeof name, "%dx%dx%dx%d %s", s.b, s.h, s.s, s.d,
                  s.mask == MaskKind::None ? "none" : "causal");
    const double flops = 4.0 * s.b * s.h * visible_pairs(s) * s.d;

    // 192 has no sm80 kernel: its rows start at the sm90 default, which is then the reference.
    const bool sm80_built = attnprof::cuda::fused_head_dim_built(s.d);
    std::vector<std::pair<std::string, Launch>> kernels;
    if (sm80_built) {
      kernels = {
          {"flash", [](const FusedParams& p) { return attnprof::cuda::launch_flash_sm80(p, nullptr); }},
          {"efficient", [](const FusedParams& p) { return attnprof::cuda::launch_efficient(p, nullptr); }},
      };
    }
    const bool causal = s.mask != MaskKind::None;
    const auto add = [&]<class Launcher, class Cfg>(const char* kname, Launcher, Cfg) {
      kernels.push_back({kname, causal ? variant<Launcher, Cfg, k::MaskMode::Causal>()
                                       : variant<Launcher, Cfg, k::MaskMode::None>()});
    };
    if (prop.major == 9) {  // the wgmma kernel (sm90a) and its variants (flash_fwd_sm90.cuh)
      // FlashSm90Cfg<D, kBlockN, consumers, stages, skip rescale, producer warpgroup + setmaxnreg, pingpong,
      // intra-warpgroup overlap>; "flash sm90" is the default (run 12: wgp, ov, pingpong; 192/256 80-key tiles, 256
      // without pingpong).
      if (s.d == 64) {
        add("flash sm90", Sm90Default{}, k::FlashSm90DefaultCfg<64>{});
        add("sm90 wgp ov", Sm90{}, k::FlashSm90Cfg<64, 128, 2, 2, false, true, false, true>{});
        add("sm90 wgp ov 3st", Sm90{}, k::FlashSm90Cfg<64, 128, 2, 3, false, true, false, true>{});
        add("sm90 wgp ov persist", Sm90Persistent{}, k::FlashSm90Cfg<64, 128, 2, 2, false, true, false, true>{});
        add("sm90 wgp 3wg", Sm90{}, k::FlashSm90Cfg<64, 128, 3, 2, false, true>{});
        add("sm90 wgp 3wg ov", Sm90{}, k::FlashSm90Cfg<64, 128, 3, 2, false, true, false, true>{});
        add("sm90 wgp ov pp persist", Sm90Persistent{}, k::FlashSm90Cfg<64, 128, 2, 2, false, true, true, true>{});
        add("sm90 wgp 3wg ov persist", Sm90Persistent{}, k::FlashSm90Cfg<64, 128, 3, 2, false, true, false, true>{});
        add("sm90 wgp ov pp N64", Sm90{}, k::FlashSm90Cfg<64, 64, 2, 2, false, true, true, true>{});
      }
      if (s.d == 128) {
        add("flash sm90", Sm90Default{}, k::FlashSm90DefaultCfg<128>{});
        add("sm90 run-11 default", Sm90{}, k::FlashSm90Cfg<128, 128>{});
        add("sm90 wgp ov", Sm90{}, k::FlashSm90Cfg<128, 128, 2, 2, false, true, false, true>{});
        add("sm90 wgp ov 3st", Sm90{}, k::FlashSm90Cfg<128, 128, 2, 3, false, true, false, true>{});
        add("sm90 wgp ov pp 3st", Sm90{}, k::FlashSm90Cfg<128, 128, 2, 3, false, true, true, true>{});
        add("sm90 wgp ov persist", Sm90Persistent{}, k::FlashSm90Cfg<128, 128, 2, 2, false, true, false, true>{});
        add("sm90 wgp ov pp persist", Sm90Persistent{}, k::FlashSm90Cfg<128, 128, 2, 2, false, true, true, true>{});
      }
      if (s.d == 96) {
        add("flash sm90", Sm90Default{}, k::FlashSm90DefaultCfg<96>{});
        add("sm90 wgp ov", Sm90{}, k::FlashSm90Cfg<96, 128, 2, 2, false, true, false, true>{});
      }
      if (s.d == 192) {
        add("flash sm90", Sm90Default{}, k::FlashSm90DefaultCfg<192>{});
        add("sm90 wgp ov pp N64", Sm90{}, k::FlashSm90Cfg<192, 64, 2, 2, false, true, true, true>{});
      }
      if (s.d == 256) {
        add("flash sm90", Sm90Default{}, k::FlashSm90DefaultCfg<256>{});
        add("sm90 wgp ov N64", Sm90{}, k::FlashSm90Cfg<256, 64, 2, 2, false, true, false, true>{});
        add("sm90 wgp ov pp N80", Sm90{}, k::FlashSm90Cfg<256, 80, 2, 2, false, true, true, true>{});
      }
    }
    // Variants kept for comparison with the defaults (see flash_fwd_sm80.cuh).
    if (s.d == 64 && causal && s.s == 1024) {
      add("flash 64x64", Sm80{}, k::FlashCfg<64, 64, 64, true>{});
      add("flash prefetch at tile start", Sm80{}, k::FlashCfg<64, 128, 64, true, 1, false, k::Prefetch::TileStart>{});
    }
    if (s.d == 128 && s.s == 16384) {
      add("flash 128x32", Sm80{}, k::FlashCfg<128, 128, 32, false>{});
      add("flash no-skip", Sm80{}, k::FlashCfg<128, 128, 64, false, 1, false>{});
      add("flash prefetch at tile start", Sm80{}, k::FlashCfg<128, 128, 64, false, 1, true, k::Prefetch::TileStart>{});
    }
    // Reference output: the default flash kernel on set 0; every kernel is compared with it.
    const FusedParams ref_params = params_of(s, {sets[0].q, sets[0].k, sets[0].v, ref});
    CK(sm80_built ? attnprof::cuda::launch_flash_sm80(ref_params, nullptr)
                  : attnprof::cuda::launch_flash(ref_params, nullptr));
    CK(cudaDeviceSynchronize());
    for (auto& [kname, launch] : kernels) {
      CK(cudaMemset(sets[0].o, 0xFF, n * 2));
      CK(launch(params_of(s, sets[0])));
      CK(cudaDeviceSynchronize());
      double rel = 0;
      long nans = 0;
      compare(s, sets[0].o, ref, &rel, &nans);
      const double ms = median_ms(launch, s, sets, 30);
      const bool is_eff = kname.rfind("efficient", 0) == 0;
      rows.push_back({name, kname, ms, flops / ms * 1e-9, is_eff ? s.target_eff_ms : s.target_flash_ms, rel, nans});
      std::printf("%-26s %-20s %8.3f ms %7.1f TFLOP/s  (target %.3f)  vs flash rel %.2e nan %ld\n", name, kname.c_str(),
                  ms, flops / ms * 1e-9, rows.back().target, rel, nans);
      std::fflush(stdout);
    }
    for (Set& set : sets) {
      for (std::uint16_t* p : {set.q, set.k, set.v, set.o}) CK(cudaFree(p));
    }
    CK(cudaFree(ref));
  }
  std::printf(
      "\n| shape | kernel | ms | TFLOP/s | PyTorch target ms | rel diff vs flash |\n|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    std::printf("| %s | %s | %.3f | %.1f | %.3f%s | %.1e%s |\n", r.shape.c_str(), r.kernel.c_str(), r.ms, r.tflops,
                r.target, r.ms <= r.target ? "" : " (slower)", r.rel, r.nans ? " NaN!" : "");
  }
  return 0;
}
