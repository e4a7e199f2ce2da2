// Merging two partial attention results by their log-sum-exp: attention over
// keys A and B together is (O_a, lse_a) and (O_b, lse_b), each over its keys,
// weighed by the share of the softmax mass each holds:
//   lse = log(exp(lse_a) + exp(lse_b))
//   O   = O_a * exp(lse_a - lse) + O_b * exp(lse_b - lse)
// A non-finite lse (the fused forward writes +inf for a fully masked row; an
// empty running result starts at -inf) contributes nothing. The scalar rule
// is shared by the CPU merge and the CUDA kernel (ring_attention.cu).
#pragma once

#include <cmath>
#include <cstdint>
#include <span>

#if defined(__CUDACC__)
#define ATTNPROF_HOST_DEVICE __host__ __device__
#else
#define ATTNPROF_HOST_DEVICE
#endif

namespace attnprof::parallel {

#if !defined(__CUDACC__)
using std::exp;
using std::isfinite;
using std::log;
#endif

template <class T>
struct MergeWeights {
  T wa, wb, lse;
};

// The weights of O_a and O_b and the merged lse. Both empty: weights 0 and an
// lse of +inf (the fused forward's fully masked row).
template <class T>
ATTNPROF_HOST_DEVICE inline MergeWeights<T> merge_weights(T lse_a, T lse_b) {
  const bool a = isfinite(lse_a), b = isfinite(lse_b);
  if (!a && !b) return {T(0), T(0), T(INFINITY)};
  if (!a) return {T(0), T(1), lse_b};
  if (!b) return {T(1), T(0), lse_a};
  const T m = lse_a > lse_b ? lse_a : lse_b;
  const T ea = exp(lse_a - m), eb = exp(lse_b - m);
  const T s = ea + eb;
  return {ea / s, eb / s, m + log(s)};
}

// CPU, float64: merges (o_b, lse_b) into the running (o_a, lse_a), row by row
// (`rows` rows of `dim` values each).
void merge_into(std::span<double> o_a, std::span<double> lse_a, std::span<const double> o_b,
                std::span<const double> lse_b, std::int64_t dim);

}  // namespace attnprof::parallel
