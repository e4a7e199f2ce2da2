// cudnn_inputs.h: a boolean mask lowered and a packed batch's offsets and
// lengths bound, for cudnn.cpp's run(). Built only with the cuDNN frontend.
#ifdef ATTNPROF_WITH_CUDNN

#include "backends/cuda/cudnn/cudnn_inputs.h"

#include <cuda_runtime.h>

#include <limits>
#include <string>
#include <utility>

#include "attnprof/error.h"
#include "backends/cuda/ops/mask_to_bias.h"
#include "backends/cuda/sequence_lengths.h"
#include "core/cuda_check.h"

namespace attnprof::cuda::cudnn_graph {
namespace {

const char* ragged_name(Uid uid) {
  switch (uid) {
    case kQ:
      return "q";
    case kK:
      return "k";
    case kV:
      return "v";
    case kO:
      return "output";
    case kStats:
      return "saved log-sum-exp";
    case kDO:
      return "dout";
    case kDQ:
      return "dq";
    case kDK:
      return "dk";
    default:
      return "dv";
  }
}

}  // namespace

Problem CallInputs::lower_mask(const Problem& p, const Inputs& in, Bound& t, RunContext& ctx, const Takes& takes) {
  if (!in.mask.defined() || in.mask.dtype() != DType::Bool || in.mask.device() != Device::Cuda) {
    fail(ErrorKind::InvalidArgument, "cudnn: mask=boolean without a bool CUDA mask tensor (Inputs::mask)");
  }
  Problem g = p;
  if (p.softcap == 0) {
    // cuDNN's padding mask takes each sequence's key count from key 0:
    // right padding only (a left-padded mask runs as the bias below).
    std::optional<std::vector<std::int32_t>> lens;
    if (auto rows = lowered_key_padding(in.mask, static_cast<cudaStream_t>(ctx.stream));
        rows && static_cast<std::int64_t>(rows->size()) == p.batch) {
      lens.emplace();
      for (const RowSpan& r : *rows) {
        if (r.begin != 0) {
          lens.reset();
          break;
        }
        lens->push_back(r.end);
      }
    }
    if (lens) {
      g.mask = MaskKind::None;
      Bound padded = t;
      padded[slot(kSeqQ)] = &ints(std::vector<std::int32_t>(lens->size(), static_cast<std::int32_t>(p.seq)), ctx);
      padded[slot(kSeqKV)] = &ints(*lens, ctx);
      if (takes(g, layout_of(g, padded))) {
        t = padded;
        return g;
      }
    }
  }
  g.mask = MaskKind::Bias;
  const Dims sizes = compact_sizes(in.mask);
  if (!mask_bias_.defined() || mask_bias_.sizes() != sizes || mask_bias_.dtype() != p.dtype) {
    mask_bias_ = Tensor();
    mask_bias_ = Tensor::empty(sizes, p.dtype, ctx.allocator);
  }
  mask_to_bias(in.mask, mask_bias_, ctx.stream);
  t[slot(kBias)] = &mask_bias_;
  return g;
}

void CallInputs::bind_ragged(const Problem& p, Bound& t, RunContext& ctx) {
  const std::vector<std::int64_t> cu_q = p.cu_seqlens_q(), cu_k = p.cu_seqlens_k();
  for (const RaggedPair& r : kRagged) {
    const Tensor* x = t[slot(r.tensor)];
    if (x == nullptr) continue;
    const bool q = query_rows(r.tensor);
    const std::int64_t heads =
        r.tensor == kQ || r.tensor == kO || r.tensor == kStats || r.tensor == kDO || r.tensor == kDQ ? p.heads
                                                                                                     : p.kv_heads;
    const std::int64_t total = q ? p.total_q() : p.total_kv();
    const std::int64_t d = r.tensor == kStats ? 1 : p.head_dim;
    if (x->size(0) != 1 || x->size(1) != heads || x->size(2) != total || x->size(3) != d) {
      fail(ErrorKind::InvalidArgument, std::string("cudnn: a packed batch's ") + ragged_name(r.tensor) +
                                           " must be [1, " + std::to_string(heads) + ", " + std::to_string(total) +
                                           ", " + std::to_string(d) + "] (the batch's rows), got " + x->describe());
    }
    const std::vector<std::int64_t>& cu = q ? cu_q : cu_k;
    std::vector<std::int32_t> offsets(cu.size());
    for (std::size_t b = 0; b < cu.size(); ++b) {
      const std::int64_t o = cu[b] * x->stride(2);
      if (o > std::numeric_limits<std::int32_t>::max()) {
        fail(ErrorKind::Unsupported, std::string("cudnn: a packed batch's ") + ragged_name(r.tensor) +
                                         " spans more than 2^31 elements, past cuDNN's int32 ragged offsets");
      }
      offsets[b] = static_cast<std::int32_t>(o);
    }
    t[slot(r.offset)] = &ints(offsets, ctx);
  }
  const auto lengths = [&](auto len) {
    std::vector<std::int32_t> v(static_cast<std::size_t>(p.batch));
    for (std::int64_t b = 0; b < p.batch; ++b) v[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(len(b));
    return v;
  };
  t[slot(kSeqQ)] = &ints(lengths([&](std::int64_t b) { return p.seq_len(b); }), ctx);
  t[slot(kSeqKV)] = &ints(lengths([&](std::int64_t b) { return p.kv_seq_len(b); }), ctx);
}

bool CallInputs::trim() {
  if (ints_.size() <= kMaxInts) return false;
  ints_.clear();
  return true;
}

const Tensor& CallInputs::ints(const std::vector<std::int32_t>& values, RunContext& ctx) {
  return ints_.get(values, ctx.allocator, static_cast<cudaStream_t>(ctx.stream));
}

}  // namespace attnprof::cuda::cudnn_graph

#endif  // ATTNPROF_WITH_CUDNN
