// cudnn_fp8.h: cuDNN's FP8 SDPA graph, what it takes and the state a call
// binds. Built only with the cuDNN frontend (cudnn.cpp's other half).
#ifdef ATTNPROF_WITH_CUDNN

#include "backends/cuda/cudnn/cudnn_fp8.h"

#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <string>
#include <utility>

#include "attnprof/error.h"
#include "backends/cuda/fp8_descales.h"
#include "backends/cuda/ops/fp8_output.h"
#include "core/cuda_check.h"

namespace attnprof::cuda::cudnn_fp8 {
namespace {

using namespace cudnn_graph;  // NOLINT(google-build-using-namespace): the graphs' vocabulary (and `fe`)

// The scalars' uids in the buffer's slot order (Fp8State::scalars_).
constexpr std::array<Uid, 8> kScalarUids{kDescaleQ, kDescaleK, kDescaleV, kDescaleS, kScaleS, kScaleO, kAmaxS, kAmaxO};

std::string cudnn_version_string(long v) { return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100); }

// The structural mask on the FP8 attributes: the 16-bit graphs' band
// (diagonal_band()), except that where seq == kv_seq the bottom-right
// diagonal is the top-left one, which is how it is spelled here: Hopper's
// FP8 graph takes only that one (refusal()).
void set_mask(fe::graph::SDPA_fp8_attributes& a, const Problem& p) {
  auto band = diagonal_band(p);
  if (!band) return;
  if (p.seq == p.kv_seq) band->alignment = fe::DiagonalAlignment_t::TOP_LEFT;
  a.set_diagonal_alignment(band->alignment).set_diagonal_band_right_bound(0);
  if (band->left) a.set_diagonal_band_left_bound(static_cast<int>(*band->left));
}

void check_descale(float d, const char* field) {
  // 1 / (2 descale_v) is O's scale on Hopper: it must be finite too.
  if (!(std::isfinite(d) && d > 0 && std::isfinite(1.0f / (kOHeadroom * d)))) {
    fail(ErrorKind::InvalidArgument,
         std::string("cudnn: ") + field +
             " must be finite and positive (the real value is the stored e4m3 times it), got " + std::to_string(d),
         {field});
  }
}

}  // namespace

std::string refusal(const Problem& p, int sm) {
  if (p.pass != Pass::Forward) return kForwardOnly;
  if (p.varlen()) {
    return "packed (variable-length) batches are not built for cudnn in fp8 (its FP8 graph runs dense batches): use a "
           "dense batch, or dtype=bf16";
  }
  if (p.softcap > 0) return "a soft cap is not built for cudnn in fp8: use softcap=0, or dtype=bf16";
  if (p.kv_cache == KvCache::Paged) {
    return "a paged KV cache is not built for cudnn in fp8: use kv_cache=contiguous, or dtype=bf16";
  }
  if (p.mask == MaskKind::Bias || p.mask == MaskKind::Boolean) {
    return "cuDNN's FP8 SDPA takes no bias, so no mask=" + std::string(mask_name(p.mask)) +
           ": use mask=none, causal, causal-bottom-right or sliding-window, or dtype=bf16";
  }
  if (sm < 90) return "cuDNN's FP8 SDPA needs sm90 (Hopper) or newer; this GPU is sm" + std::to_string(sm);
  const auto version = static_cast<long>(cudnnGetVersion());
  if (version < 90100 || version == 91000) {
    return "cuDNN " + cudnn_version_string(version) +
           " has no FP8 SDPA forward (9.1 and newer have, 9.10.0 excepted): use dtype=bf16, or a newer cuDNN";
  }
  // Transformer Engine sets an FP8 graph's left bound from cuDNN 9.21 on
  // only; before, the FP8 engines are not known to honour it.
  if (p.mask == MaskKind::SlidingWindow && version < 92100) {
    return "cuDNN " + cudnn_version_string(version) +
           "'s FP8 SDPA takes no sliding window (the diagonal band's left bound, from cuDNN 9.21 on): use mask=causal "
           "or none, dtype=bf16, or a newer cuDNN";
  }
  if (geometry::bottom_right(p.mask) && p.seq != p.kv_seq && sm < 100) {
    return "cuDNN's FP8 SDPA takes the bottom-right diagonal (mask=" + std::string(mask_name(p.mask)) +
           " with kv_seq != seq) on sm100 and newer only; this GPU is sm" + std::to_string(sm) +
           ": use mask=causal or none, seq == kv_seq, or dtype=bf16";
  }
  return {};
}

bool writes_bf16_output(int sm) { return sm >= 100 && cudnnGetVersion() >= 91300; }

