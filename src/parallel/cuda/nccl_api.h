// NCCL, loaded the first time a ring runs (dlopen of libnccl.so.2) instead of
// linked. Linking it put the CUDA toolkit's NCCL into every process that loads
// attnprof, the Python module included; a `import torch` after `import
// attnprof` then bound PyTorch to that older NCCL and failed (undefined symbol
// ncclCommResume). Loaded by its soname, NCCL is whichever the process already
// has (PyTorch's), else the library search path's, else the one CMake found.
#pragma once

#include <nccl.h>

namespace attnprof::parallel {

struct NcclApi {
  decltype(&ncclCommInitAll) comm_init_all;
  decltype(&ncclCommDestroy) comm_destroy;
  decltype(&ncclGroupStart) group_start;
  decltype(&ncclGroupEnd) group_end;
  decltype(&ncclSend) send;
  decltype(&ncclRecv) recv;
  decltype(&ncclGetErrorString) error_string;
  decltype(&ncclGetLastError) last_error;
};

// The loaded API; throws Error(Unsupported) naming the library and dlerror()
// when NCCL cannot be loaded or lacks one of the functions.
const NcclApi& nccl();

}  // namespace attnprof::parallel
