// GPU time without CUPTI: one "forward (device events)" span per forward call,
// timed with CUDA events on the runtime's stream. Used when CUPTI cannot be
// enabled (another profiler attached, a driver without CUPTI support).
//
// No runner changes are needed: RecordFunction calls nvtx_push/nvtx_pop for
// every range, and nvtx.cpp forwards them to on_range_push/on_range_pop below,
// which record events around each range named `range` ("forward") while this
// collector is running and the profiler is recording.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnprof/activity.h"
#include "attnprof/profiler.h"

namespace attnprof::cupti {

class EventTimingCollector : public Collector {
 public:
  // `stream` is the cudaStream_t the backends launch on; `reason` says why
  // CUPTI was not used and goes into note().
  EventTimingCollector(void* stream, std::string reason, std::string range = "forward");
  ~EventTimingCollector() override;

  std::string name() const override { return "device events"; }
  void start() override;  // throws Error(Device)
  void stop() override;   // waits for the stream, turns event pairs into spans
  void drain(std::vector<Activity>& out) override;
  std::optional<DeviceProperties> device_properties() const override { return device_; }
  std::string note() const override;

  // Called through the range hooks; public for them only.
  void range_begin();
  void range_end();
  const std::string& range() const { return range_; }

 private:
  struct Span {
    void* begin = nullptr;  // cudaEvent_t
    void* end = nullptr;
    std::int64_t cpu_begin_ns = 0;
    int step = -1;
  };
  void* take_event();

  void* stream_;
  std::string reason_;
  std::string range_;
  std::int64_t stream_id_ = -1;
  int device_id_ = 0;
  std::optional<DeviceProperties> device_;
  void* anchor_ = nullptr;  // an event completed at anchor_ns_ on the host clock
  std::int64_t anchor_ns_ = 0;
  std::vector<void*> events_;  // every event created, destroyed with the collector
  std::size_t next_event_ = 0;
  std::vector<Span> spans_;
  std::vector<std::size_t> open_;  // indices into spans_ of unclosed ranges
  std::vector<Activity> activities_;
  bool running_ = false;
};

// Range hooks, called by nvtx_push/nvtx_pop on every RecordFunction range.
// Cheap when no EventTimingCollector is running. Defined in nvtx.cpp with the
// listener below; because this collector calls attach/detach, linking it also
// links nvtx.cpp's nvtx_push/nvtx_pop, which the core library (linked after
// attnprof_cuda) needs.
void on_range_push(std::string_view name);
void on_range_pop();
// Makes `c` the collector the range hooks feed; false if another one is.
bool attach_range_listener(EventTimingCollector* c);
void detach_range_listener(EventTimingCollector* c);

}  // namespace attnprof::cupti
