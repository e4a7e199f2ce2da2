// cudnn_inputs.h: a boolean mask lowered and a packed batch's offsets and
// lengths bound, for cudnn.cpp's run(). Built only with the cuDNN frontend.
#ifdef ATTNPROF_WITH_CUDNN

#include "backends/cuda/cudnn/cudnn_inputs.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <limits>
#include <string>
#include <utility>

#include "attnprof/error.h"
#include "backends/cuda/ops/mask_to_bias.h"
#include "backends/cuda/ops/ragged_offsets.h"
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

// A packed batch's tensor must hold the batch's rows, [1, heads, total, d];
// returns the total.
std::int64_t checked_ragged_rows(const Problem& p, Uid tensor, const Tensor& x) {
  const std::int64_t heads =
      tensor == kQ || tensor == kO || tensor == kStats || tensor == kDO || tensor == kDQ ? p.heads : p.kv_heads;
  const std::int64_t total = query_rows(tensor) ? p.total_q() : p.total_kv();
  const std::int64_t d = tensor == kStats ? 1 : p.head_dim;
  if (x.size(0) != 1 || x.size(1) != heads || x.size(2) != total || x.size(3) != d) {
    fail(ErrorKind::InvalidArgument, std::string("cudnn: a packed batch's ") + ragged_name(tensor) + " must be [1, " +
                                         std::to_string(heads) + ", " + std::to_string(total) + ", " +
                                         std::to_string(d) + "] (the batch's rows), got " + x.describe());
  }
  return total;
}

}  // namespace

Problem CallInputs::lower_mask(const Problem& p, const Inputs& in, Bound& t, RunContext& ctx) {
  if (!in.mask.defined() || in.mask.dtype() != DType::Bool || in.mask.device() != Device::Cuda) {
    fail(ErrorKind::InvalidArgument, "cudnn: mask=boolean without a bool CUDA mask tensor (Inputs::mask)");
  }
  // Always the bias, made on the device: which masks could run as cuDNN's
  // padding mask (right key padding) only the mask's contents say, and
  // reading them is a host read out of the caller's stream order (issue 56).
  Problem g = p;
  g.mask = MaskKind::Bias;
  Dims sizes = compact_sizes(in.mask);
  // A training pass's graphs take the bias with its query rows written out:
  // cuDNN's backward gave gradients off by a relative 160 for a key-padding
  // mask's bias broadcast over the queries ([B, 1, 1, Skv], H100, cuDNN
  // 9.19), where the forward was right.
  if (p.pass != Pass::Forward) sizes[2] = p.seq;
  if (!mask_bias_.defined() || mask_bias_.sizes() != sizes || mask_bias_.dtype() != p.dtype) {
    mask_bias_ = Tensor();
    mask_bias_ = Tensor::empty(sizes, p.dtype, ctx.allocator);
  }
  mask_to_bias(in.mask, mask_bias_, ctx.stream);
  t[slot(kBias)] = &mask_bias_;
  return g;
}

void CallInputs::bind_ragged(const Problem& p, const Inputs& in, Bound& t, RunContext& ctx) {
  if (p.lengths_on_device) return bind_device_ragged(p, in, t, ctx);
  const std::vector<std::int64_t> cu_q = p.cu_seqlens_q(), cu_k = p.cu_seqlens_k();
  for (const RaggedPair& r : kRagged) {
    const Tensor* x = t[slot(r.tensor)];
    if (x == nullptr) continue;
    const bool q = query_rows(r.tensor);
    checked_ragged_rows(p, r.tensor, *x);
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

void CallInputs::bind_device_ragged(const Problem& p, const Inputs& in, Bound& t, RunContext& ctx) {
  for (const auto& [cu, name] :
       {std::pair{&in.cu_seqlens_q, "cu_seqlens_q"}, std::pair{&in.cu_seqlens_k, "cu_seqlens_k"}}) {
    if (!cu->defined() || cu->dtype() != DType::I32 || cu->device() != Device::Cuda || cu->numel() != p.batch + 1 ||
        (cu->numel() > 1 && cu->stride(3) != 1)) {
      fail(ErrorKind::InvalidArgument,
           std::string("cudnn: a packed batch whose lengths are on the device reads ") + name +
               " as contiguous int32 [batch + 1] = [" + std::to_string(p.batch + 1) + "] on the GPU, got " +
               (cu->defined() ? cu->describe() : "none"),
           {name});
    }
  }
  RaggedOffsetsArgs a;
  a.cu_q = in.cu_seqlens_q.data_as<const std::int32_t>();
  a.cu_k = in.cu_seqlens_k.data_as<const std::int32_t>();
  a.batch = static_cast<int>(p.batch);
  a.total_q = static_cast<int>(p.total_q());
  a.total_k = static_cast<int>(p.total_kv());
  a.max_q = static_cast<int>(p.seq);
  a.max_k = static_cast<int>(p.kv_seq);
  a.input_errors = device_input_errors();
  std::array<Uid, kRagged.size()> offset_uids{};
  for (const RaggedPair& r : kRagged) {
    const Tensor* x = t[slot(r.tensor)];
    if (x == nullptr) continue;
    const bool q = query_rows(r.tensor);
    const std::int64_t total = checked_ragged_rows(p, r.tensor, *x);
    // Every offset the kernel can make is at most total x stride: checked
    // here once, from the shapes, for cuDNN's int32 offsets.
    if (total * x->stride(2) > std::numeric_limits<std::int32_t>::max()) {
      fail(ErrorKind::Unsupported, std::string("cudnn: a packed batch's ") + ragged_name(r.tensor) +
                                       " spans more than 2^31 elements, past cuDNN's int32 ragged offsets");
    }
    a.row_stride[a.count] = x->stride(2);
    a.query[a.count] = q;
    offset_uids[static_cast<std::size_t>(a.count)] = r.offset;
    ++a.count;
  }
  const std::int64_t n = static_cast<std::int64_t>(a.count) * (p.batch + 1) + 2 * p.batch;
  DeviceRagged& d = device_ragged_[ctx.stream];
  if (!d.buffer.defined() || d.buffer.numel() < n) {
    d.buffer = Tensor();
    d.buffer = Tensor::empty(
        {1, 1, 1, std::max<std::int64_t>(n, static_cast<std::int64_t>(kRagged.size() + 2) * (p.batch + 1))}, DType::I32,
        ctx.allocator);
    d.views = {};
  }
  a.out = d.buffer.data_as<std::int32_t>();
  ragged_offsets(a, ctx.stream);
  const auto view = [&](std::size_t i, std::int64_t at, std::int64_t rows) -> const Tensor* {
    Tensor& v = d.views[i];
    if (!v.defined() || v.size(0) != rows || v.offset() != d.buffer.offset() + at) {
      v = d.buffer.as_strided({rows, 1, 1, 1}, {1, 1, 1, 1}, d.buffer.offset() + at);
    }
    return &v;
  };
  for (int i = 0; i < a.count; ++i) {
    t[slot(offset_uids[static_cast<std::size_t>(i)])] =
        view(static_cast<std::size_t>(i), static_cast<std::int64_t>(i) * (p.batch + 1), p.batch + 1);
  }
  const std::int64_t lengths = static_cast<std::int64_t>(a.count) * (p.batch + 1);
  t[slot(kSeqQ)] = view(kRagged.size(), lengths, p.batch);
  t[slot(kSeqKV)] = view(kRagged.size() + 1, lengths + p.batch, p.batch);
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
