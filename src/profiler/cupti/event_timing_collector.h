// GPU time without CUPTI: one "forward (device events)" span per forward call,
// timed with CUDA events on the runtime's stream. Used when CUPTI cannot be
// enabled (another profiler attached, a driver without CUPTI support).
//
// The profiler's range hooks bring it every recorded range; it records an
// event pair around each one named `range` ("forward").
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
  // Waits for the stream and hands over the closed ranges' spans, their
  // events reused after, so a long schedule holds no event per step.
  bool can_flush() const override { return true; }
  void flush(std::vector<Activity>& out) override;
  std::optional<DeviceProperties> device_properties() const override { return device_; }
  std::string note() const override;

  void range_begin(std::string_view name, std::uint64_t external_id) override;
  void range_end(std::uint64_t external_id) override;

 private:
  struct Span {
    void* begin = nullptr;  // cudaEvent_t
    void* end = nullptr;
    std::int64_t cpu_begin_ns = 0;
    std::uint64_t external_id = 0;  // of the range it times
    int step = -1;
  };
  void* take_event();
  // The closed spans as activities into `out`, their events back to the pool.
  void convert_closed(std::vector<Activity>& out);

  void* stream_;
  std::string reason_;
  std::string range_;
  std::int64_t stream_id_ = -1;
  int device_id_ = 0;
  std::optional<DeviceProperties> device_;
  void* anchor_ = nullptr;  // an event completed at anchor_ns_ on the host clock
  std::int64_t anchor_ns_ = 0;
  std::vector<void*> events_;  // every event created, destroyed with the collector
  std::vector<void*> free_;    // of those, the ones no span holds
  std::vector<Span> spans_;
  std::vector<std::size_t> open_;  // indices into spans_ of unclosed ranges
  std::vector<Activity> activities_;
  bool running_ = false;
};

}  // namespace attnprof::cupti
