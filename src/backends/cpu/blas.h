// The BLAS the CPU backends use (OpenBLAS from the distribution). Declared
// here rather than through <cblas.h>, whose location differs between
// distributions (and which some images ship the library without).
#pragma once

#include <cstdint>

namespace attnprof::cpu {

// Row-major C = alpha * A * op(B) + beta * C, op(B) = B^T when trans_b.
void sgemm(bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb, float beta,
           float* c, int ldc);
// Row-major C = alpha * A^T * B + beta * C: A is [k, m], B is [k, n] (the
// backward's dV = P^T dO and dK = dS^T Q).
void sgemm_tn(int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb, float beta, float* c,
              int ldc);
// OpenBLAS's bf16 GEMM, cblas_sbgemm, where the library exports it (0.3.10+
// builds with BUILD_BFLOAT16; Debian 12's 0.3.21 does not): looked up at run
// time, so one binary runs against either. Row-major C = A B, bf16 A [m, k]
// and B [k, n], FP32 C; only when has_sbgemm().
bool has_sbgemm();
void sbgemm(int m, int n, int k, const std::uint16_t* a, const std::uint16_t* b, float* c);
void blas_set_threads(int threads);
int blas_threads();  // the count OpenBLAS runs with now
const char* blas_config();

}  // namespace attnprof::cpu
