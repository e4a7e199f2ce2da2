// Every field name of the Chrome trace, spelled as PyTorch's profiler (Kineto)
// writes it, so that Perfetto, chrome://tracing and trace-analysis libraries
// read our traces as theirs. The writer uses only these constants; a renamed
// key is changed here and nowhere else.
#pragma once

namespace attnprof::schema {

// Top level.
inline constexpr int kSchemaVersion = 1;
inline constexpr const char* kSchemaVersionKey = "schemaVersion";
inline constexpr const char* kDeviceProperties = "deviceProperties";
inline constexpr const char* kDisplayTimeUnit = "displayTimeUnit";
inline constexpr const char* kDisplayTimeUnitMs = "ms";
inline constexpr const char* kBaseTimeNanoseconds = "baseTimeNanoseconds";
inline constexpr const char* kTraceEvents = "traceEvents";
inline constexpr const char* kTraceName = "traceName";
// {"rank": 0}: Holistic Trace Analysis finds a trace's rank by matching the
// raw text against "rank":\s+N line by line, so the writer's indented dump
// (which puts a space after every colon) must keep this key before
// traceEvents (keys are written sorted: it is).
inline constexpr const char* kDistributedInfo = "distributedInfo";
inline constexpr const char* kRank = "rank";
inline constexpr const char* kWorldSize = "world_size";
// Not a PyTorch key: why device timing fell back (readers ignore unknown keys).
inline constexpr const char* kCollectorNote = "collectorNote";
// Not a PyTorch key, written where steps were folded: how many of the oldest
// recorded steps a long schedule's trace left out (it holds the last ones;
// the run's table and figures cover them all).
inline constexpr const char* kStepsFolded = "stepsFolded";

// deviceProperties entries (Kineto's createDevicePropertiesJson).
namespace device {
inline constexpr const char* kId = "id";
inline constexpr const char* kName = "name";
inline constexpr const char* kTotalGlobalMem = "totalGlobalMem";
inline constexpr const char* kComputeMajor = "computeMajor";
inline constexpr const char* kComputeMinor = "computeMinor";
inline constexpr const char* kMaxThreadsPerBlock = "maxThreadsPerBlock";
inline constexpr const char* kMaxThreadsPerMultiprocessor = "maxThreadsPerMultiprocessor";
inline constexpr const char* kRegsPerBlock = "regsPerBlock";
inline constexpr const char* kWarpSize = "warpSize";
inline constexpr const char* kSharedMemPerBlock = "sharedMemPerBlock";
inline constexpr const char* kNumSms = "numSms";
inline constexpr const char* kRegsPerMultiprocessor = "regsPerMultiprocessor";
inline constexpr const char* kSharedMemPerBlockOptin = "sharedMemPerBlockOptin";
inline constexpr const char* kSharedMemPerMultiprocessor = "sharedMemPerMultiprocessor";
// cudaDeviceProp's own names for two fields Kineto leaves out.
inline constexpr const char* kMaxBlocksPerMultiprocessor = "maxBlocksPerMultiProcessor";
inline constexpr const char* kL2CacheSize = "l2CacheSize";
}  // namespace device

// Event fields.
namespace event {
inline constexpr const char* kPh = "ph";
inline constexpr const char* kCat = "cat";
inline constexpr const char* kName = "name";
inline constexpr const char* kPid = "pid";
inline constexpr const char* kTid = "tid";
inline constexpr const char* kTs = "ts";
inline constexpr const char* kDur = "dur";
inline constexpr const char* kArgs = "args";
inline constexpr const char* kId = "id";
inline constexpr const char* kBindingPoint = "bp";
inline constexpr const char* kScope = "s";
}  // namespace event

// Phases.
namespace ph {
inline constexpr const char* kComplete = "X";
inline constexpr const char* kInstant = "i";
inline constexpr const char* kFlowStart = "s";
inline constexpr const char* kFlowFinish = "f";
inline constexpr const char* kMetadata = "M";
}  // namespace ph

// Flow arrows from a launch API call to the device activity it started.
inline constexpr const char* kFlowCategory = "ac2g";
inline constexpr const char* kFlowName = "ac2g";
// "e": the arrow binds to the enclosing slice, i.e. the kernel that starts at ts.
inline constexpr const char* kBindEnclosing = "e";

// Allocation instant events, as PyTorch's memory profiler writes them.
inline constexpr const char* kMemoryName = "[memory]";
inline constexpr const char* kMemoryCategory = "cpu_instant_event";
inline constexpr const char* kThreadScope = "t";

// Metadata events.
namespace meta {
inline constexpr const char* kProcessName = "process_name";
inline constexpr const char* kProcessSortIndex = "process_sort_index";
inline constexpr const char* kThreadName = "thread_name";
inline constexpr const char* kThreadSortIndex = "thread_sort_index";
inline constexpr const char* kNameArg = "name";
inline constexpr const char* kSortIndexArg = "sort_index";
inline constexpr const char* kHostProcessName = "attnprof";
inline constexpr const char* kDeviceProcessPrefix = "GPU ";
inline constexpr const char* kThreadPrefix = "thread ";
inline constexpr const char* kStreamPrefix = "stream ";
}  // namespace meta

// Event args.
namespace args {
inline constexpr const char* kExternalId = "External id";
inline constexpr const char* kQueued = "queued";
inline constexpr const char* kDevice = "device";
inline constexpr const char* kContext = "context";
inline constexpr const char* kStream = "stream";
inline constexpr const char* kCorrelation = "correlation";
inline constexpr const char* kRegistersPerThread = "registers per thread";
inline constexpr const char* kSharedMemory = "shared memory";
inline constexpr const char* kBlocksPerSm = "blocks per SM";
inline constexpr const char* kWarpsPerSm = "warps per SM";
inline constexpr const char* kGrid = "grid";
inline constexpr const char* kBlock = "block";
inline constexpr const char* kOccupancy = "est. achieved occupancy %";
inline constexpr const char* kCbid = "cbid";
inline constexpr const char* kBytes = "bytes";
inline constexpr const char* kBandwidth = "memory bandwidth (GB/s)";
inline constexpr const char* kInputType = "Input type";
inline constexpr const char* kInputDims = "Input Dims";
inline constexpr const char* kConcreteInputs = "Concrete Inputs";  // scalars as text: is_causal, scale
inline constexpr const char* kDeviceType = "Device Type";
inline constexpr const char* kDeviceId = "Device Id";
inline constexpr const char* kAddr = "Addr";
inline constexpr const char* kMemBytes = "Bytes";
inline constexpr const char* kTotalAllocated = "Total Allocated";
inline constexpr const char* kTotalReserved = "Total Reserved";
// Device activities of a CUDA graph replay (Kineto's addGraphNodeTypedMetadata):
// the executable graph and the node that ran it, written only for those.
inline constexpr const char* kGraphId = "graph id";
inline constexpr const char* kGraphNodeId = "graph node id";
}  // namespace args

}  // namespace attnprof::schema