std::string build(cudnnHandle_t handle, const Problem& p, const Layout& l, bool bf16_out,
                  std::shared_ptr<PlanGraph>& out) {
  auto g = std::make_shared<PlanGraph>();
  out = g;
  try {
    constexpr auto e4m3 = fe::DataType_t::FP8_E4M3;
    g->set_io_data_type(e4m3)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto q = add_tensor(*g, "Q", kQ, l[kQ], e4m3);
    auto k = add_tensor(*g, "K", kK, l[kK], e4m3);
    auto v = add_tensor(*g, "V", kV, l[kV], e4m3);
    const auto scalar = [&](const char* name, Uid uid) {
      return add_tensor(*g, name, uid, l[uid], fe::DataType_t::FLOAT);
    };
    auto options = fe::graph::SDPA_fp8_attributes()
                       .set_name("sdpa_fp8")
                       .set_generate_stats(false)
                       .set_attn_scale(static_cast<float>(p.softmax_scale()));
    set_mask(options, p);
    auto [o, stats, amax_s, amax_o] = g->sdpa_fp8(
        q, k, v, scalar("Descale_Q", kDescaleQ), scalar("Descale_K", kDescaleK), scalar("Descale_V", kDescaleV),
        scalar("Descale_S", kDescaleS), scalar("Scale_S", kScaleS), scalar("Scale_O", kScaleO), options);
    o->set_output(true)
        .set_uid(kO)
        .set_dim(l[kO].dims)
        .set_stride(l[kO].strides)
        .set_data_type(bf16_out ? fe::DataType_t::BFLOAT16 : e4m3);
    for (const auto& [t, uid] : {std::pair{amax_s, kAmaxS}, std::pair{amax_o, kAmaxO}}) {
      t->set_output(true)
          .set_uid(uid)
          .set_dim(l[uid].dims)
          .set_stride(l[uid].strides)
          .set_data_type(fe::DataType_t::FLOAT);
    }
  } catch (const std::exception& e) {
    // The frontend throws where no SDPA implementation takes the attributes.
    return one_line(std::string("sdpa_fp8: ") + e.what());
  }
  return check_graph(*g, handle);
}

std::string how(const Problem& p, bool bf16_out) {
  std::string s =
      "cuDNN FP8 SDPA graph: e4m3 Q, K and V with their per-tensor descales, P quantized to e4m3 at scale 448 for P "
      "V, ";
  s += bf16_out ? "O written in bf16 by the graph"
                : "O written in e4m3 at scale 1/(2 descale_v) and converted to bf16 on the device (one more kernel per "
                  "forward: cuDNN takes a bf16 O from an FP8 graph on Blackwell only)";
  if (geometry::bottom_right(p.mask) && p.seq == p.kv_seq)
    s += ", the bottom-right diagonal as the top-left one (seq == kv_seq)";
  return s +
         ", amax_s and amax_o kept (read after the run), one generated kernel, plan built once per problem and "
         "cached";
}

Expectation expectation(const Problem&, bool bf16_out) {
  // The generated kernel, and the e4m3-to-bf16 conversion where O is e4m3.
  // The descales are copied only when they change (not in a steady run); on
  // Hopper cuDNN may also zero part of its workspace (a Memset the report
  // names, as for the 16-bit graph). A call with descale tensors (never the
  // profiler's runs) adds the one-thread kernel that writes them.
  return {{kForwardOp}, /*device_activities=*/bf16_out ? 1 : 2, /*copies=*/0};
}

std::size_t extra_bytes(const Problem& p, bool bf16_out) {
  std::size_t bytes = 8 * 4 * sizeof(float);  // the scalars
  if (!bf16_out) bytes += static_cast<std::size_t>(p.batch * p.heads * p.seq * p.head_dim);
  return bytes;
}

void Fp8State::allocate(RunContext& ctx) {
  scalars_ = Tensor::empty({1, 1, 1, static_cast<std::int64_t>(kSlots * kStride)}, DType::F32, ctx.allocator);
  for (std::size_t i = 0; i < kSlots; ++i) {
    views_[i] = scalars_.as_strided({1, 1, 1, 1}, {1, 1, 1, 1}, static_cast<std::int64_t>(i * kStride));
  }
  // The amaxes start at 0 (cuDNN 9.19 overwrites them; another engine might fold with a max).
  ATTNPROF_CUDA_CHECK(cudaMemsetAsync(scalars_.data(), 0, scalars_.nbytes(), static_cast<cudaStream_t>(ctx.stream)));
  copied_ = false;
}

