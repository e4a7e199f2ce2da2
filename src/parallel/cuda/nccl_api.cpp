#include "parallel/cuda/nccl_api.h"

#include <dlfcn.h>

#include <mutex>
#include <optional>
#include <string>

#include "attnprof/error.h"

namespace attnprof::parallel {
namespace {

void* open_nccl(std::string& tried) {
  // The soname first: a process that already holds an NCCL (PyTorch's) gets
  // that one; then the library CMake found at build time.
  for (const char* name : {"libnccl.so.2", ATTNPROF_NCCL_PATH}) {
    if (void* h = dlopen(name, RTLD_NOW | RTLD_GLOBAL)) return h;
    const char* why = dlerror();
    tried += std::string(tried.empty() ? "" : "; ") + (why ? why : name);
  }
  return nullptr;
}

template <class Fn>
void bind(void* lib, const char* symbol, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(lib, symbol));
  if (!fn) {
    fail(ErrorKind::Unsupported,
         std::string("the NCCL found has no ") + symbol + ": gpus needs NCCL 2.19 or newer (PyTorch's wheel has one)",
         {"gpus"});
  }
}

NcclApi load() {
  std::string tried;
  void* lib = open_nccl(tried);
  if (!lib) {
    fail(ErrorKind::Unsupported, "ring attention needs NCCL, which could not be loaded (" + tried +
                                     "): put the directory of libnccl.so.2 (PyTorch's nvidia/nccl/lib) on "
                                     "LD_LIBRARY_PATH");
  }
  NcclApi api{};
  bind(lib, "ncclCommInitAll", api.comm_init_all);
  bind(lib, "ncclCommDestroy", api.comm_destroy);
  bind(lib, "ncclGroupStart", api.group_start);
  bind(lib, "ncclGroupEnd", api.group_end);
  bind(lib, "ncclSend", api.send);
  bind(lib, "ncclRecv", api.recv);
  bind(lib, "ncclGetErrorString", api.error_string);
  bind(lib, "ncclGetLastError", api.last_error);
  return api;
}

}  // namespace

const NcclApi& nccl() {
  // A failed load is retried on the next call (after the user fixes the path).
  static std::mutex mutex;
  static std::optional<NcclApi> api;
  std::lock_guard lock(mutex);
  if (!api) api = load();
  return *api;
}

}  // namespace attnprof::parallel
