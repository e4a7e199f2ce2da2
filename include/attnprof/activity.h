// Typed activity records: the one data model behind the trace, the table and
// the summary (Kineto's layering: collectors produce these, writers read them).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace attnprof {

enum class ActivityType : std::uint8_t {
  CpuOp,              // an op a backend runs on the host ("matmul", "softmax")
  UserAnnotation,     // a range the runner opens ("ProfilerStep#3", "forward")
  GpuUserAnnotation,  // the GPU-side span of a user annotation
  Kernel,
  Memcpy,
  Memset,
  CudaRuntime,  // cudaLaunchKernel, cudaMemcpyAsync ...
  CudaDriver,   // cuLaunchKernel, cuLaunchKernelEx ...
  CudaSync,     // cudaDeviceSynchronize, cudaStreamSynchronize, event syncs
  Allocation,   // an instant event: bytes > 0 allocated, < 0 freed
};

const char* activity_category(ActivityType t);  // the trace "cat" string

struct KernelInfo {
  std::array<int, 3> grid{1, 1, 1};
  std::array<int, 3> block{1, 1, 1};
  int registers_per_thread = 0;
  int static_shared_bytes = 0;
  int dynamic_shared_bytes = 0;
  // Theoretical occupancy from the record (CUDA occupancy calculator).
  std::optional<double> blocks_per_sm;
  std::optional<double> warps_per_sm;
  std::optional<double> occupancy_pct;
  std::optional<double> queued_ns;  // launch-to-start, when known
};

struct TransferInfo {
  std::int64_t bytes = 0;
  std::string kind;  // "DtoD", "HtoD", "DtoH" for memcpys; empty for memsets
};

struct AllocationInfo {
  std::int64_t bytes = 0;  // > 0 allocated, < 0 freed
  std::uint64_t addr = 0;
  std::int64_t total_allocated = 0;
  std::int64_t total_reserved = 0;
  std::int64_t peak_allocated = 0;
  int device_type = 0;  // 0 CPU, 1 CUDA (PyTorch's numbering)
  int device_id = -1;
};

struct Activity {
  ActivityType type = ActivityType::CpuOp;
  std::string name;
  std::int64_t start_ns = 0;  // steady clock, the profiler's time base
  std::int64_t dur_ns = 0;    // 0 for instant events
  // CPU events: process and thread; GPU events: device and stream.
  std::int64_t pid = 0;
  std::int64_t tid = 0;
  int device = -1;
  std::int64_t stream = -1;
  std::int64_t context = -1;
  std::uint64_t correlation = 0;  // launch API call <-> device activity
  std::uint64_t external_id = 0;  // the CPU op that enclosed the launch
  std::int64_t step = -1;         // profiler step the event fell in
  int depth = 0;                  // nesting depth of CPU ranges (0 = outermost)
  std::uint32_t cbid = 0;         // CUPTI callback id of runtime/driver calls
  std::string input_dtypes;       // CPU ops: "bf16, bf16" as PyTorch's "Input type"
  std::string input_dims;         // CPU ops: "[8, 16, 1024, 64], [...]"
  // CPU ops: PyTorch's "Concrete Inputs", one entry per input ("True",
  // "0.125"; empty for tensors): what an attention call's is_causal and scale were.
  std::vector<std::string> concrete_inputs;
  // Device activities run by a CUDA graph launch: the graph and the node that
  // ran it (CUPTI's graphId, graphNodeId of the executable graph); 0 otherwise.
  // A replayed node's kernel is tied to the range its node was captured in
  // through these (src/profiler/graph_replays.h).
  std::uint32_t graph_id = 0;
  std::uint64_t graph_node_id = 0;
  std::optional<KernelInfo> kernel;
  std::optional<TransferInfo> transfer;
  std::optional<AllocationInfo> allocation;

  std::int64_t end_ns() const { return start_ns + dur_ns; }
  bool on_device() const {
    return type == ActivityType::Kernel || type == ActivityType::Memcpy || type == ActivityType::Memset ||
           type == ActivityType::GpuUserAnnotation;
  }
};

struct DeviceProperties {
  int id = 0;
  std::string name;
  std::int64_t total_global_mem = 0;
  int compute_major = 0;
  int compute_minor = 0;
  int num_sms = 0;
  int max_threads_per_sm = 0;
  int max_threads_per_block = 0;
  int max_blocks_per_sm = 0;
  int regs_per_sm = 0;
  int regs_per_block = 0;
  int warp_size = 32;
  std::int64_t shared_mem_per_sm = 0;
  std::int64_t shared_mem_per_block = 0;
  std::int64_t shared_mem_per_block_optin = 0;
  std::int64_t l2_cache_bytes = 0;
  // Peak DRAM bandwidth in GB/s from the memory clock and bus width (the
  // roofline's memory line); 0 where unknown. Not in Kineto's schema.
  double memory_bandwidth_gbs = 0;
  // Measured: a large device-to-device copy's read plus written bytes over
  // its time, in GB/s (DeviceRuntime::copy_bandwidth_gbs); what a copy
  // reaches, below the peak above. 0 where not measured. Not in Kineto's schema.
  double copy_bandwidth_gbs = 0;
};

struct Trace {
  std::vector<Activity> activities;        // sorted by start_ns after stop()
  std::optional<DeviceProperties> device;  // set when a CUDA device was profiled
  std::int64_t base_ns = 0;                // the earliest timestamp; writers subtract it
  std::string name;                        // trace name ("8_16_1024_64_naive")
  std::string collector_note;              // e.g. "CUPTI unavailable: timing from device events"
  int steps_recorded = 0;                  // active steps captured
  // Of those, the oldest ones folded into the run's figures and dropped from
  // `activities` (Profiler::fold_steps_beyond): the trace holds the others.
  int steps_folded = 0;
  int world_size = 1;  // GPUs one run was sharded over (--gpus); distributedInfo
};

}  // namespace attnprof
