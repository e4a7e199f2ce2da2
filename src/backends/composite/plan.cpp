#include "backends/composite/plan.h"

#include <algorithm>
#include <cstdint>

#include "attnprof/error.h"

namespace attnprof::composite {

// Hands out one dummy address for every tensor, which the plan never reads or
// writes, so a plan of a problem too large for the machine costs nothing; it
// only counts bytes.
class PlanOps::ShapeAllocator final : public attnprof::Allocator {
 public:
  explicit ShapeAllocator(Device d) : device_(d) {}
  Device device() const override { return device_; }
  void* allocate(std::size_t bytes) override {
    stats_.allocated += static_cast<std::int64_t>(bytes);
    stats_.reserved = stats_.allocated;
    stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
    stats_.peak_reserved = stats_.peak_allocated;
    return dummy_;
  }
  void deallocate(void*, std::size_t bytes) noexcept override {
    stats_.allocated -= static_cast<std::int64_t>(bytes);
    stats_.reserved = stats_.allocated;
  }
  MemoryStats stats() const override { return stats_; }
  void reset_peak() override { stats_.peak_allocated = stats_.peak_reserved = stats_.allocated; }

 private:
  Device device_;
  MemoryStats stats_;
  alignas(64) unsigned char dummy_[64] = {};
};

namespace {

Tensor like(const Tensor& x, DType dtype, attnprof::Allocator& a) { return Tensor::empty(x.sizes(), dtype, a); }

}  // namespace

PlanOps::PlanOps(Device device) : device_(device), allocator_(std::make_unique<ShapeAllocator>(device)) { clear(); }

PlanOps::~PlanOps() = default;

PlanOps::Args PlanOps::args(const Problem& p) {
  attnprof::Allocator& a = *allocator_;
  Args r;
  r.in.q = Tensor::empty(p.q_dims(), p.dtype, a);  // packed [1, H, total_q, D] for a packed batch
  r.in.k = Tensor::empty(p.kv_dims(), p.dtype, a);
  r.in.v = Tensor::empty(p.kv_dims(), p.dtype, a);
  const Dims full{p.batch, p.heads, p.seq, p.kv_seq};
  if (p.mask == MaskKind::Boolean) r.in.mask = Tensor::empty({1, 1, p.seq, p.kv_seq}, DType::Bool, a).expand(full);
  const DType out = output_dtype(p.dtype);  // O, dO, the gradients and a bias: bf16 for fp8 inputs
  if (p.mask == MaskKind::Bias) r.in.bias = Tensor::empty({1, 1, p.seq, p.kv_seq}, out, a).expand(full);
  if (p.kv_cache == KvCache::Paged) {
    const Dims pages{p.batch * p.pages_per_seq(), p.kv_heads, p.page_size, p.head_dim};
    r.in.k_pages = Tensor::empty(pages, p.dtype, a);
    r.in.v_pages = Tensor::empty(pages, p.dtype, a);
    r.in.block_table = Tensor::empty({1, 1, p.batch, p.pages_per_seq()}, DType::I32, a);
  }
  r.out = Tensor::empty(p.q_dims(), out, a);
  if (p.pass != Pass::Forward) {
    r.dout = Tensor::empty(r.out.sizes(), out, a);
    r.grads = {Tensor::empty(r.in.q.sizes(), out, a), Tensor::empty(r.in.k.sizes(), out, a),
               Tensor::empty(r.in.v.sizes(), out, a)};
  }
  return r;
}

RunContext PlanOps::context() { return RunContext{*allocator_, nullptr, 1}; }

void PlanOps::clear() {
  recorded_ = Expectation{};
  recorded_.device_activities = device_ == Device::Cpu ? -1 : 0;
  allocator_->reset_peak();
}

std::size_t PlanOps::peak_bytes() const {
  const MemoryStats s = allocator_->stats();
  return static_cast<std::size_t>(s.peak_allocated - s.allocated);
}

std::size_t PlanOps::live_bytes() const { return static_cast<std::size_t>(allocator_->stats().allocated); }

void PlanOps::record(const OpSpec& spec) {
  recorded_.cpu_ops.emplace_back(spec.name);
  const OpCost c = spec.on(device_);
  if (device_ != Device::Cpu) recorded_.device_activities += c.activities;
  recorded_.copies += c.copies;
}

std::string PlanOps::describe_gemm(DType operands) const {
  return std::string("GEMMs in ") + std::string(dtype_name(operands));
}

Tensor PlanOps::matmul_qk(const Tensor& q, const Tensor& k, RunContext& ctx) {
  record(op::matmul);
  return Tensor::empty({q.size(0), q.size(1), q.size(2), k.size(2)}, q.dtype(), ctx.allocator);
}

void PlanOps::matmul_pv(const Tensor& p, const Tensor& v, Tensor& out, RunContext&) {
  record(op::matmul);
  if (out.sizes() != Dims{p.size(0), p.size(1), p.size(2), v.size(3)}) {
    fail(ErrorKind::Internal, "matmul: output " + out.describe() + " does not match " + p.describe());
  }
}

Tensor PlanOps::matmul_pv(const Tensor& p, const Tensor& v, RunContext& ctx) {
  Tensor out = Tensor::empty({p.size(0), p.size(1), p.size(2), v.size(3)}, p.dtype(), ctx.allocator);
  matmul_pv(p, v, out, ctx);
  return out;
}

void PlanOps::matmul_tn(const Tensor& a, const Tensor& b, Tensor& out, RunContext&) {
  record(op::matmul);
  if (out.sizes() != Dims{a.size(0), out.size(1), a.size(3), b.size(3)} || a.size(1) % out.size(1) != 0) {
    fail(ErrorKind::Internal,
         "matmul: output " + out.describe() + " does not match " + a.describe() + "^T @ " + b.describe());
  }
}

Tensor PlanOps::mul(const Tensor& x, float, RunContext& ctx) {
  record(op::mul);
  return like(x, x.dtype(), ctx.allocator);
}

Tensor PlanOps::masked_fill(const Tensor& x, const Tensor&, float, RunContext& ctx) {
  record(op::masked_fill);
  return like(x, x.dtype(), ctx.allocator);
}

void PlanOps::masked_fill_(Tensor&, const Tensor&, float, RunContext&) { record(op::masked_fill_); }

Tensor PlanOps::add(const Tensor& a, const Tensor&, RunContext& ctx) {
  record(op::add);
  return like(a, a.dtype(), ctx.allocator);
}

void PlanOps::add_(Tensor&, const Tensor&, RunContext&) { record(op::add_); }

Tensor PlanOps::softmax(const Tensor& x, RunContext& ctx) {
  record(op::softmax);
  return like(x, x.dtype(), ctx.allocator);
}

Tensor PlanOps::safe_softmax(const Tensor& x, RunContext& ctx) {
  record(op::safe_softmax);
  // The GPU's decomposition holds the softmax while it builds eq(-inf) and
  // then the result: the larger of the two devices' footprints.
  const Tensor probs = like(x, x.dtype(), ctx.allocator);
  like(x, DType::Bool, ctx.allocator);
  return like(x, x.dtype(), ctx.allocator);
}

Tensor PlanOps::softmax_backward(const Tensor& grad, const Tensor&, RunContext& ctx) {
  record(op::softmax_backward);
  return like(grad, grad.dtype(), ctx.allocator);
}

Tensor PlanOps::tanh(const Tensor& x, RunContext& ctx) {
  record(op::tanh);
  return like(x, x.dtype(), ctx.allocator);
}

Tensor PlanOps::tanh_backward(const Tensor& grad, const Tensor&, RunContext& ctx) {
  record(op::tanh_backward);
  return like(grad, grad.dtype(), ctx.allocator);
}

Tensor PlanOps::dequantize(const Tensor& x, float, RunContext& ctx) {
  record(op::dequantize);
  return like(x, DType::F32, ctx.allocator);
}

Tensor PlanOps::to(const Tensor& x, DType dtype, RunContext& ctx) {
  record(op::to);
  return like(x, dtype, ctx.allocator);
}

void PlanOps::to_into(const Tensor&, Tensor&, RunContext&) { record(op::to); }

Tensor PlanOps::ones(const Dims& sizes, RunContext& ctx) {
  record(op::ones);
  return Tensor::empty(sizes, DType::Bool, ctx.allocator);
}

Tensor PlanOps::tril(const Tensor& x, std::int64_t, RunContext& ctx) {
  record(op::tril);
  return like(x, DType::Bool, ctx.allocator);
}

Tensor PlanOps::triu(const Tensor& x, std::int64_t, RunContext& ctx) {
  record(op::triu);
  return like(x, DType::Bool, ctx.allocator);
}

Tensor PlanOps::where(const Tensor& cond, float, float, RunContext& ctx) {
  record(op::where);
  Dims sizes = cond.sizes();
  for (int d = 0; d < 4; ++d) {
    if (cond.stride(d) == 0) sizes[static_cast<std::size_t>(d)] = 1;
  }
  return Tensor::empty(sizes, DType::F32, ctx.allocator);
}

Tensor PlanOps::structural_mask(const Problem& p, RunContext& ctx) {
  record(op::structural_mask);
  return Tensor::empty({1, 1, p.seq, p.kv_seq}, DType::Bool, ctx.allocator);
}

Tensor PlanOps::gather_pages(const Tensor& pages, const Tensor& block_table, std::int64_t kv_seq, RunContext& ctx) {
  record(op::gather_pages);
  return Tensor::empty({block_table.size(2), pages.size(1), kv_seq, pages.size(3)}, pages.dtype(), ctx.allocator);
}

}  // namespace attnprof::composite
