// cudnn_graph.h: the 16-bit (fp16, bf16) SDPA graphs cudnn.cpp caches and
// runs, built through the cuDNN frontend: the inference forward, the forward
// of a training step (with the softmax statistics) and the backward, with
// their masks, soft cap, padding mask, ragged offsets and paged cache. FP8's
// graph is cudnn_fp8.cpp's. Built only with the cuDNN frontend.
#ifdef ATTNPROF_WITH_CUDNN

#include "backends/cuda/cudnn/cudnn_graph.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>

namespace attnprof::cuda::cudnn_graph {
namespace {

// The masks the forward and backward attributes spell alike. With a soft
// cap the structural masks are the score modifier's instead (soft_cap()):
// the frontend takes no diagonal band beside a score modifier.
template <class Attributes>
void set_mask(Attributes& a, const Problem& p, const std::shared_ptr<fe::graph::Tensor_attributes>& bias) {
  if (p.mask == MaskKind::Bias) a.set_bias(bias);
  if (p.softcap > 0) return;
  if (const auto band = diagonal_band(p)) {
    a.set_diagonal_alignment(band->alignment).set_diagonal_band_right_bound(0);
    if (band->left) a.set_diagonal_band_left_bound(static_cast<int>(*band->left));
  }
}

// Soft-capping as cuDNN's score modifier, on the scaled scores s before the
// bias (the order Problem::softcap gives): c tanh(s / c) through the
// frontend's Softcap (divide, tanh, multiply), then the structural mask the
// attributes cannot carry beside it, as the frontend's own subgraph for it.
// The backward graph applies the same forward to recompute P and Softcap's
// backward (dS (1 - tanh^2(s / c))) before the attention scale, so both of
// its modifiers share one Softcap, which keeps s / c between them.
template <class Attributes>
void soft_cap(Attributes& a, const Problem& p) {
  using fe::graph::attn::score_modifiers::Softcap;
  auto cap = std::make_shared<Softcap>();
  const auto value = static_cast<float>(p.softcap);
  const std::int64_t s_q = p.seq, s_kv = p.kv_seq;
  const std::optional<DiagonalBand> band = diagonal_band(p);
  a.set_score_mod([cap, value, s_q, s_kv, band](std::shared_ptr<fe::graph::Graph> g,
                                                std::shared_ptr<fe::graph::Tensor_attributes> s) {
    s = cap->forward(g, s, std::make_shared<fe::graph::Tensor_attributes>(value));
    if (!band) return s;
    return fe::graph::attn::score_modifiers::sliding_window_mask(g, s, band->alignment, band->left, 0, s_q, s_kv,
                                                                 nullptr, nullptr);
  });
  if constexpr (std::is_same_v<Attributes, fe::graph::SDPA_backward_attributes>) {
    a.set_score_mod_bprop(
        [cap, value](std::shared_ptr<fe::graph::Graph> g, std::shared_ptr<fe::graph::Tensor_attributes> ds) {
          return cap->backward(g, ds, std::make_shared<fe::graph::Tensor_attributes>(value));
        });
  }
}

void ragged(fe::graph::Graph& g, fe::graph::Tensor_attributes& t, Uid uid, const Layout& l) {
  for (const RaggedPair& r : kRagged) {
    if (r.tensor == uid && l.has(r.offset)) {
      t.set_ragged_offset(add_tensor(g, "ragged_offset", r.offset, l[r.offset], fe::DataType_t::INT32));
    }
  }
}

// A graph input from the layout, with its ragged offset when the layout
// has one for it.
std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& g, const char* name, Uid uid, const Layout& l,
                                                    fe::DataType_t type) {
  auto t = add_tensor(g, name, uid, l[uid], type);
  ragged(g, *t, uid, l);
  return t;
}

// Sets a graph output's uid, dims, strides, type and ragged offset from the layout.
void output(fe::graph::Graph& g, fe::graph::Tensor_attributes& t, Uid uid, const Layout& l, fe::DataType_t type) {
  t.set_output(true).set_uid(uid).set_dim(l[uid].dims).set_stride(l[uid].strides).set_data_type(type);
  ragged(g, t, uid, l);
}

// The padding mask with the call's per-sequence lengths (a packed batch's,
// a key-padding mask's), on a forward's or a backward's attributes.
template <class Attributes>
void padding(fe::graph::Graph& g, Attributes& options, const Layout& l) {
  if (!l.padding()) return;
  auto seq_q = add_tensor(g, "seq_len_q", kSeqQ, l[kSeqQ], fe::DataType_t::INT32);
  auto seq_kv = add_tensor(g, "seq_len_kv", kSeqKV, l[kSeqKV], fe::DataType_t::INT32);
  options.set_padding_mask(true).set_seq_len_q(seq_q).set_seq_len_kv(seq_kv);
}

// cuDNN's paged SDPA on a forward's attributes: the page tables (the block
// table for K and for V), the keys each sequence holds (the problem's, not
// the pages' padded count), and the padding mask paging requires, its
// lengths int32 [B, 1, 1, 1].
void paged(fe::graph::Graph& g, fe::graph::SDPA_attributes& options, const Problem& p, const Layout& l) {
  const TensorDesc counts{{p.batch, 1, 1, 1}, {1, 1, 1, 1}};
  auto seq_q = add_tensor(g, "seq_len_q", kSeqQ, counts, fe::DataType_t::INT32);
  auto seq_kv = add_tensor(g, "seq_len_kv", kSeqKV, counts, fe::DataType_t::INT32);
  auto table_k = add_tensor(g, "page_table_k", kPageK, l[kPageK], fe::DataType_t::INT32);
  auto table_v = add_tensor(g, "page_table_v", kPageV, l[kPageV], fe::DataType_t::INT32);
  options.set_padding_mask(true)
      .set_seq_len_q(seq_q)
      .set_seq_len_kv(seq_kv)
      .set_paged_attention_k_table(table_k)
      .set_paged_attention_v_table(table_v)
      .set_paged_attention_max_seq_len_kv(static_cast<int>(p.kv_seq));
}

}  // namespace

