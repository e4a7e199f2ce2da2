// The fused kernels' arguments from a problem and a call's tensors
// (fused_inputs.h): no launch here, and no read of a device tensor's values.
#include "backends/cuda/fused_inputs.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <initializer_list>

#include "attnprof/check_inputs.h"
#include "attnprof/error.h"
#include "backends/cuda/runtime.h"
#include "backends/cuda/sequence_lengths.h"
#include "core/mask_geometry.h"
#include "core/rows.h"

namespace attnprof::cuda {
namespace {

// A caller's cumulative lengths (Inputs::cu_seqlens_q or _k) as the kernels
// read them: contiguous int32 [1, 1, 1, batch + 1] on the GPU.
const std::int32_t* device_cu_seqlens_of(std::string_view backend, const Tensor& cu, const char* what,
                                         const Problem& p) {
  if (!cu.defined() || cu.dtype() != DType::I32 || cu.device() != Device::Cuda || cu.numel() != p.batch + 1 ||
      (p.batch > 0 && cu.stride(3) != 1)) {
    fail(ErrorKind::InvalidArgument, std::string(backend) + ": " + what + " must be contiguous int32 [" +
                                         std::to_string(p.batch + 1) + "] on the GPU; got " +
                                         (cu.defined() ? cu.describe() : std::string("none")));
  }
  return cu.data_as<std::int32_t>();
}

// A dense batch's rows (Inputs::q_rows or kv_rows) as the kernels read
// them, int32 (begin, end) pairs, or for kv_rows also key ends alone
// ([1, 1, B, 1], a paged call's seq_lens: begin 0); null when not given.
const std::int32_t* device_rows(std::string_view backend, const Tensor& rows, const char* what, const Problem& p,
                                bool ends_only) {
  if (!rows.defined()) return nullptr;
  const std::int64_t width = rows.size(3);
  if (rows.dtype() != DType::I32 || rows.device() != Device::Cuda || rows.size(0) != 1 || rows.size(1) != 1 ||
      rows.size(2) != p.batch || !(width == 2 || (ends_only && width == 1)) || (width > 1 && rows.stride(3) != 1) ||
      (p.batch > 1 && rows.stride(2) != width)) {
    fail(ErrorKind::InvalidArgument, std::string(backend) + ": " + what + " must be contiguous int32 [1, 1, " +
                                         std::to_string(p.batch) + (ends_only ? ", 2 or 1]" : ", 2]") +
                                         " on the GPU; got " + rows.describe());
  }
  return rows.data_as<std::int32_t>();
}

}  // namespace

FusedShape fused_shape_for(const Problem& p, const BatchLayout& l) {
  const bool packed = l.form == BatchLayout::Form::Packed;
  return {.batch = static_cast<int>(p.batch),
          .heads = static_cast<int>(p.heads),
          .kv_heads = static_cast<int>(p.kv_heads),
          .seq_q = static_cast<int>(p.seq),
          .seq_k = static_cast<int>(p.kv_seq),
          .head_dim = static_cast<int>(p.head_dim),
          .scale = static_cast<float>(p.softmax_scale()),
          .mask = p.mask,
          .window = geometry::clamp_window(p.window, static_cast<int>(p.kv_seq)),
          .page_size = l.form == BatchLayout::Form::Paged ? static_cast<int>(p.page_size) : 0,
          .pages_per_seq = l.form == BatchLayout::Form::Paged ? static_cast<int>(p.pages_per_seq()) : 0,
          .packed = packed,
          .total_q = packed ? static_cast<int>(p.total_q()) : 0,
          .total_k = packed ? static_cast<int>(p.total_kv()) : 0,
          .rows = l.form == BatchLayout::Form::Padded && l.reads_rows(),
          .softcap = static_cast<float>(p.softcap),
          .fp8 = is_fp8(p.dtype),
          .lse = p.pass != Pass::Forward};
}

FusedParams fused_params_for(const Problem& p) {
  FusedParams f;
  f.batch = static_cast<int>(p.batch);
  f.heads = static_cast<int>(p.heads);
  f.kv_heads = static_cast<int>(p.kv_heads);
  f.seq_q = static_cast<int>(p.seq);
  f.seq_k = static_cast<int>(p.kv_seq);
  f.head_dim = static_cast<int>(p.head_dim);
  f.scale = static_cast<float>(p.softmax_scale());
  f.bf16 = p.dtype == DType::BF16;
  f.fp8 = is_fp8(p.dtype);
  // At most the longest sequence's keys: the same band for every window in
  // 1..INT64_MAX, and int32 arithmetic in the kernels (mask_geometry.h).
  f.window = geometry::clamp_window(p.window, f.seq_k);
  if (p.kv_cache == KvCache::Paged) {
    f.page_size = static_cast<int>(p.page_size);
    f.pages_per_seq = static_cast<int>(p.pages_per_seq());
    f.num_pages = static_cast<int>(std::min<std::int64_t>(p.batch * p.pages_per_seq(), INT32_MAX));  // make_inputs'
  }
  f.mask = p.mask;
  f.softcap = static_cast<float>(p.softcap);
  if (p.varlen()) {
    f.total_q = static_cast<int>(p.total_q());
    f.total_k = static_cast<int>(p.total_kv());
  }
  return f;
}

Dims fused_lse_dims(const Problem& p) {
  return p.varlen() ? Dims{1, p.heads, p.total_q(), 1} : Dims{p.batch, p.heads, p.seq, 1};
}

void bind_forward_tensors(FusedParams& f, std::string_view backend, const Inputs& in, const Tensor& out, float* lse,
                          bool paged) {
  const Tensor& k = paged ? in.k_pages : in.k;
  const Tensor& v = paged ? in.v_pages : in.v;
  for (const Tensor* t : std::initializer_list<const Tensor*>{&in.q, &k, &v, &out}) {
    if (t->stride(3) != 1) {
      fail(ErrorKind::Unsupported, std::string(backend) + " needs a contiguous head_dim; got " + t->describe());
    }
  }
  f.q = in.q.data();
  f.k = k.data();
  f.v = v.data();
  f.o = out.data();
  set_strides(in.q, f.q_batch_stride, f.q_head_stride, f.q_row_stride);
  set_strides(k, f.k_batch_stride, f.k_head_stride, f.k_row_stride);
  set_strides(v, f.v_batch_stride, f.v_head_stride, f.v_row_stride);
  set_strides(out, f.o_batch_stride, f.o_head_stride, f.o_row_stride);
  f.lse = lse;
}

void bind_sequences(FusedParams& f, std::string_view backend, const Problem& p, const Inputs& in, RunContext& ctx) {
  if (p.lengths_on_device) {
    f.cu_seqlens_q = device_cu_seqlens_of(backend, in.cu_seqlens_q, "cu_seqlens_q", p);
    f.cu_seqlens_k = device_cu_seqlens_of(backend, in.cu_seqlens_k, "cu_seqlens_k", p);
    f.input_errors = device_input_errors();
    f.q_batch_stride = f.k_batch_stride = f.v_batch_stride = f.o_batch_stride = 0;
  } else if (p.varlen()) {
    const PackedLengths cu = device_cu_seqlens(p, static_cast<cudaStream_t>(ctx.stream));
    f.cu_seqlens_q = cu.cu_q;
    f.cu_seqlens_k = cu.cu_k;
    f.q_batch_stride = f.k_batch_stride = f.v_batch_stride = f.o_batch_stride = 0;
  }
  f.q_rows = device_rows(backend, in.q_rows, "q_rows", p, /*ends_only=*/false);
  f.kv_rows = device_rows(backend, in.kv_rows, "kv_rows", p, /*ends_only=*/true);
  if (f.kv_rows != nullptr) f.kv_rows_width = static_cast<int>(in.kv_rows.size(3));
  // The checking mode (attnprof/check_inputs.h): the (begin, end) pairs
  // read in the caller's stream order (a wait) and checked as the CPU
  // checks them (core/rows.h), a bad entry refused in one line naming it.
  // (A paged call's key ends are checked by its binding.)
  const bool pairs = f.q_rows != nullptr || (f.kv_rows != nullptr && f.kv_rows_width == 2);
  if (pairs && checking_inputs()) {
    const auto stream = static_cast<cudaStream_t>(ctx.stream);
    Inputs host;
    if (f.q_rows != nullptr) host.q_rows = download_on(in.q_rows, stream);
    if (f.kv_rows != nullptr && f.kv_rows_width == 2) host.kv_rows = download_on(in.kv_rows, stream);
    sequence_rows(p, host);
  }
}

void set_strides(const Tensor& t, std::int64_t& b, std::int64_t& h, std::int64_t& r) {
  b = t.stride(0);
  h = t.stride(1);
  r = t.stride(2);
}

void set_contiguous(std::int64_t& b, std::int64_t& h, std::int64_t& r, std::int64_t heads, std::int64_t rows,
                    std::int64_t dim) {
  r = dim;
  h = rows * dim;
  b = heads * rows * dim;
}

const std::string& shape_key_of(const Problem& p) {
  struct Last {
    std::int64_t batch = -1, heads = -1, seq = -1, head_dim = -1;
    std::string key;
  };
  thread_local Last last;
  if (p.batch != last.batch || p.heads != last.heads || p.seq != last.seq || p.head_dim != last.head_dim) {
    last.key = p.shape_key();
    last.batch = p.batch;
    last.heads = p.heads;
    last.seq = p.seq;
    last.head_dim = p.head_dim;
  }
  return last.key;
}

}  // namespace attnprof::cuda
