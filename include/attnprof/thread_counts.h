// The CPU's thread counts as the process holds them: OpenMP's for the calling
// thread (torch, which shares libgomp, reads it as torch.get_num_threads())
// and OpenBLAS's for the process. device_runtime(Device::Cpu, threads) sets
// both for a run; a front end that calls the library on its caller's thread
// (the Python module) reads them before a call and puts them back after, so
// that no call leaves them changed.
#pragma once

namespace attnprof {

struct CpuThreadCounts {
  int openmp = 0;
  int blas = 0;
  bool operator==(const CpuThreadCounts&) const = default;
};

CpuThreadCounts cpu_thread_counts();
void set_cpu_thread_counts(const CpuThreadCounts& counts);

}  // namespace attnprof
