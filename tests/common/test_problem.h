// Helpers the CPU and GPU tests share: the Problem a test's shape describes,
// a visit of every element of a 4-d tensor, and a host tensor filled with NaN.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>

#include "attnprof/dtype.h"
#include "attnprof/error.h"
#include "attnprof/problem.h"
#include "attnprof/tensor.h"

namespace attnprof::testing {

// The extents of a small test problem. kv_heads and kv_seq left 0 follow heads
// and seq (Problem::normalize); window and scale pass through as given.
struct Shape {
  std::int64_t batch = 1, heads = 1, kv_heads = 0, seq = 64, kv_seq = 0, head_dim = 64;
  std::int64_t window = 0;
  std::optional<double> scale;
};

// The normalized Problem of a shape: a Shape, or a test's own struct with the
// same fields and that test's defaults. Not validated: some tests hand the
// backends problems validate() refuses; the others call it themselves.
template <class S = Shape>
Problem to_problem(const S& s, DType dtype, MaskKind mask, Device device = Device::Cpu) {
  Problem p{.batch = s.batch,
            .heads = s.heads,
            .kv_heads = s.kv_heads,
            .seq = s.seq,
            .kv_seq = s.kv_seq,
            .head_dim = s.head_dim,
            .dtype = dtype,
            .device = device,
            .mask = mask,
            .window = s.window,
            .scale = s.scale};
  p.normalize();
  return p;
}

// f(a, b, c, d) for every index of a 4-d tensor, the last dim fastest.
template <class F>
void for_each_index(const Tensor& t, F&& f) {
  for (std::int64_t a = 0; a < t.size(0); ++a)
    for (std::int64_t b = 0; b < t.size(1); ++b)
      for (std::int64_t c = 0; c < t.size(2); ++c)
        for (std::int64_t d = 0; d < t.size(3); ++d) f(a, b, c, d);
}

// A host tensor of these dims and dtype filled with NaN: an output that a
// kernel leaves unwritten fails its check.
inline Tensor nan_tensor(const Dims& dims, DType dtype) {
  Tensor t = Tensor::empty(dims, dtype, cpu_allocator());
  for_each_index(t,
                 [&](auto a, auto b, auto c, auto d) { t.set(a, b, c, d, std::numeric_limits<float>::quiet_NaN()); });
  return t;
}
// p's [batch, heads, seq, head_dim] in p's dtype, NaN.
inline Tensor nan_tensor(const Problem& p, std::int64_t heads, std::int64_t seq) {
  return nan_tensor({p.batch, heads, seq, p.head_dim}, p.dtype);
}

// validate()'s one line for p, or "" when it accepts.
inline std::string refusal(const Problem& p) {
  try {
    p.validate();
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

// What `work` throws: an Error(InvalidArgument) of one line (the test fails
// otherwise, and when nothing is thrown), its text to match.
inline std::string invalid_argument_line(const std::function<void()>& work) {
  try {
    work();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    return what;
  }
  ADD_FAILURE() << "not refused";
  return {};
}

}  // namespace attnprof::testing