std::string build_sdpa(cudnnHandle_t handle, const Problem& p, const Layout& l, GraphKind kind,
                       std::shared_ptr<PlanGraph>& out) {
  const auto io = p.dtype == DType::BF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
  auto g = std::make_shared<PlanGraph>();
  g->set_io_data_type(io)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto q = input(*g, "Q", kQ, l, io);
  auto k = input(*g, "K", kK, l, io);
  auto v = input(*g, "V", kV, l, io);
  std::shared_ptr<fe::graph::Tensor_attributes> bias;
  if (p.mask == MaskKind::Bias) bias = add_tensor(*g, "Bias", kBias, l[kBias], io);
  const auto scale = static_cast<float>(p.softmax_scale());
  if (kind == GraphKind::Backward) {
    auto o = input(*g, "O", kO, l, io);
    auto d_o = input(*g, "dO", kDO, l, io);
    auto stats = input(*g, "Stats", kStats, l, fe::DataType_t::FLOAT);
    // The frontend's deterministic algorithm sums dQ in a fixed order
    // instead of with atomics: what --deterministic asks for.
    auto options = fe::graph::SDPA_backward_attributes()
                       .set_name("sdpa_backward")
                       .set_attn_scale(scale)
                       .set_deterministic_algorithm(p.deterministic);
    set_mask(options, p, bias);
    padding(*g, options, l);
    if (p.softcap > 0) soft_cap(options, p);
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, d_o, stats, options);
    output(*g, *dq, kDQ, l, io);
    output(*g, *dk, kDK, l, io);
    output(*g, *dv, kDV, l, io);
  } else {
    const bool train = kind == GraphKind::TrainForward;
    auto options = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(train).set_attn_scale(scale);
    set_mask(options, p, bias);
    padding(*g, options, l);
    if (p.softcap > 0) soft_cap(options, p);
    if (p.kv_cache == KvCache::Paged) paged(*g, options, p, l);
    auto [o, stats] = g->sdpa(q, k, v, options);
    output(*g, *o, kO, l, io);
    if (train) output(*g, *stats, kStats, l, fe::DataType_t::FLOAT);  // stats is null otherwise
  }
  out = g;
  return check_graph(*g, handle);
}

}  // namespace attnprof::cuda::cudnn_graph

#endif  // ATTNPROF_WITH_CUDNN
