// What the GPU tests of the CUDA backends share: a fresh backend by name
// (naive, naive_inplace, math over the CUDA ops; cudnn); one forward on host
// inputs uploaded (a paged cache's pages and table with them), the output
// poisoned before the call and brought back to the host; and one forward or
// training step the same way (run_once).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "attnprof/backend.h"
#include "backends/composite/composite.h"
#include "backends/cuda/cuda_backends.h"

namespace attnprof::testing {

inline std::unique_ptr<Backend> make_cuda_backend(const std::string& name) {
  if (name == "naive") return composite::make_naive(cuda::make_ops());
  if (name == "naive_inplace") return composite::make_naive_inplace(cuda::make_ops());
  if (name == "math") return composite::make_math(cuda::make_ops());
  return cuda::make_cudnn();
}

inline Tensor run_forward_once(Backend& b, const Problem& p, const Inputs& host) {
  DeviceRuntime& rt = cuda::runtime();
  const Inputs in = rt.upload(host);
  if (p.kv_cache == KvCache::Paged) {
    EXPECT_TRUE(in.k_pages.defined() && in.v_pages.defined() && in.block_table.defined()) << "pages not uploaded";
  }
  Tensor out = Tensor::empty({p.batch, p.heads, p.seq, p.head_dim}, output_dtype(p.dtype), rt.allocator());
  rt.poison(out);
  RunContext ctx{rt.allocator(), rt.stream(), 0};
  b.forward(p, in, out, ctx);
  rt.synchronize();
  return rt.download(out);
}

// What run_once brings back: O, and after a training step dQ, dK and dV.
struct CudaRun {
  Tensor out;
  Gradients grads;
};

// forward_train then backward (p.pass Train or Backward), or forward only, on
// device copies of `host` with NaN-poisoned outputs and gradients; results on
// the host.
inline CudaRun run_once(Backend& b, const Problem& p, const Inputs& host, const Tensor& host_dout) {
  DeviceRuntime& rt = cuda::runtime();
  const Inputs in = rt.upload(host);
  Allocator& alloc = rt.allocator();
  RunContext ctx{alloc, rt.stream(), 0};
  Tensor out = Tensor::empty(p.q_dims(), output_dtype(p.dtype), alloc);
  rt.poison(out);
  if (p.pass == Pass::Forward) {
    b.forward(p, in, out, ctx);
    rt.synchronize();
    return {rt.download(out), {}};
  }
  Saved saved;
  b.forward_train(p, in, out, saved, ctx);
  Gradients g{Tensor::empty(p.q_dims(), p.dtype, alloc), Tensor::empty(p.kv_dims(), p.dtype, alloc),
              Tensor::empty(p.kv_dims(), p.dtype, alloc)};
  rt.poison(g.dq);
  rt.poison(g.dk);
  rt.poison(g.dv);
  const Tensor dout = rt.upload(host_dout);
  b.backward(p, in, out, dout, saved, g, ctx);
  rt.synchronize();
  return {rt.download(out), {rt.download(g.dq), rt.download(g.dk), rt.download(g.dv)}};
}

}  // namespace attnprof::testing
