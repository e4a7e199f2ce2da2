#include "attnprof/thread_counts.h"

#include <omp.h>

#include "backends/cpu/blas.h"

namespace attnprof {

CpuThreadCounts cpu_thread_counts() { return {.openmp = omp_get_max_threads(), .blas = cpu::blas_threads()}; }

void set_cpu_thread_counts(const CpuThreadCounts& counts) {
  // Each only where it differs: OpenBLAS's setter takes its lock and may
  // start threads.
  if (omp_get_max_threads() != counts.openmp) omp_set_num_threads(counts.openmp);
  if (cpu::blas_threads() != counts.blas) cpu::blas_set_threads(counts.blas);
}

}  // namespace attnprof
