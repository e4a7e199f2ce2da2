// NVTX ranges for every RecordFunction, so Nsight Systems and Nsight Compute
// show the same op names as our CPU lane. The profiler core knows nothing of
// NVTX: this registers itself as a process-wide range callback.
#include <nvtx3/nvToolsExt.h>

#include <mutex>
#include <string>
#include <string_view>

#include "attnprof/profiler.h"
#include "profiler/cupti/cupti_collector.h"

namespace attnprof::cupti {
namespace {

void enter(std::string_view name) {
  thread_local std::string text;  // NVTX wants a terminated string; reuse the buffer
  text.assign(name);
  nvtxRangePushA(text.c_str());
}

void exit() { nvtxRangePop(); }

}  // namespace

void install_nvtx_ranges() {
  static std::once_flag once;
  std::call_once(once, [] { add_range_callbacks({.enter = enter, .exit = exit}); });
}

}  // namespace attnprof::cupti
