// The CUDA half of the profiler: CUPTI activity records turned into attnprof
// Activities (Kineto's bottom layer; writers never see CUPTI types).
//
// CUPTI is process-wide: its buffer callbacks and clock are registered by
// each collector's start() (and CUPTI detached again by its stop()), and only
// one CuptiCollector may be running at a time. The buffer callback
// only copies records; names are demangled, occupancy computed and thread ids
// mapped in drain(), on the caller's thread, because CUDA calls are not
// allowed inside CUPTI callbacks.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnprof/activity.h"
#include "attnprof/profiler.h"

namespace attnprof::cupti {

// cudaGetDeviceProperties in attnprof's terms; throws Error(Device).
DeviceProperties query_device_properties(int device);

// Theoretical occupancy of one launch from its record (block, registers,
// static and dynamic shared memory): fills blocks_per_sm, warps_per_sm and
// occupancy_pct with attnprof/occupancy.h's calculator, the one a trace read
// back gets too. Kernels with more than 48 KiB of dynamic shared memory count
// against the SM's shared memory (they opted in to launch), so large-tile and
// driver-API (cuLaunchKernelEx) launches do not read as 0%. Leaves the fields
// empty for an unknown architecture or a record with no block size.
void fill_occupancy(KernelInfo& kernel, const DeviceProperties& device);

// Sets CUPTI up once per process (buffer callbacks, the shared clock) and
// checks that activity collection can be enabled; leaves it attached for the
// first start(). Returns an empty string when
// CUPTI is usable, otherwise the one-line reason (no device, another profiler
// attached, ...). Cached after the first call.
std::string probe();

// Whether CUPTI is loaded in the process by us: true from a collector's
// start() until its stop() detaches it (cuptiFinalize), so that calls made
// after a profile pay nothing for it.
bool attached();

class CuptiCollector : public Collector {
 public:
  CuptiCollector() = default;
  ~CuptiCollector() override;

  std::string name() const override { return "CUPTI"; }
  // Enables kernel, memcpy, memset, runtime, driver, synchronization and
  // external-correlation records. Throws Error(Device) with the reason.
  void start() override;
  // Synchronizes the device, flushes every buffer, disables collection and
  // detaches CUPTI from the process (unless ATTNPROF_CUPTI_STAY_ATTACHED=1).
  void stop() override;
  void drain(std::vector<Activity>& out) override;
  // Waits for the device and hands over every record so far (a forced
  // flush), names and all, so that a long schedule keeps only its last
  // steps' records.
  bool can_flush() const override { return true; }
  void flush(std::vector<Activity>& out) override;
  // CUDA graphs: while running, CUPTI's resource callbacks record which
  // ranges each graph node was created in (and each instantiated clone's
  // original); here every replay's kernels are tied back to those ranges
  // (graph_replays.h).
  void rewrite(Trace& trace) override;
  std::optional<DeviceProperties> device_properties() const override { return device_; }
  // Dropped-record counts and clock fallbacks, when there were any.
  std::string note() const override { return note_; }
  // External correlation: CUDA calls made inside the range (and the device
  // work they launch) carry its id as Activity::external_id.
  void range_begin(std::string_view name, std::uint64_t external_id) override;
  void range_end(std::uint64_t external_id) override;

 private:
  void finish(std::vector<Activity>& raw);
  void add_note(const std::string& s) { note_ += (note_.empty() ? "" : "; ") + s; }

  bool running_ = false;
  std::vector<Activity> activities_;
  std::vector<DeviceProperties> devices_;
  std::optional<DeviceProperties> device_;
  std::string note_;
};

// Tells the collector that the calling thread makes CUDA calls, so that
// CUPTI's thread ids (pthread_self) become OS thread ids (gettid, what the
// CPU side records). start() registers its own thread; range_begin registers
// every thread that opens a recorded range.
void register_current_thread();

// Registers the RecordFunction callbacks that push an NVTX range per op, so
// Nsight Systems shows our op names (nvtx.cpp). Idempotent.
void install_nvtx_ranges();

}  // namespace attnprof::cupti
