// The CUDA implementation of the composite backends' ops (backends/ops.h): the
// kernels and cuBLAS calls of ops.cu, ops_gemm.cu and ops_softmax.cu behind the
// one op interface, with the cuBLAS handle the backend object owns.
#include <cstddef>
#include <memory>
#include <string>

#include "backends/cuda/cuda_backends.h"
#include "backends/cuda/ops/ops.h"

namespace attnprof::cuda {
namespace {

class CudaOps final : public Ops {
 public:
  Device device() const override { return Device::Cuda; }

  std::string describe_gemm(DType operands) const override {
    if (!is_16bit(operands)) return "cuBLAS SGEMM on CUDA cores (TF32 off)";
    return "cuBLAS GEMMs in " + std::string(dtype_name(operands)) + " on tensor cores";
  }

  std::size_t library_workspace_bytes() const override { return ops::blas_workspace_bytes(); }

  Tensor matmul_qk(const Tensor& q, const Tensor& k, RunContext& ctx) override {
    return ops::matmul_qk(blas_, q, k, ctx);
  }
  void matmul_pv(const Tensor& p, const Tensor& v, Tensor& out, RunContext& ctx) override {
    ops::matmul_pv(blas_, p, v, out, ctx);
  }
  Tensor matmul_pv(const Tensor& p, const Tensor& v, RunContext& ctx) override {
    return ops::matmul_pv(blas_, p, v, ctx);
  }
  void matmul_tn(const Tensor& a, const Tensor& b, Tensor& out, RunContext& ctx) override {
    ops::matmul_tn(blas_, a, b, out, ctx);
  }
  Tensor mul(const Tensor& x, float s, RunContext& ctx) override { return ops::mul(x, s, ctx); }
  Tensor masked_fill(const Tensor& x, const Tensor& keep, float value, RunContext& ctx) override {
    return ops::masked_fill(x, keep, value, ctx);
  }
  void masked_fill_(Tensor& x, const Tensor& keep, float value, RunContext& ctx) override {
    ops::masked_fill_(x, keep, value, ctx);
  }
  Tensor add(const Tensor& a, const Tensor& b, RunContext& ctx) override { return ops::add(a, b, ctx); }
  void add_(Tensor& a, const Tensor& b, RunContext& ctx) override { ops::add_(a, b, ctx); }
  Tensor softmax(const Tensor& x, RunContext& ctx) override { return ops::softmax(x, ctx); }
  Tensor safe_softmax(const Tensor& x, RunContext& ctx) override { return ops::safe_softmax(x, ctx); }
  Tensor softmax_backward(const Tensor& grad, const Tensor& probs, RunContext& ctx) override {
    return ops::softmax_backward(grad, probs, ctx);
  }
  Tensor dequantize(const Tensor& x, float descale, RunContext& ctx) override {
    return ops::dequantize(x, descale, ctx);
  }
  Tensor to(const Tensor& x, DType dtype, RunContext& ctx) override { return ops::to(x, dtype, ctx); }
  void to_into(const Tensor& src, Tensor& dst, RunContext& ctx) override { ops::to_into(src, dst, ctx); }
  Tensor ones(const Dims& sizes, RunContext& ctx) override { return ops::ones(sizes, ctx); }
  Tensor tril(const Tensor& x, std::int64_t diagonal, RunContext& ctx) override { return ops::tril(x, diagonal, ctx); }
  Tensor triu(const Tensor& x, std::int64_t diagonal, RunContext& ctx) override { return ops::triu(x, diagonal, ctx); }
  Tensor where(const Tensor& cond, float if_true, float if_false, RunContext& ctx) override {
    return ops::where(cond, if_true, if_false, ctx);
  }
  Tensor structural_mask(const Problem& p, RunContext& ctx) override { return ops::structural_mask(p, ctx); }
  Tensor tanh(const Tensor& x, RunContext& ctx) override { return ops::tanh(x, ctx); }
  Tensor tanh_backward(const Tensor& grad, const Tensor& t, RunContext& ctx) override {
    return ops::tanh_backward(grad, t, ctx);
  }
  Tensor gather_pages(const Tensor& pages, const Tensor& block_table, std::int64_t kv_seq, RunContext& ctx) override {
    return ops::gather_pages(pages, block_table, kv_seq, ctx);
  }

 private:
  // One handle per backend object: handles are not safe to share between
  // threads binding other streams. Created on first use, so constructing the
  // ops needs no GPU.
  ops::Blas blas_;
};

}  // namespace

std::unique_ptr<Ops> make_ops() { return std::make_unique<CudaOps>(); }

}  // namespace attnprof::cuda
