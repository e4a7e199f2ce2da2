// Chrome trace writer: one pass over the Trace records, field names from
// trace_schema.h, escaping and commas left to nlohmann::json.
#include <algorithm>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>

#include "attnprof/error.h"
#include "attnprof/trace_io.h"
#include "profiler/trace_schema.h"

namespace attnprof {
namespace {

using json = nlohmann::json;
namespace sc = schema;

bool is_launch(ActivityType t) { return t == ActivityType::CudaRuntime || t == ActivityType::CudaDriver; }

bool is_device_op(ActivityType t) {
  return t == ActivityType::Kernel || t == ActivityType::Memcpy || t == ActivityType::Memset;
}

double to_us(std::int64_t ns) { return static_cast<double>(ns) / 1000.0; }

// Where an event is drawn: GPU activities on (device, stream), host events on
// (process, thread), as Kineto lays them out.
struct Lane {
  std::int64_t pid = 0;
  std::int64_t tid = 0;
  bool device = false;
  auto operator<=>(const Lane&) const = default;
};

Lane lane_of(const Activity& a) {
  if (a.on_device()) return {std::max<std::int64_t>(a.device, 0), std::max<std::int64_t>(a.stream, 0), true};
  return {a.pid, a.tid, false};
}

// Trace::base_ns normally precedes every event; if it is unset or later than
// some event, the earliest event becomes the base so that every ts is >= 0.
std::int64_t effective_base(const Trace& trace) {
  if (trace.activities.empty()) return trace.base_ns;
  const auto earliest =
      std::min_element(trace.activities.begin(), trace.activities.end(), [](const Activity& a, const Activity& b) {
        return a.start_ns < b.start_ns;
      })->start_ns;
  return (trace.base_ns > 0 && trace.base_ns <= earliest) ? trace.base_ns : earliest;
}

json device_properties_json(const DeviceProperties& d) {
  namespace k = sc::device;
  return json{
      {k::kId, d.id},
      {k::kName, d.name},
      {k::kTotalGlobalMem, d.total_global_mem},
      {k::kComputeMajor, d.compute_major},
      {k::kComputeMinor, d.compute_minor},
      {k::kMaxThreadsPerBlock, d.max_threads_per_block},
      {k::kMaxThreadsPerMultiprocessor, d.max_threads_per_sm},
      {k::kRegsPerBlock, d.regs_per_block},
      {k::kWarpSize, d.warp_size},
      {k::kSharedMemPerBlock, d.shared_mem_per_block},
      {k::kNumSms, d.num_sms},
      {k::kRegsPerMultiprocessor, d.regs_per_sm},
      {k::kSharedMemPerBlockOptin, d.shared_mem_per_block_optin},
      {k::kSharedMemPerMultiprocessor, d.shared_mem_per_sm},
      {k::kMaxBlocksPerMultiprocessor, d.max_blocks_per_sm},
      {k::kL2CacheSize, d.l2_cache_bytes},
  };
}

// A graph replay's device activity names its graph and node, as Kineto's do;
// eager ones carry neither key.
void add_graph_args(const Activity& a, json& args) {
  if (a.graph_node_id == 0) return;
  args[sc::args::kGraphId] = a.graph_id;
  args[sc::args::kGraphNodeId] = a.graph_node_id;
}

json kernel_args(const Activity& a, const std::optional<DeviceProperties>& dev) {
  namespace k = sc::args;
  const KernelInfo info = a.kernel.value_or(KernelInfo{});
  // Kineto's fallback when no occupancy was computed: blocks spread over SMs.
  double blocks_per_sm = 0.0;
  double warps_per_sm = 0.0;
  if (info.blocks_per_sm) {
    blocks_per_sm = *info.blocks_per_sm;
  } else if (dev && dev->num_sms > 0) {
    blocks_per_sm = static_cast<double>(info.grid[0]) * info.grid[1] * info.grid[2] / dev->num_sms;
  }
  if (info.warps_per_sm) {
    warps_per_sm = *info.warps_per_sm;
  } else {
    const int warp = (dev && dev->warp_size > 0) ? dev->warp_size : 32;
    warps_per_sm = blocks_per_sm * info.block[0] * info.block[1] * info.block[2] / warp;
  }
  json args{
      {k::kExternalId, a.external_id},
      {k::kQueued, info.queued_ns ? *info.queued_ns / 1000.0 : 0.0},
      {k::kDevice, a.device},
      {k::kContext, a.context},
      {k::kStream, a.stream},
      {k::kCorrelation, a.correlation},
      {k::kRegistersPerThread, info.registers_per_thread},
      {k::kSharedMemory, info.static_shared_bytes + info.dynamic_shared_bytes},
      {k::kBlocksPerSm, blocks_per_sm},
      {k::kWarpsPerSm, warps_per_sm},
      {k::kGrid, info.grid},
      {k::kBlock, info.block},
      {k::kOccupancy, info.occupancy_pct.value_or(0.0)},
  };
  add_graph_args(a, args);
  return args;
}

json transfer_args(const Activity& a) {
  namespace k = sc::args;
  const std::int64_t bytes = a.transfer ? a.transfer->bytes : 0;
  // Bytes per nanosecond is GB/s, Kineto's unit.
  const double bandwidth = a.dur_ns > 0 ? static_cast<double>(bytes) / static_cast<double>(a.dur_ns) : 0.0;
  json args{
      {k::kExternalId, a.external_id},  {k::kDevice, a.device}, {k::kContext, a.context},   {k::kStream, a.stream},
      {k::kCorrelation, a.correlation}, {k::kBytes, bytes},     {k::kBandwidth, bandwidth},
  };
  add_graph_args(a, args);
  return args;
}

json launch_args(const Activity& a) {
  namespace k = sc::args;
  return json{{k::kCbid, a.cbid}, {k::kCorrelation, a.correlation}, {k::kExternalId, a.external_id}};
}

// PyTorch writes input dtypes and shapes as JSON lists; ours arrive as the
// text of those lists ("bf16, bf16" and "[8, 16], [16, 8]").
json input_types(const std::string& text) {
  json out = json::array();
  std::size_t pos = 0;
  while (pos < text.size()) {
    const std::size_t comma = std::min(text.find(',', pos), text.size());
    const std::size_t first = text.find_first_not_of(' ', pos);
    const std::size_t last = text.find_last_not_of(' ', comma - 1);
    if (first < comma) out.push_back(text.substr(first, last - first + 1));
    pos = comma + 1;
  }
  return out;
}

json input_dims(const std::string& text) {
  json parsed = json::parse("[" + text + "]", nullptr, /*allow_exceptions=*/false);
  return parsed.is_discarded() ? json(text) : parsed;
}

json host_args(const Activity& a) {
  json args{{sc::args::kExternalId, a.external_id}};
  if (!a.input_dtypes.empty()) args[sc::args::kInputType] = input_types(a.input_dtypes);
  if (!a.input_dims.empty()) args[sc::args::kInputDims] = input_dims(a.input_dims);
  if (!a.concrete_inputs.empty()) args[sc::args::kConcreteInputs] = a.concrete_inputs;
  return args;
}

json gpu_annotation_args(const Activity& a) {
  return json{{sc::args::kExternalId, a.external_id}, {sc::args::kDevice, a.device}, {sc::args::kStream, a.stream}};
}

json args_for(const Activity& a, const std::optional<DeviceProperties>& dev) {
  switch (a.type) {
    case ActivityType::Kernel:
      return kernel_args(a, dev);
    case ActivityType::Memcpy:
    case ActivityType::Memset:
      return transfer_args(a);
    case ActivityType::CudaRuntime:
    case ActivityType::CudaDriver:
    case ActivityType::CudaSync:
      return launch_args(a);
    case ActivityType::GpuUserAnnotation:
      return gpu_annotation_args(a);
    case ActivityType::CpuOp:
    case ActivityType::UserAnnotation:
    case ActivityType::Allocation:
      break;
  }
  return host_args(a);
}

json complete_event(const Activity& a, std::int64_t base, const std::optional<DeviceProperties>& dev) {
  namespace e = sc::event;
  const Lane lane = lane_of(a);
  return json{
      {e::kPh, sc::ph::kComplete}, {e::kCat, activity_category(a.type)},
      {e::kName, a.name},          {e::kPid, lane.pid},
      {e::kTid, lane.tid},         {e::kTs, to_us(a.start_ns - base)},
      {e::kDur, to_us(a.dur_ns)},  {e::kArgs, args_for(a, dev)},
  };
}

json memory_event(const Activity& a, std::int64_t base) {
  namespace e = sc::event;
  namespace k = sc::args;
  const AllocationInfo info = a.allocation.value_or(AllocationInfo{});
  return json{
      {e::kPh, sc::ph::kInstant},
      {e::kCat, sc::kMemoryCategory},
      {e::kScope, sc::kThreadScope},
      {e::kName, sc::kMemoryName},
      {e::kPid, a.pid},
      {e::kTid, a.tid},
      {e::kTs, to_us(a.start_ns - base)},
      {e::kArgs,
       {
           {k::kDeviceType, info.device_type},
           {k::kDeviceId, info.device_id},
           {k::kAddr, info.addr},
           {k::kMemBytes, info.bytes},
           {k::kTotalAllocated, info.total_allocated},
           {k::kTotalReserved, info.total_reserved},
       }},
  };
}

json flow_event(bool finish, std::uint64_t id, const Lane& lane, double ts) {
  namespace e = sc::event;
  json ev{
      {e::kPh, finish ? sc::ph::kFlowFinish : sc::ph::kFlowStart},
      {e::kId, id},
      {e::kPid, lane.pid},
      {e::kTid, lane.tid},
      {e::kTs, ts},
      {e::kCat, sc::kFlowCategory},
      {e::kName, sc::kFlowName},
  };
  if (finish) ev[e::kBindingPoint] = sc::kBindEnclosing;
  return ev;
}

json metadata_event(const char* name, std::int64_t pid, std::int64_t tid, const char* arg, json value) {
  namespace e = sc::event;
  return json{{e::kName, name}, {e::kPh, sc::ph::kMetadata},          {e::kTs, 0}, {e::kPid, pid},
              {e::kTid, tid},   {e::kArgs, {{arg, std::move(value)}}}};
}

// Process and thread names so that viewers label the lanes: the host process
// first, then one process per GPU with one lane per stream.
void emit_metadata(const std::set<Lane>& lanes, const std::function<void(const json&)>& emit) {
  namespace m = sc::meta;
  std::map<std::int64_t, bool> processes;  // pid -> is a device
  for (const Lane& lane : lanes) processes.emplace(lane.pid, lane.device);
  for (const auto& [pid, device] : processes) {
    const std::string name = device ? m::kDeviceProcessPrefix + std::to_string(pid) : m::kHostProcessName;
    // Host first; devices after it in device order.
    const std::int64_t sort_index = device ? 1000000 + pid : 0;
    emit(metadata_event(m::kProcessName, pid, 0, m::kNameArg, name));
    emit(metadata_event(m::kProcessSortIndex, pid, 0, m::kSortIndexArg, sort_index));
  }
  for (const Lane& lane : lanes) {
    const std::string name = (lane.device ? m::kStreamPrefix : m::kThreadPrefix) + std::to_string(lane.tid);
    emit(metadata_event(m::kThreadName, lane.pid, lane.tid, m::kNameArg, name));
    emit(metadata_event(m::kThreadSortIndex, lane.pid, lane.tid, m::kSortIndexArg, lane.tid));
  }
}

// An arrow from each launch API call to the device activity it started, only
// where both ends were recorded.
void emit_flows(const Trace& trace, std::int64_t base, const std::function<void(const json&)>& emit) {
  std::unordered_map<std::uint64_t, const Activity*> launches;
  for (const Activity& a : trace.activities) {
    if (is_launch(a.type) && a.correlation != 0) launches.emplace(a.correlation, &a);
  }
  std::set<std::uint64_t> started;
  for (const Activity& a : trace.activities) {
    if (!is_device_op(a.type) || a.correlation == 0) continue;
    const auto it = launches.find(a.correlation);
    if (it == launches.end()) continue;
    const Activity& launch = *it->second;
    if (started.insert(a.correlation).second) {
      emit(flow_event(false, a.correlation, lane_of(launch), to_us(launch.start_ns - base)));
    }
    emit(flow_event(true, a.correlation, lane_of(a), to_us(a.start_ns - base)));
  }
}

// Replace, not throw, on invalid UTF-8: a kernel name must not lose the trace.
std::string dump(const json& j) { return j.dump(1, ' ', false, json::error_handler_t::replace); }

// The document, handed to `write` in pieces: the top-level keys as one JSON
// value with "traceEvents" empty, and each event dumped alone into its
// place. Holding the whole document as one value took about 2 KiB an event,
// which a long schedule's millions of events cannot afford; the pieces
// concatenate to exactly the text that value's dump (indent 1) wrote.
void stream_document(const Trace& trace, const WritePiece& write) {
  const std::int64_t base = effective_base(trace);
  json doc{
      {sc::kSchemaVersionKey, sc::kSchemaVersion},
      {sc::kDeviceProperties, json::array()},
      {sc::kDisplayTimeUnit, sc::kDisplayTimeUnitMs},
      {sc::kBaseTimeNanoseconds, base},
      {sc::kTraceEvents, json::array()},
      {sc::kTraceName, trace.name},
      {sc::kDistributedInfo, {{sc::kRank, 0}, {sc::kWorldSize, trace.world_size}}},
  };
  if (trace.device) doc[sc::kDeviceProperties].push_back(device_properties_json(*trace.device));
  if (!trace.collector_note.empty()) doc[sc::kCollectorNote] = trace.collector_note;
  if (trace.steps_folded > 0) doc[sc::kStepsFolded] = trace.steps_folded;
  const std::string outer = dump(doc);
  // The key at the top level's indent (one space): a string value holding
  // the same words has its quotes escaped, so it cannot match.
  const std::string key = std::string("\n \"") + sc::kTraceEvents + "\": ";
  const std::size_t at = outer.find(key + "[]");
  if (at == std::string::npos) fail(ErrorKind::Internal, "chrome trace: no traceEvents key in the document");
  const std::size_t open = at + key.size();  // the '[' of "[]"
  write(std::string_view(outer).substr(0, open));

  // An event inside the array sits two spaces in (the array's own indent, 1,
  // plus one step): its dump alone starts at 0, so every line moves over by 2.
  bool first = true;
  std::string text;
  const auto emit = [&](const json& event) {
    text = first ? "[\n  " : ",\n  ";
    first = false;
    for (const char c : dump(event)) {
      text += c;
      if (c == '\n') text += "  ";
    }
    write(text);
  };
  std::set<Lane> lanes;
  for (const Activity& a : trace.activities) lanes.insert(lane_of(a));
  emit_metadata(lanes, emit);
  for (const Activity& a : trace.activities) {
    emit(a.type == ActivityType::Allocation ? memory_event(a, base) : complete_event(a, base, trace.device));
  }
  emit_flows(trace, base, emit);
  write(first ? std::string_view("[]") : std::string_view("\n ]"));
  write(std::string_view(outer).substr(open + 2));
}

}  // namespace

std::string chrome_trace_json(const Trace& trace) {
  std::string out;
  stream_document(trace, [&out](std::string_view piece) { out.append(piece); });
  return out;
}

void write_chrome_trace(const Trace& trace, const std::filesystem::path& path) {
  write_file_atomically(
      path, [&trace](const WritePiece& write) { stream_document(trace, write); }, "trace");
}

}  // namespace attnprof
