// The profiler core: schedule, nested CPU ranges, allocation events, and the
// collectors that bring device activities in.
#include "attnprof/profiler.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "attnprof/error.h"
#include "profiler/graph_replays.h"

namespace attnprof {
namespace {

// GraphCaptures (graph_replays.cpp) is called only by the CUDA plugin's CUPTI
// collector, which resolves it against the program that loads it. Nothing on
// the CPU side calls it, so a program's link would drop that object from the
// static layer and the plugin would fail to load (undefined symbol): this
// kept reference pulls it into every program that links the profiler.
[[gnu::used]] constexpr std::size_t (GraphCaptures::*kKeepGraphCaptures)(Trace&) = &GraphCaptures::attribute;

std::atomic<Profiler*> g_current{nullptr};
std::atomic<std::uint64_t> g_external_id{0};

// The process-wide RecordFunction callbacks: a fixed table filled once at
// start-up, read without a lock on every range.
constexpr std::size_t kMaxRangeCallbacks = 4;
std::array<RangeCallbacks, kMaxRangeCallbacks> g_range_callbacks{};
std::atomic<std::size_t> g_range_callback_count{0};

std::int64_t thread_id() {
  thread_local const std::int64_t tid = static_cast<std::int64_t>(::syscall(SYS_gettid));
  return tid;
}

}  // namespace

const char* activity_category(ActivityType t) {
  // The Chrome trace "cat" of each type, in the enum's order.
  constexpr std::array<const char*, 10> kCategories{
      "cpu_op",     "user_annotation", "gpu_user_annotation", "kernel",    "gpu_memcpy",
      "gpu_memset", "cuda_runtime",    "cuda_driver",         "cuda_sync", "[memory]"};
  return kCategories[static_cast<std::size_t>(t)];
}

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Schedule::Action Schedule::at(int step) const {
  const int cycle = wait + warmup + active;
  if (cycle <= 0 || step < 0) return Action::None;
  if (repeat > 0 && step / cycle >= repeat) return Action::None;
  const int m = step % cycle;
  if (m < wait) return Action::None;
  if (m < wait + warmup) return Action::Warmup;
  return m < cycle - 1 ? Action::Record : Action::RecordAndSave;
}

int Schedule::total_steps() const { return repeat > 0 ? repeat * (wait + warmup + active) : wait + warmup + active; }

Profiler::Profiler(Schedule schedule) : schedule_(schedule) {}

void add_range_callbacks(RangeCallbacks callbacks) {
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  const std::size_t n = g_range_callback_count.load(std::memory_order_relaxed);
  if (n == kMaxRangeCallbacks) fail(ErrorKind::Internal, "too many range callbacks");
  g_range_callbacks[n] = callbacks;
  g_range_callback_count.store(n + 1, std::memory_order_release);
}

Profiler::~Profiler() {
  for (Allocator* a : observed_) a->clear_observer(this);
  if (started_) {
    try {
      stop();
    } catch (...) {  // a destructor must not throw; stop() already noted the failure
    }
  }
}

void Profiler::add_collector(std::unique_ptr<Collector> c) {
  collectors_.push_back(std::move(c));
  collector_ok_.push_back(false);
}

void Profiler::fold_steps_beyond(int keep_steps, std::function<void(Trace&&)> fold) {
  if (started_) fail(ErrorKind::Internal, "fold_steps_beyond after start()");
  keep_steps_ = std::max(0, keep_steps);
  fold_ = std::move(fold);
}

void Profiler::observe(Allocator& a) {
  a.set_observer(this);
  observed_.push_back(&a);
}

Profiler* Profiler::current() { return g_current.load(std::memory_order_acquire); }

void Profiler::start() {
  if (started_) fail(ErrorKind::Internal, "profiler started twice");
  Profiler* expected = nullptr;
  if (!g_current.compare_exchange_strong(expected, this)) fail(ErrorKind::Internal, "another profiler is active");
  started_ = true;
  step_ = 0;
  // Collectors start with the first warmup or active step, so their start-up
  // cost lands in a step that is not recorded.
  for (std::size_t i = 0; i < collectors_.size(); ++i) {
    try {
      collectors_[i]->start();
      collector_ok_[i] = true;
    } catch (const Error& e) {
      trace_.collector_note += collectors_[i]->name() + " unavailable: " + e.what() + "\n";
    }
  }
  open_step();
}

void Profiler::open_step() {
  const Schedule::Action a = schedule_.at(step_);
  set_recording(a == Schedule::Action::Record || a == Schedule::Action::RecordAndSave);
  if (recording_) {
    step_range_ = begin_range("ProfilerStep#" + std::to_string(step_), ActivityType::UserAnnotation, {}, {});
    ++trace_.steps_recorded;
    held_steps_.push_back(step_);
  }
}

void Profiler::close_step() {
  if (step_range_ != SIZE_MAX) {
    end_range(step_range_);
    step_range_ = SIZE_MAX;
  }
}

void Profiler::set_recording(bool on) { recording_ = on; }

void Profiler::step() {
  if (!started_) fail(ErrorKind::Internal, "profiler step() before start()");
  close_step();
  fold_old_steps();
  ++step_;
  open_step();
}

bool Profiler::folds_steps() const {
  // A collector's activities are kept by the steps their launches fell in:
  // a step can leave only once they are in, so every running collector must
  // hand them over before stop().
  if (keep_steps_ <= 0) return false;
  for (std::size_t i = 0; i < collectors_.size(); ++i) {
    if (collector_ok_[i] && !collectors_[i]->can_flush()) return false;
  }
  return true;
}

void Profiler::take_flushed(std::vector<Activity>&& device) {
  std::lock_guard lock(mutex_);
  // The held steps' windows: a launch belongs to the step whose range holds
  // it, the device work to its launch's step (it may run after the step
  // ended), as stop() keeps them.
  std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>> windows;  // start, end, step
  for (const Activity& a : trace_.activities) {
    if (a.type == ActivityType::UserAnnotation && a.name.starts_with("ProfilerStep#"))
      windows.emplace_back(a.start_ns, a.end_ns(), a.step);
  }
  const auto step_at = [&](std::int64_t t) -> std::int64_t {
    for (const auto& [from, to, step] : windows) {
      if (t >= from && t <= to) return step;
    }
    return -1;
  };
  const auto held = [&](std::int64_t step) {
    return std::find(held_steps_.begin(), held_steps_.end(), static_cast<int>(step)) != held_steps_.end();
  };
  std::unordered_map<std::uint64_t, std::int64_t> step_of_launch;
  for (Activity& a : device) {
    if (a.on_device()) continue;
    a.step = step_at(a.start_ns);
    if (a.step >= 0 && a.correlation) step_of_launch.emplace(a.correlation, a.step);
  }
  for (Activity& a : device) {
    if (!a.on_device()) continue;
    if (a.correlation) {
      const auto it = step_of_launch.find(a.correlation);
      a.step = it == step_of_launch.end() ? -1 : it->second;
    } else if (a.step < 0 || !held(a.step)) {
      a.step = step_at(a.start_ns);  // a device-event span: its own step where it says one
    }
  }
  for (Activity& a : device) {
    if (a.step >= 0) trace_.activities.push_back(std::move(a));
  }
  peak_events_ = std::max(peak_events_, trace_.activities.size());
}

void Profiler::fold_old_steps() {
  if (!folds_steps()) return;
  {
    std::lock_guard lock(mutex_);
    // Handles are indices into the trace: fold only while none is out.
    if (static_cast<int>(held_steps_.size()) <= keep_steps_ || !open_ranges_.empty()) return;
  }
  // The device work of the steps about to leave, from every collector.
  std::vector<Activity> device;
  for (std::size_t i = 0; i < collectors_.size(); ++i) {
    if (!collector_ok_[i]) continue;
    try {
      collectors_[i]->flush(device);
    } catch (const Error& e) {
      trace_.collector_note += collectors_[i]->name() + " flush failed: " + e.what() + "\n";
    }
  }
  if (!device.empty()) take_flushed(std::move(device));
  while (true) {
    Trace old;
    {
      std::lock_guard lock(mutex_);
      if (static_cast<int>(held_steps_.size()) <= keep_steps_) return;
      const int step = held_steps_.front();
      held_steps_.pop_front();
      // Each event carries the step it fell in (device work its launch's);
      // host events are in step order, flushed device work after them.
      const auto end = std::stable_partition(trace_.activities.begin(), trace_.activities.end(),
                                             [step](const Activity& a) { return a.step <= step; });
      old.activities.assign(std::make_move_iterator(trace_.activities.begin()), std::make_move_iterator(end));
      trace_.activities.erase(trace_.activities.begin(), end);
      ++trace_.steps_folded;
    }
    old.name = trace_.name;
    old.device = trace_.device;
    old.world_size = trace_.world_size;
    old.steps_recorded = 1;
    for (std::size_t i = 0; i < collectors_.size(); ++i) {
      if (collector_ok_[i]) collectors_[i]->rewrite(old);
    }
    // As stop() leaves a trace: in start order, based at its first event.
    std::stable_sort(old.activities.begin(), old.activities.end(),
                     [](const Activity& a, const Activity& b) { return a.start_ns < b.start_ns; });
    old.base_ns = old.activities.empty() ? 0 : old.activities.front().start_ns;
    if (fold_) fold_(std::move(old));
  }
}

void Profiler::stop() {
  if (!started_) return;
  close_step();
  fold_old_steps();
  recording_ = false;
  started_ = false;
  g_current.store(nullptr, std::memory_order_release);

  // Recorded windows: the ProfilerStep ranges.
  std::vector<std::pair<std::int64_t, std::int64_t>> windows;
  for (const auto& a : trace_.activities) {
    if (a.type == ActivityType::UserAnnotation && a.name.rfind("ProfilerStep#", 0) == 0) {
      windows.emplace_back(a.start_ns, a.end_ns());
    }
  }
  auto in_window = [&](std::int64_t t) {
    return std::any_of(windows.begin(), windows.end(), [t](auto w) { return t >= w.first && t <= w.second; });
  };
  for (std::size_t i = 0; i < collectors_.size(); ++i) {
    if (!collector_ok_[i]) continue;
    std::vector<Activity> device;
    try {
      collectors_[i]->stop();
      collectors_[i]->drain(device);
    } catch (const Error& e) {
      trace_.collector_note += collectors_[i]->name() + " failed: " + e.what() + "\n";
      continue;
    }
    if (auto props = collectors_[i]->device_properties()) trace_.device = props;
    const std::string note = collectors_[i]->note();
    if (!note.empty()) trace_.collector_note += note + "\n";
    // Keep launches made inside recorded steps, and the device work they caused.
    std::unordered_set<std::uint64_t> kept;
    for (auto& a : device) {
      if (!a.on_device() && in_window(a.start_ns)) {
        if (a.correlation) kept.insert(a.correlation);
      }
    }
    for (auto& a : device) {
      const bool keep = a.on_device() ? (a.correlation ? kept.count(a.correlation) > 0 : in_window(a.start_ns))
                                      : in_window(a.start_ns);
      if (keep) trace_.activities.push_back(std::move(a));
    }
  }
  for (std::size_t i = 0; i < collectors_.size(); ++i) {
    if (collector_ok_[i]) collectors_[i]->rewrite(trace_);
  }
  if (!trace_.collector_note.empty() && trace_.collector_note.back() == '\n') trace_.collector_note.pop_back();
  std::stable_sort(trace_.activities.begin(), trace_.activities.end(),
                   [](const Activity& a, const Activity& b) { return a.start_ns < b.start_ns; });
  trace_.base_ns = trace_.activities.empty() ? 0 : trace_.activities.front().start_ns;
}

std::size_t Profiler::begin_range(std::string_view name, ActivityType type, std::string_view input_dtypes,
                                  std::string_view input_dims) {
  std::lock_guard lock(mutex_);
  Activity a;
  a.type = type;
  a.name = std::string(name);
  a.pid = ::getpid();
  a.tid = thread_id();
  a.step = step_;
  a.depth = static_cast<int>(open_ranges_.size());
  a.input_dtypes = std::string(input_dtypes);
  a.input_dims = std::string(input_dims);
  // Device collectors stamp launches made inside this range with its id, so
  // device work can be traced back to the op where time containment cannot tell.
  a.external_id = ++g_external_id;
  for (std::size_t i = 0; i < collectors_.size(); ++i) {
    if (collector_ok_[i]) collectors_[i]->range_begin(a.name, a.external_id);
  }
  a.start_ns = now_ns();
  trace_.activities.push_back(std::move(a));
  peak_events_ = std::max(peak_events_, trace_.activities.size());
  open_ranges_.push_back(trace_.activities.size() - 1);
  return trace_.activities.size() - 1;
}

void Profiler::end_range(std::size_t handle) {
  const std::int64_t t = now_ns();
  std::lock_guard lock(mutex_);
  if (handle >= trace_.activities.size()) return;
  for (std::size_t i = collectors_.size(); i-- > 0;) {
    if (collector_ok_[i]) collectors_[i]->range_end(trace_.activities[handle].external_id);
  }
  trace_.activities[handle].dur_ns = t - trace_.activities[handle].start_ns;
  auto it = std::find(open_ranges_.rbegin(), open_ranges_.rend(), handle);
  if (it != open_ranges_.rend()) open_ranges_.erase(std::next(it).base());
}

void Profiler::on_allocation(Device device, const void* ptr, std::int64_t delta, const MemoryStats& after) {
  if (!recording_) return;
  Activity a;
  a.type = ActivityType::Allocation;
  a.name = "[memory]";
  a.pid = ::getpid();
  a.tid = thread_id();
  a.start_ns = now_ns();
  a.step = step_;
  AllocationInfo info;
  info.bytes = delta;
  info.addr = reinterpret_cast<std::uint64_t>(ptr);
  info.total_allocated = after.allocated;
  info.total_reserved = after.reserved;
  info.peak_allocated = after.peak_allocated;
  info.device_type = device == Device::Cpu ? 0 : 1;
  info.device_id = device == Device::Cpu ? -1 : 0;
  a.allocation = info;
  std::lock_guard lock(mutex_);
  trace_.activities.push_back(std::move(a));
  peak_events_ = std::max(peak_events_, trace_.activities.size());
}

RecordFunction::RecordFunction(std::string_view name, std::string_view input_dtypes, std::string_view input_dims,
                               ActivityType type)
    : profiler_(Profiler::current()) {
  const std::size_t n = g_range_callback_count.load(std::memory_order_acquire);
  for (std::size_t i = 0; i < n; ++i) g_range_callbacks[i].enter(name);
  if (profiler_ && profiler_->recording()) {
    handle_ = profiler_->begin_range(name, type, input_dtypes, input_dims);
  } else {
    profiler_ = nullptr;
  }
}

RecordFunction::~RecordFunction() {
  if (profiler_) profiler_->end_range(handle_);
  for (std::size_t i = g_range_callback_count.load(std::memory_order_acquire); i-- > 0;) g_range_callbacks[i].exit();
}

}  // namespace attnprof
