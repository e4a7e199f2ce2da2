// PyTorch's prof.key_averages().table(): events grouped by name with self and
// total CPU and CUDA time, read from the Trace records alone.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attnprof/activity.h"

namespace attnprof {

// One row: every event of one name. Host rows (CPU ops, annotations, runtime,
// driver and sync calls) carry CPU time and the device time they launched;
// device rows (kernels, memcpys, memsets) carry only their own device time.
struct KeyAverage {
  std::string name;                         // "ProfilerStep#N" steps are grouped as "ProfilerStep*"
  ActivityType type = ActivityType::CpuOp;  // of the first event in the group
  bool on_device = false;
  std::int64_t count = 0;
  std::int64_t self_cpu_ns = 0;    // durations minus direct host children
  std::int64_t cpu_total_ns = 0;   // durations
  std::int64_t self_cuda_ns = 0;   // device time launched with this as the innermost op
  std::int64_t cuda_total_ns = 0;  // device time launched anywhere inside

  double cpu_avg_ns() const { return count > 0 ? static_cast<double>(cpu_total_ns) / count : 0.0; }
  double cuda_avg_ns() const { return count > 0 ? static_cast<double>(cuda_total_ns) / count : 0.0; }
};

// Rows in order of each name's first event. Nesting: by time containment on
// one (pid, tid), ties broken by Activity::depth. Device time reaches a host
// op through the correlation id of a runtime or driver launch inside it (or,
// when no op encloses the launch, the op whose External id the launch carries).
std::vector<KeyAverage> key_averages(const Trace& trace);

// Adds `more`'s rows to `into`: counts and times summed row by row (by name
// and side), rows new to `into` appended in `more`'s order. Nesting and
// launches never cross a profiler step, so merging each step's rows in step
// order gives exactly the rows of the steps' whole trace: the runner keeps
// a long schedule's table this way, in memory that grows with the names only.
void merge_key_averages(std::vector<KeyAverage>& into, const std::vector<KeyAverage>& more);

struct TableOptions {
  // cpu_time_total, self_cpu_time_total, cuda_time_total, self_cuda_time_total
  // or count (PyTorch's device_time_total spellings are accepted too); descending.
  std::string sort_by = "cpu_time_total";
  int row_limit = -1;  // rows shown; <= 0 shows all
};

// The table as PyTorch prints it, totals lines included; the CUDA columns
// appear only when there are device activities. Empty when there are no rows.
// Throws Error(InvalidArgument) on an unknown sort key.
std::string key_averages_table(const std::vector<KeyAverage>& rows, const TableOptions& options = {});
std::string key_averages_table(const Trace& trace, const TableOptions& options = {});

// PyTorch's time format: "1.200s", "1.234ms", "56.000us".
std::string format_time_us(double us);

}  // namespace attnprof
