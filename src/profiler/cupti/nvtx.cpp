// NVTX ranges for every RecordFunction, so Nsight Systems shows the same op
// names as our CPU lane, and the range hooks the device-event collector times
// "forward" with. The CPU-only build defines nvtx_push/nvtx_pop as no-ops in
// src/profiler/profiler.cpp.
#include <nvtx3/nvToolsExt.h>

#include <atomic>
#include <string>
#include <string_view>
#include <vector>

#include "attnprof/profiler.h"
#include "profiler/cupti/cupti_collector.h"
#include "profiler/cupti/event_timing_collector.h"

namespace attnprof {
namespace cupti {
namespace {

std::atomic<EventTimingCollector*> g_listener{nullptr};

// One entry per open range on this thread: whether it was a timed one, so
// pops pair with the right pushes even when collection starts mid-range.
thread_local std::vector<bool> t_timed;

}  // namespace

bool attach_range_listener(EventTimingCollector* c) {
  EventTimingCollector* expected = nullptr;
  return g_listener.compare_exchange_strong(expected, c);
}

void detach_range_listener(EventTimingCollector* c) {
  EventTimingCollector* expected = c;
  g_listener.compare_exchange_strong(expected, nullptr);
}

void on_range_push(std::string_view name) {
  EventTimingCollector* c = g_listener.load(std::memory_order_acquire);
  Profiler* p = c ? Profiler::current() : nullptr;
  // Unrecorded steps are dropped by the profiler anyway; skip their events.
  const bool timed = p && p->recording() && name == c->range();
  if (timed) c->range_begin();
  t_timed.push_back(timed);
}

void on_range_pop() {
  if (t_timed.empty()) return;
  const bool timed = t_timed.back();
  t_timed.pop_back();
  if (!timed) return;
  if (EventTimingCollector* c = g_listener.load(std::memory_order_acquire)) c->range_end();
}

}  // namespace cupti

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
