#include "backends/cpu/blas.h"

#include <dlfcn.h>

extern "C" {
// The CBLAS interface (netlib's cblas.h); enum values are fixed by the standard.
void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                 const float* b, int ldb, float beta, float* c, int ldc);
void openblas_set_num_threads(int threads);
int openblas_get_num_threads(void);
char* openblas_get_config(void);
}

namespace attnprof::cpu {
namespace {
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
}

void sgemm(bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb, float beta,
           float* c, int ldc) {
  cblas_sgemm(kRowMajor, kNoTrans, trans_b ? kTrans : kNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void sgemm_tn(int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb, float beta, float* c,
              int ldc) {
  cblas_sgemm(kRowMajor, kTrans, kNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

namespace {
using SbgemmFn = void (*)(int order, int trans_a, int trans_b, int m, int n, int k, float alpha, const std::uint16_t* a,
                          int lda, const std::uint16_t* b, int ldb, float beta, float* c, int ldc);
SbgemmFn sbgemm_fn() {
  static const auto fn = reinterpret_cast<SbgemmFn>(::dlsym(RTLD_DEFAULT, "cblas_sbgemm"));
  return fn;
}
}  // namespace

bool has_sbgemm() { return sbgemm_fn() != nullptr; }

void sbgemm(int m, int n, int k, const std::uint16_t* a, const std::uint16_t* b, float* c) {
  sbgemm_fn()(kRowMajor, kNoTrans, kNoTrans, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
}

void blas_set_threads(int threads) { openblas_set_num_threads(threads); }

int blas_threads() { return openblas_get_num_threads(); }

const char* blas_config() { return openblas_get_config(); }

}  // namespace attnprof::cpu
