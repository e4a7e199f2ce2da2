// NVTX ranges for every RecordFunction, so Nsight Systems shows the same op
// names as our CPU lane. The CPU-only build defines these as no-ops in
// src/profiler/profiler.cpp.
#include <nvtx3/nvToolsExt.h>

#include <string>
#include <string_view>

#include "attnprof/profiler.h"
#include "profiler/cupti/cupti_collector.h"
#include "profiler/cupti/event_timing_collector.h"

namespace attnprof {

void nvtx_push(std::string_view name) {
  // Every thread that opens ranges makes CUDA calls; let the collector map
  // its CUPTI thread id to the OS id the CPU side records.
  cupti::register_current_thread();
  thread_local std::string text;  // NVTX wants a terminated string; reuse the buffer
  text.assign(name);
  nvtxRangePushA(text.c_str());
  cupti::on_range_push(name);
}

void nvtx_pop() {
  cupti::on_range_pop();
  nvtxRangePop();
}

}  // namespace attnprof
