#include "profiler/cupti/event_timing_collector.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "attnprof/error.h"
#include "core/cuda_check.h"
#include "profiler/cupti/cupti_collector.h"

namespace attnprof::cupti {
namespace {

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t as_event(void* e) { return static_cast<cudaEvent_t>(e); }

}  // namespace

EventTimingCollector::EventTimingCollector(void* stream, std::string reason, std::string range)
    : stream_(stream), reason_(std::move(reason)), range_(std::move(range)) {}

EventTimingCollector::~EventTimingCollector() {
  for (void* e : events_) cudaEventDestroy(as_event(e));  // errors at exit are harmless here
  if (anchor_) cudaEventDestroy(as_event(anchor_));
}

std::string EventTimingCollector::note() const {
  return "CUPTI unavailable (" + reason_ + "): GPU time from device events";
}

void* EventTimingCollector::take_event() {
  if (free_.empty()) {
    cudaEvent_t e = nullptr;
    ATTNPROF_CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
    return e;
  }
  void* e = free_.back();
  free_.pop_back();
  return e;
}

void EventTimingCollector::start() {
  if (running_) return;
  ATTNPROF_CUDA_CHECK(cudaGetDevice(&device_id_));
  device_ = query_device_properties(device_id_);
  unsigned long long id = 0;
  if (cudaStreamGetId(as_stream(stream_), &id) == cudaSuccess) stream_id_ = static_cast<std::int64_t>(id);
  if (!anchor_) {
    cudaEvent_t e = nullptr;
    ATTNPROF_CUDA_CHECK(cudaEventCreate(&e));
    anchor_ = e;
  }
  // Events only give GPU-side differences; an anchor recorded on an idle
  // stream completes within microseconds of being recorded, which ties the
  // event clock to the host clock closely enough for a trace.
  ATTNPROF_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream_)));
  const std::int64_t before = now_ns();
  ATTNPROF_CUDA_CHECK(cudaEventRecord(as_event(anchor_), as_stream(stream_)));
  ATTNPROF_CUDA_CHECK(cudaEventSynchronize(as_event(anchor_)));
  anchor_ns_ = before + (now_ns() - before) / 2;

  free_ = events_;
  spans_.clear();
  open_.clear();
  running_ = true;
}

void EventTimingCollector::range_begin(std::string_view name, std::uint64_t external_id) {
  if (!running_ || name != range_) return;
  Span s;
  s.external_id = external_id;
  s.begin = take_event();
  s.cpu_begin_ns = now_ns();
  if (Profiler* p = Profiler::current()) s.step = p->current_step();
  // A failed record leaves the span without events; stop() skips it.
  if (cudaEventRecord(as_event(s.begin), as_stream(stream_)) != cudaSuccess) s.begin = nullptr;
  open_.push_back(spans_.size());
  spans_.push_back(s);
}

void EventTimingCollector::range_end(std::uint64_t external_id) {
  if (open_.empty() || spans_[open_.back()].external_id != external_id) return;
  Span& s = spans_[open_.back()];
  open_.pop_back();
  s.end = take_event();
  if (cudaEventRecord(as_event(s.end), as_stream(stream_)) != cudaSuccess) s.end = nullptr;
}

void EventTimingCollector::convert_closed(std::vector<Activity>& out) {
  std::vector<bool> open(spans_.size(), false);
  for (const std::size_t i : open_) open[i] = true;
  const std::string name = range_ + " (device events)";
  std::vector<Span> still_open;
  std::vector<std::size_t> reopened;
  for (std::size_t i = 0; i < spans_.size(); ++i) {
    const Span& s = spans_[i];
    if (open[i]) {
      reopened.push_back(still_open.size());
      still_open.push_back(s);
      continue;
    }
    for (void* e : {s.begin, s.end}) {
      if (e) free_.push_back(e);
    }
    if (!s.begin || !s.end) continue;
    float from_anchor_ms = 0, dur_ms = 0;
    if (cudaEventElapsedTime(&from_anchor_ms, as_event(anchor_), as_event(s.begin)) != cudaSuccess) continue;
    if (cudaEventElapsedTime(&dur_ms, as_event(s.begin), as_event(s.end)) != cudaSuccess) continue;
    Activity a;
    a.type = ActivityType::GpuUserAnnotation;
    a.name = name;
    // The GPU cannot start the work before the host asked for it.
    a.start_ns =
        std::max(anchor_ns_ + static_cast<std::int64_t>(static_cast<double>(from_anchor_ms) * 1e6), s.cpu_begin_ns);
    a.dur_ns = static_cast<std::int64_t>(static_cast<double>(dur_ms) * 1e6);
    a.device = device_id_;
    a.stream = stream_id_;
    a.pid = device_id_;
    a.tid = stream_id_;
    a.step = s.step;
    out.push_back(std::move(a));
  }
  spans_ = std::move(still_open);
  open_ = std::move(reopened);
}

void EventTimingCollector::flush(std::vector<Activity>& out) {
  if (!running_) return;
  ATTNPROF_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream_)));
  convert_closed(out);
}

void EventTimingCollector::stop() {
  if (!running_) return;
  running_ = false;
  ATTNPROF_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream_)));
  convert_closed(activities_);
  for (const Span& s : spans_) {
    for (void* e : {s.begin, s.end}) {
      if (e) free_.push_back(e);
    }
  }
  spans_.clear();
  open_.clear();
}

void EventTimingCollector::drain(std::vector<Activity>& out) {
  out.insert(out.end(), std::make_move_iterator(activities_.begin()), std::make_move_iterator(activities_.end()));
  activities_.clear();
}

}  // namespace attnprof::cupti
