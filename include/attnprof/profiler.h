// The profiler: nested CPU ranges, allocation events, a wait/warmup/active/repeat
// schedule with step markers, and pluggable device collectors (CUPTI).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "attnprof/activity.h"
#include "attnprof/tensor.h"

namespace attnprof {

// torch.profiler.schedule: skip `wait` steps, run `warmup` steps unrecorded,
// record `active` steps; repeat the cycle `repeat` times (0 = forever).
struct Schedule {
  int wait = 0;
  int warmup = 1;
  int active = 3;
  int repeat = 1;

  enum class Action { None, Warmup, Record, RecordAndSave };
  Action at(int step) const;
  int total_steps() const;  // steps until the schedule ends (repeat > 0)
};

// A source of device activities, started and stopped with the profiler.
class Collector {
 public:
  virtual ~Collector() = default;
  virtual std::string name() const = 0;
  // Called when recording begins/ends. May throw Error(Device); the profiler
  // then keeps going without it and notes why.
  virtual void start() = 0;
  virtual void stop() = 0;
  // Moves the activities gathered since start() into `out`.
  virtual void drain(std::vector<Activity>& out) = 0;
  // While running: moves the activities of the work done so far into `out`
  // (it may wait for the device to finish it), so that a long schedule's
  // steps can be folded as they age and memory stays flat
  // (Profiler::fold_steps_beyond). A collector that cannot returns false,
  // and the profiler then keeps every step until stop().
  virtual bool can_flush() const { return false; }
  virtual void flush(std::vector<Activity>& out) {}
  // Called with the trace once the collectors' activities are in it (the
  // whole trace at stop(), or one step as it is folded, oldest first): a
  // collector that knows more than its records rewrites them here (CUPTI:
  // CUDA graph replays shown as the calls they captured, graph_replays.h).
  virtual void rewrite(Trace& trace) {}
  virtual std::optional<DeviceProperties> device_properties() const { return std::nullopt; }
  virtual std::string note() const { return {}; }
  // Range hooks, on the thread that opens and closes each recorded range (a
  // RecordFunction or a step marker), while the collector runs. A device
  // collector stamps the work launched inside with `external_id` (CUPTI's
  // external correlation) or times the range on the device; the profiler
  // itself never calls a device API (Kineto's client interface).
  virtual void range_begin(std::string_view name, std::uint64_t external_id) {}
  virtual void range_end(std::uint64_t external_id) {}
};

// Process-wide callbacks on every RecordFunction, recorded or not, as
// PyTorch's RecordFunction global callbacks: the CUDA layer pushes NVTX ranges
// with them, so Nsight shows the same op names. Registered once, before the
// ranges they should see; never removed. At most 4.
struct RangeCallbacks {
  void (*enter)(std::string_view name) = nullptr;
  void (*exit)() = nullptr;
};
void add_range_callbacks(RangeCallbacks callbacks);

std::int64_t now_ns();  // the profiler's clock (steady, ns)

class Profiler final : public AllocationObserver {
 public:
  explicit Profiler(Schedule schedule = {});
  ~Profiler() override;
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  void add_collector(std::unique_ptr<Collector> c);
  // Long schedules: once the trace holds more than `keep_steps` recorded
  // steps, the oldest one's events leave it, handed first to `fold` as a
  // Trace of that step alone (the runner folds them into its running figures
  // and key averages), so memory stays flat for any number of steps. The
  // trace then holds the last keep_steps recorded steps and
  // Trace::steps_folded counts the ones before. A step is folded once no
  // range is open. Device collectors are flushed first (Collector::flush),
  // each activity going to the recorded step its launch fell in; where one
  // cannot flush, every step is kept until stop(). 0 (the default) keeps
  // every step. Call before start().
  void fold_steps_beyond(int keep_steps, std::function<void(Trace&&)> fold);
  // Records `a`'s allocations and frees while recording (until destruction).
  void observe(Allocator& a);
  void start();  // becomes the current profiler; step 0 begins
  void step();   // ends the current step, begins the next (prof.step())
  void stop();

  bool recording() const { return recording_; }
  int current_step() const { return step_; }
  // Whether steps are being folded: fold_steps_beyond was given a step
  // count and every running collector can flush (known once started).
  bool folds_steps() const;
  // The most events the trace held at once (what recording cost in memory).
  std::size_t peak_events() const { return peak_events_; }
  Trace& trace() { return trace_; }
  const Trace& trace() const { return trace_; }

  // The active profiler, or null.
  static Profiler* current();

  // Range API used through RecordFunction.
  std::size_t begin_range(std::string_view name, ActivityType type, std::string_view input_dtypes,
                          std::string_view input_dims);
  void end_range(std::size_t handle);
  void on_allocation(Device device, const void* ptr, std::int64_t delta, const MemoryStats& after) override;

 private:
  void open_step();
  void close_step();
  void set_recording(bool on);
  void fold_old_steps();
  void take_flushed(std::vector<Activity>&& device);

  Schedule schedule_;
  std::vector<std::unique_ptr<Collector>> collectors_;
  std::vector<bool> collector_ok_;
  std::vector<Allocator*> observed_;
  Trace trace_;
  std::vector<std::size_t> open_ranges_;  // stack of indices into trace_.activities
  std::size_t step_range_ = SIZE_MAX;
  int keep_steps_ = 0;
  std::function<void(Trace&&)> fold_;
  std::deque<int> held_steps_;  // recorded steps the trace holds, oldest first
  std::size_t peak_events_ = 0;
  int step_ = -1;
  bool started_ = false;
  bool recording_ = false;
  std::mutex mutex_;
};

// RAII range named after an op: recorded while a profiler records, and handed
// to the process-wide range callbacks (NVTX in CUDA builds) always.
class RecordFunction {
 public:
  explicit RecordFunction(std::string_view name, std::string_view input_dtypes = {}, std::string_view input_dims = {},
                          ActivityType type = ActivityType::CpuOp);
  ~RecordFunction();
  RecordFunction(const RecordFunction&) = delete;
  RecordFunction& operator=(const RecordFunction&) = delete;

 private:
  Profiler* profiler_;
  std::size_t handle_ = SIZE_MAX;
};

}  // namespace attnprof