void Fp8State::bind(const Problem& p, const Inputs& in, const Tensor& out, bool bf16_out, Bound& t, RunContext& ctx) {
  for (const auto& [x, name] : {std::pair{&in.q, "q"}, std::pair{&in.k, "k"}, std::pair{&in.v, "v"}}) {
    if (!x->defined() || x->dtype() != DType::F8E4M3 || x->device() != Device::Cuda) {
      fail(ErrorKind::InvalidArgument,
           std::string("cudnn: dtype=fp8 reads an e4m3 CUDA ") + name + ", got " +
               (x->defined() ? x->describe() : "none"),
           {name});
    }
  }
  const Dims o_sizes{p.batch, p.heads, p.seq, p.head_dim};
  if (!out.defined() || out.dtype() != DType::BF16 || out.sizes() != o_sizes) {
    fail(ErrorKind::InvalidArgument, "cudnn: dtype=fp8 writes a bf16 output of " + attnprof::dims_string(o_sizes) +
                                         ", got " + (out.defined() ? out.describe() : "none"));
  }
  check_descale(in.q_descale, "q_descale");
  check_descale(in.k_descale, "k_descale");
  check_descale(in.v_descale, "v_descale");
  if (!scalars_.defined()) allocate(ctx);
  // In the graph's order: descale q, k, v, s; scale s, o.
  const float scale_o = bf16_out ? 1.0f : 1.0f / (kOHeadroom * in.v_descale);
  const std::array<float, kInputs> values{in.q_descale, in.k_descale, in.v_descale, 1.0f / kPScale, kPScale, scale_o};
  if (in.device_descales()) {
    // The caller's descale tensors, read on the device in ctx.stream's order
    // (never on the host): one one-thread kernel writes the six scalars,
    // scale_o from V's descale there. The next call with numbers copies again.
    Fp8GraphScalars g{{device_descale(in.q_descale_tensor, "q_descale", Device::Cuda),
                       device_descale(in.k_descale_tensor, "k_descale", Device::Cuda),
                       device_descale(in.v_descale_tensor, "v_descale", Device::Cuda)},
                      {}};
    std::copy(values.begin(), values.end(), g.host);
    fp8_graph_scalars(g, static_cast<float*>(scalars_.data()), static_cast<int>(kStride), bf16_out ? 0.f : kOHeadroom,
                      ctx.stream);
    copied_ = false;
  } else if (!copied_ || values != written_) {
    // The stream's earlier forwards read the old values before this copy
    // lands; pageable memory is staged before the call returns.
    std::array<float, kInputs * kStride> host{};
    for (std::size_t i = 0; i < kInputs; ++i) host[i * kStride] = values[i];
    ATTNPROF_CUDA_CHECK(cudaMemcpyAsync(scalars_.data(), host.data(), sizeof(host), cudaMemcpyHostToDevice,
                                        static_cast<cudaStream_t>(ctx.stream)));
    written_ = values;
    copied_ = true;
  }
  if (!bf16_out && (!o8_.defined() || o8_.sizes() != o_sizes)) {
    o8_ = Tensor();
    o8_ = Tensor::empty(o_sizes, DType::F8E4M3, ctx.allocator);
  }
  t[slot(kQ)] = &in.q;
  t[slot(kK)] = &in.k;
  t[slot(kV)] = &in.v;
  t[slot(kO)] = bf16_out ? &out : &o8_;
  for (std::size_t i = 0; i < kSlots; ++i) t[slot(kScalarUids[i])] = &views_[i];
}

void Fp8State::finish(const Inputs& in, Tensor& out, bool bf16_out, RunContext& ctx) {
  ran_ = true;
  // V's descale tensor, where given, is read by the conversion itself.
  if (!bf16_out) {
    e4m3_to_bf16(o8_, kOHeadroom * in.v_descale, device_descale(in.v_descale_tensor, "v_descale", Device::Cuda), out,
                 ctx.stream);
  }
}

std::optional<Fp8Amax> Fp8State::read_amax(void* stream) {
  if (!ran_ || !scalars_.defined()) return std::nullopt;
  const auto s = static_cast<cudaStream_t>(stream);
  std::array<float, 2 * kStride> host{};
  char* amaxes = static_cast<char*>(scalars_.data()) + kInputs * kStride * sizeof(float);
  ATTNPROF_CUDA_CHECK(cudaMemcpyAsync(host.data(), amaxes, sizeof(host), cudaMemcpyDeviceToHost, s));
  ATTNPROF_CUDA_CHECK(cudaStreamSynchronize(s));
  ATTNPROF_CUDA_CHECK(cudaMemsetAsync(amaxes, 0, sizeof(host), s));
  ran_ = false;
  return Fp8Amax{.s = host[0], .o = host[kStride]};
}

}  // namespace attnprof::cuda::cudnn_fp8

#endif  // ATTNPROF_WITH_CUDNN
