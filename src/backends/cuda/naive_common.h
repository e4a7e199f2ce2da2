// What naive and naive_inplace share: the textbook attention written op by op,
//   attn = (q @ k^T) * scale; attn = <mask it>; attn = softmax(attn); out = attn @ v
// with the GEMMs in the input dtype on tensor cores. The two differ only in how
// they mask (naive.cu: out-of-place masked_fill, naive_inplace.cu: in place),
// which is the whole point of having both.
#pragma once

#include <cmath>
#include <string>
#include <string_view>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/error.h"
#include "backends/cuda/ops.h"

namespace attnprof::cuda {

class NaiveBase : public Backend {
 public:
  Device device() const override { return Device::Cuda; }

  Eligibility eligibility(const Problem& p) const override {
    if (p.device != Device::Cuda) return {false, "runs on a CUDA device only"};
    return {true, std::string("cuBLAS GEMMs in ") + std::string(dtype_name(p.dtype)) +
                      (is_16bit(p.dtype) ? " on tensor cores" : " (SGEMM, TF32 off)") + ", " + mask_story()};
  }

  std::size_t workspace_bytes(const Problem& p) const override {
    const auto scores = static_cast<std::size_t>(p.batch * p.heads * p.seq * p.kv_seq) * element_size(p.dtype);
    const auto mask = static_cast<std::size_t>(p.seq * p.kv_seq);  // the cached bool mask
    return peak_score_buffers() * scores + mask + ops::blas_workspace_bytes();
  }

  Traits traits() const override { return {.nan_on_fully_masked = true, .memory_baseline = name() == "naive"}; }

  Expectation expectation(const Problem& p) const override {
    Expectation e;
    e.cpu_ops = {"matmul", "mul"};
    e.device_activities = 4;  // two GEMMs, the scale, the softmax
    if (p.mask == MaskKind::Bias) {
      e.cpu_ops.emplace_back(bias_op());
      e.device_activities += 1;
    } else if (p.mask != MaskKind::None) {
      // For --mask none there is nothing to fill: no copy and no fill kernel.
      e.cpu_ops.emplace_back(fill_op());
      e.device_activities += fill_activities();
      e.copies = fill_activities() - 1;
    }
    e.cpu_ops.insert(e.cpu_ops.end(), {"softmax", "matmul"});
    return e;
  }

  void forward(const Problem& p, const Inputs& in, Tensor& out, RunContext& ctx) override {
    Tensor attn;
    {
      // The product is a temporary PyTorch frees once the scaled copy exists.
      Tensor scores = ops::matmul_qk(blas_, in.q, in.k, ctx);
      attn = ops::mul(scores, static_cast<float>(p.softmax_scale()), ctx);
    }
    switch (p.mask) {
      case MaskKind::None:
        break;
      case MaskKind::Bias:
        attn = add_bias(std::move(attn), in.bias, ctx);
        break;
      case MaskKind::Boolean:
        attn = fill(std::move(attn), in.mask, ctx);
        break;
      default:
        attn = fill(std::move(attn), structural_mask(p, ctx), ctx);
        break;
    }
    Tensor probs = ops::softmax(attn, ctx);
    attn = Tensor();
    ops::matmul_pv(blas_, probs, in.v, out, ctx);
  }

 protected:
  // masked_fill(~keep, -inf), out of place or in place; returns the masked scores.
  virtual Tensor fill(Tensor attn, const Tensor& keep, RunContext& ctx) = 0;
  virtual Tensor add_bias(Tensor attn, const Tensor& bias, RunContext& ctx) = 0;
  virtual const char* fill_op() const = 0;
  virtual const char* bias_op() const = 0;
  virtual int fill_activities() const = 0;  // kernels + memcpys of the fill
  virtual std::size_t peak_score_buffers() const = 0;
  virtual std::string mask_story() const = 0;  // for eligibility's reason

 private:
  // The structural mask is built once per problem and kept, like the
  // registered buffer of the reference module; building it is not per-call work.
  const Tensor& structural_mask(const Problem& p, RunContext& ctx) {
    const std::string key = std::to_string(p.seq) + "/" + std::to_string(p.kv_seq) + "/" +
                            std::string(mask_name(p.mask)) + "/" + std::to_string(p.window);
    if (!mask_.defined() || key != mask_key_ || mask_allocator_ != &ctx.allocator) {
      mask_ = Tensor();  // free the old one before building the next
      mask_ = ops::structural_mask(p, ctx);
      mask_key_ = key;
      mask_allocator_ = &ctx.allocator;
    }
    return mask_;
  }

  ops::Blas blas_;
  Tensor mask_;
  std::string mask_key_;
  const Allocator* mask_allocator_ = nullptr;
};

}  // namespace attnprof::cuda
