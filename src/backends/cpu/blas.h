// The BLAS the CPU backends use (OpenBLAS from the distribution). Declared
// here rather than through <cblas.h>, whose location differs between
// distributions (and which some images ship the library without).
#pragma once

namespace attnprof::cpu {

// Row-major C = alpha * A * op(B) + beta * C, op(B) = B^T when trans_b.
void sgemm(bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb, float beta,
           float* c, int ldc);
// Row-major C = alpha * A^T * B + beta * C: A is [k, m], B is [k, n] (the
// backward's dV = P^T dO and dK = dS^T Q).
void sgemm_tn(int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb, float beta, float* c,
              int ldc);
void blas_set_threads(int threads);
const char* blas_config();

}  // namespace attnprof::cpu
