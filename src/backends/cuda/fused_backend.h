// The Backend shell around one fused kernel (efficient, flash): eligibility
// from the kernel's own answer, FusedParams from the problem and the tensors,
// one RecordFunction and one launch per forward.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "attnprof/error.h"
#include "attnprof/profiler.h"
#include "backends/cuda/arch_check.h"
#include "backends/cuda/fused_kernels.h"
#include "core/cuda_check.h"

namespace attnprof::cuda {

class FusedBackend : public Backend {
 public:
  using Launch = cudaError_t (*)(const FusedParams&, cudaStream_t);
  // What eligibility says will run for a problem of this shape.
  using Story = const char* (*)(const FusedParams& shape);

  FusedBackend(std::string_view name, std::string_view op, bool flash, Launch launch, Story story)
      : name_(name), op_(op), flash_(flash), launch_(launch), story_(story) {}

  std::string_view name() const override { return name_; }
  Device device() const override { return Device::Cuda; }

  Eligibility eligibility(const Problem& p) const override {
    if (p.dtype == DType::F32) return {false, "fp32 is not supported: the fused kernels take fp16 or bf16 (use math)"};
    if (p.mask == MaskKind::Boolean || p.mask == MaskKind::Bias) {
      return {false, std::string(mask_name(p.mask)) + " masks are not supported by our fused kernel: use naive, math" +
                         (p.mask == MaskKind::Bias ? " or cudnn" : "")};
    }
    if (std::string why = arch_unsupported_reason(); !why.empty()) return {false, why};
    // A shape-only question: contiguous strides, and an aligned stand-in
    // address for the tensors, which nothing dereferences.
    FusedParams shape = params_for(p);
    void* const stand_in = reinterpret_cast<void*>(std::uintptr_t{256});
    shape.q = shape.k = shape.v = shape.o = stand_in;
    set_contiguous(shape.q_batch_stride, shape.q_head_stride, shape.q_row_stride, p.heads, p.seq, p.head_dim);
    set_contiguous(shape.k_batch_stride, shape.k_head_stride, shape.k_row_stride, p.kv_heads, p.kv_seq, p.head_dim);
    set_contiguous(shape.v_batch_stride, shape.v_head_stride, shape.v_row_stride, p.kv_heads, p.kv_seq, p.head_dim);
    set_contiguous(shape.o_batch_stride, shape.o_head_stride, shape.o_row_stride, p.heads, p.seq, p.head_dim);
    if (const char* why = fused_unsupported_reason(shape, flash_)) return {false, why};
    return {true, story_(shape)};
  }

  std::size_t workspace_bytes(const Problem&) const override { return 0; }

  Expectation expectation(const Problem&) const override {
    Expectation e;
    e.cpu_ops = {std::string(op_)};
    e.device_activities = 1;
    return e;
  }

  void forward(const Problem& p, const Inputs& in, Tensor& out, RunContext& ctx) override {
    RecordFunction rf(op_, dtype_name(p.dtype), p.shape_key());
    for (const Tensor* t : std::initializer_list<const Tensor*>{&in.q, &in.k, &in.v, &out}) {
      if (t->stride(3) != 1) {
        fail(ErrorKind::Unsupported, std::string(name_) + " needs a contiguous head_dim; got " + t->describe());
      }
    }
    FusedParams f = params_for(p);
    f.q = in.q.data();
    f.k = in.k.data();
    f.v = in.v.data();
    f.o = out.data();
    set_strides(in.q, f.q_batch_stride, f.q_head_stride, f.q_row_stride);
    set_strides(in.k, f.k_batch_stride, f.k_head_stride, f.k_row_stride);
    set_strides(in.v, f.v_batch_stride, f.v_head_stride, f.v_row_stride);
    set_strides(out, f.o_batch_stride, f.o_head_stride, f.o_row_stride);
    if (const char* why = fused_unsupported_reason(f, flash_))
      fail(ErrorKind::Unsupported, std::string(name_) + ": " + why);
    ATTNPROF_CUDA_CHECK(launch_(f, static_cast<cudaStream_t>(ctx.stream)));
  }

 private:
  static void set_strides(const Tensor& t, std::int64_t& b, std::int64_t& h, std::int64_t& r) {
    b = t.stride(0);
    h = t.stride(1);
    r = t.stride(2);
  }

  static void set_contiguous(std::int64_t& b, std::int64_t& h, std::int64_t& r, std::int64_t heads, std::int64_t rows,
                             std::int64_t dim) {
    r = dim;
    h = rows * dim;
    b = heads * rows * dim;
  }

  static FusedParams params_for(const Problem& p) {
    FusedParams f;
    f.batch = static_cast<int>(p.batch);
    f.heads = static_cast<int>(p.heads);
    f.kv_heads = static_cast<int>(p.kv_heads);
    f.seq_q = static_cast<int>(p.seq);
    f.seq_k = static_cast<int>(p.kv_seq);
    f.head_dim = static_cast<int>(p.head_dim);
    f.scale = static_cast<float>(p.softmax_scale());
    f.bf16 = p.dtype == DType::BF16;
    f.window = static_cast<int>(p.window);
    switch (p.mask) {
      case MaskKind::Causal:
        f.mask = FusedMask::Causal;
        break;
      case MaskKind::CausalBottomRight:
        f.mask = FusedMask::CausalBottomRight;
        break;
      case MaskKind::SlidingWindow:
        f.mask = FusedMask::SlidingWindow;
        break;
      default:
        f.mask = FusedMask::None;
        break;
    }
    return f;
  }

  std::string_view name_, op_;
  bool flash_;
  Launch launch_;
  Story story_;
};

}  // namespace attnprof::cuda
