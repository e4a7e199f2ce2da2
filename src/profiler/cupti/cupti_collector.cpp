#include "profiler/cupti/cupti_collector.h"

#include <cuda_runtime_api.h>
#include <cupti.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "attnprof/error.h"
#include "attnprof/occupancy.h"
#include "profiler/cupti/cupti_records.h"
#include "profiler/graph_replays.h"

namespace attnprof::cupti {
namespace {

constexpr std::size_t kBufferBytes = 8u << 20;  // CUPTI's own default; fewer callbacks than small buffers

// Everything CUPTI's callbacks touch. Leaked on purpose: CUPTI may deliver a
// last buffer while static destructors run.
struct Global {
  std::mutex mutex;
  std::once_flag init_once;
  std::string init_error;  // why CUPTI cannot be used; empty when it can
  // Buffer and clock callbacks registered since the last detach. Changed only
  // by initialize() (under call_once, before any collector) and by the thread
  // that holds g_running, so it needs no lock.
  bool attached = false;
  bool clock_callback = false;    // CUPTI reports times on now_ns() itself
  std::int64_t clock_offset = 0;  // otherwise added to CUPTI times
  std::vector<Activity> records;
  std::unordered_map<std::uint32_t, std::uint64_t> external;  // correlation -> external id
  std::unordered_map<std::uint32_t, std::int64_t> threads;    // CUPTI thread id -> gettid
  std::uint64_t dropped = 0;
  // CUDA graph nodes and the ranges they were created in, from the resource
  // callbacks of the running collector's subscription.
  GraphCaptures graphs;
  CUpti_SubscriberHandle subscriber = nullptr;
};

Global& global() {
  static Global* g = new Global;
  return *g;
}

std::atomic<bool> g_running{false};
// The recorded ranges open on this thread (external ids, outermost first),
// as the range hooks see them: what a graph node created here belongs to.
thread_local std::vector<std::uint64_t> t_open;
thread_local unsigned t_open_attachment = 0;
// Bumped by every detach: a pop owed to an earlier attachment must not call
// CUPTI (any CUPTI call would load it again).
std::atomic<unsigned> g_attachment{0};

const CUpti_ActivityKind kDeviceKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                           CUPTI_ACTIVITY_KIND_MEMSET};
const CUpti_ActivityKind kHostKinds[] = {CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER,
                                         CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION};

std::string cupti_message(CUptiResult r) {
  const char* s = nullptr;
  cuptiGetResultString(r, &s);
  return s ? s : "CUPTI error " + std::to_string(static_cast<int>(r));
}

std::uint64_t CUPTIAPI clock_now() { return static_cast<std::uint64_t>(now_ns()); }

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records) {
  *buffer = static_cast<std::uint8_t*>(std::aligned_alloc(ACTIVITY_RECORD_ALIGNMENT, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;  // a zero size makes CUPTI drop (and count) records
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext context, std::uint32_t stream_id, std::uint8_t* buffer, std::size_t,
                               std::size_t valid) {
  Global& g = global();
  std::int64_t offset = 0;
  {
    std::lock_guard lock(g.mutex);
    offset = g.clock_offset;
  }
  std::vector<Activity> parsed;
  std::vector<std::pair<std::uint32_t, std::uint64_t>> external;
  CUpti_Activity* record = nullptr;
  while (valid > 0 && cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    translate_record(record, offset, parsed, external);
  }
  std::size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(context, stream_id, &dropped);
  std::free(buffer);

  std::lock_guard lock(g.mutex);
  g.dropped += dropped;
  for (auto& [corr, id] : external) g.external[corr] = id;
  g.records.insert(g.records.end(), std::make_move_iterator(parsed.begin()), std::make_move_iterator(parsed.end()));
}

// CUPTI's resource callbacks for CUDA graphs, on the thread that builds the
// graph (stream capture, an explicit add, cudaGraphInstantiate): which
// ranges were open when each node was created, and each clone's original.
// Only CUPTI calls here.
void CUPTIAPI on_graph_event(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* data) {
  if (domain != CUPTI_CB_DOMAIN_RESOURCE || !data) return;
  const auto* graph =
      static_cast<const CUpti_GraphData*>(static_cast<const CUpti_ResourceData*>(data)->resourceDescriptor);
  if (!graph) return;
  Global& g = global();
  switch (cbid) {
    case CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED: {
      std::uint64_t node = 0;
      if (!graph->node || cuptiGetGraphNodeId(graph->node, &node) != CUPTI_SUCCESS) return;
      std::lock_guard lock(g.mutex);
      g.graphs.node_created(node, t_open);
      break;
    }
    case CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED: {
      std::uint64_t original = 0;
      std::uint64_t clone = 0;
      if (!graph->node || !graph->originalNode ||
          cuptiGetGraphNodeId(graph->originalNode, &original) != CUPTI_SUCCESS ||
          cuptiGetGraphNodeId(graph->node, &clone) != CUPTI_SUCCESS)
        return;
      std::lock_guard lock(g.mutex);
      g.graphs.node_cloned(original, clone);
      break;
    }
    default:
      break;
  }
}

// Subscribes to the graph callbacks; returns why not (another subscriber:
// CUPTI allows one) or an empty string.
std::string subscribe_graphs() {
  Global& g = global();
  CUpti_SubscriberHandle subscriber = nullptr;
  if (const CUptiResult r = cuptiSubscribe(&subscriber, on_graph_event, nullptr); r != CUPTI_SUCCESS) {
    return "cuptiSubscribe failed: " + cupti_message(r);
  }
  for (const CUpti_CallbackId cbid : {CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED, CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED}) {
    if (const CUptiResult r = cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RESOURCE, cbid); r != CUPTI_SUCCESS) {
      cuptiUnsubscribe(subscriber);
      return "cuptiEnableCallback(resource " + std::to_string(cbid) + ") failed: " + cupti_message(r);
    }
  }
  g.subscriber = subscriber;
  return {};
}

void unsubscribe_graphs() {
  Global& g = global();
  if (!g.subscriber) return;
  cuptiUnsubscribe(g.subscriber);
  g.subscriber = nullptr;
}

// Registers the buffer callbacks and the shared clock: once per attachment
// (detach() undoes both). Returns the reason when CUPTI refuses.
std::string attach() {
  Global& g = global();
  if (g.attached) return {};
  if (const CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed); r != CUPTI_SUCCESS) {
    return "cuptiActivityRegisterCallbacks failed: " + cupti_message(r);
  }
  // Must precede the first enable; without it, start() measures an offset.
  g.clock_callback = cuptiActivityRegisterTimestampCallback(clock_now) == CUPTI_SUCCESS;
  g.attached = true;
  return {};
}

// Takes CUPTI out of the process once a collection has been flushed, so that
// what runs after a profile (the unprofiled calls, the user's own work) pays
// nothing for it: on an H200, a cuDNN call cost 9.8-13.3 us with CUPTI loaded
// but idle and 5.9-6.7 us detached (docs/perf/gpu-h200.md). CUPTI's condition
// for a detach outside a callback (the device synchronized, every buffer
// flushed) is the caller's to meet. The next start() attaches again.
// ATTNPROF_CUPTI_STAY_ATTACHED=1 keeps it loaded (to measure the difference).
// Returns a note when CUPTI refused to go.
std::string detach() {
  Global& g = global();
  if (!g.attached) return {};
  if (const char* stay = std::getenv("ATTNPROF_CUPTI_STAY_ATTACHED"); stay && *stay && std::string(stay) != "0")
    return {};
  if (const CUptiResult r = cuptiFinalize(); r != CUPTI_SUCCESS) {
    return "cuptiFinalize failed, CUPTI stays loaded: " + cupti_message(r);
  }
  g.attached = false;
  g_attachment.fetch_add(1, std::memory_order_release);
  return {};
}

void initialize() {
  Global& g = global();
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
    g.init_error = std::string("no CUDA device: ") + (e != cudaSuccess ? cudaGetErrorString(e) : "device count is 0");
    return;
  }
  if (std::string reason = attach(); !reason.empty()) {
    g.init_error = std::move(reason);
    return;
  }
  // Another profiler (Nsight Systems, a second CUPTI client) shows up here.
  if (const CUptiResult r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL); r != CUPTI_SUCCESS) {
    // Not detached: cuptiFinalize would take the other client's CUPTI away too.
    g.init_error = "cuptiActivityEnable failed: " + cupti_message(r);
    return;
  }
  cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
}

}  // namespace

std::string probe() {
  Global& g = global();
  std::call_once(g.init_once, initialize);
  return g.init_error;
}

void register_current_thread() {
  thread_local bool registered = false;
  if (registered) return;
  registered = true;
  Global& g = global();
  std::lock_guard lock(g.mutex);
  g.threads[static_cast<std::uint32_t>(pthread_self())] = static_cast<std::int64_t>(::syscall(SYS_gettid));
}

namespace {
thread_local int t_external_depth = 0;            // pushes this thread owes CUPTI a pop for
thread_local unsigned t_external_attachment = 0;  // the attachment they were made in
}  // namespace

void CuptiCollector::range_begin(std::string_view, std::uint64_t id) {
  if (!g_running.load(std::memory_order_acquire)) return;
  register_current_thread();
  const unsigned attachment = g_attachment.load(std::memory_order_acquire);
  if (t_open_attachment != attachment) t_open.clear();  // left by ranges of an earlier collection
  t_open_attachment = attachment;
  t_open.push_back(id);
  if (t_external_depth > 0 && t_external_attachment != attachment) t_external_depth = 0;  // owed to a detached CUPTI
  if (cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, id) == CUPTI_SUCCESS) {
    t_external_attachment = attachment;
    ++t_external_depth;
  }
}

void CuptiCollector::range_end(std::uint64_t id) {
  if (!t_open.empty() && t_open.back() == id) t_open.pop_back();
  if (t_external_depth == 0) return;
  --t_external_depth;
  // A range opened before the collector stopped and closed after: CUPTI has
  // since been detached and dropped its stack; calling it would load it again.
  if (t_external_attachment != g_attachment.load(std::memory_order_acquire)) return;
  std::uint64_t last = 0;
  cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &last);
}

bool attached() { return global().attached; }

CuptiCollector::~CuptiCollector() {
  if (running_) {
    try {
      stop();
    } catch (...) {  // a destructor must not throw
    }
  }
}

void CuptiCollector::start() {
  if (running_) return;
  if (std::string reason = probe(); !reason.empty()) throw Error(ErrorKind::Device, reason);
  if (g_running.exchange(true)) throw Error(ErrorKind::Device, "another CUPTI collector is already running");

  Global& g = global();
  try {
    int count = 0;
    if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
      throw Error(ErrorKind::Device, std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(e));
    }
    devices_.clear();
    for (int d = 0; d < count; ++d) devices_.push_back(query_device_properties(d));
    int current = 0;
    cudaGetDevice(&current);
    device_ = devices_.at(static_cast<std::size_t>(current));
  } catch (...) {
    g_running = false;
    throw;
  }
  if (std::string reason = attach(); !reason.empty()) {
    g_running = false;
    throw Error(ErrorKind::Device, reason);
  }
  register_current_thread();
  {
    std::lock_guard lock(g.mutex);
    g.records.clear();
    g.external.clear();
    g.dropped = 0;
    g.graphs.clear();
    if (!g.clock_callback) {
      std::uint64_t cupti_now = 0;
      cuptiGetTimestamp(&cupti_now);
      g.clock_offset = now_ns() - static_cast<std::int64_t>(cupti_now);
    }
  }
  note_.clear();
  if (!g.clock_callback) note_ = "CUPTI timestamp callback unavailable: GPU times aligned by a measured offset";
  cuptiActivityEnableLatencyTimestamps(1);  // fills KernelInfo::queued_ns; optional

  std::vector<CUpti_ActivityKind> enabled;
  auto enable = [&](CUpti_ActivityKind kind) {
    if (const CUptiResult r = cuptiActivityEnable(kind); r != CUPTI_SUCCESS) {
      for (auto k : enabled) cuptiActivityDisable(k);
      g_running = false;
      throw Error(ErrorKind::Device, "cuptiActivityEnable(kind " + std::to_string(static_cast<int>(kind)) +
                                         ") failed: " + cupti_message(r));
    }
    enabled.push_back(kind);
  };
  for (auto kind : kDeviceKinds) enable(kind);
  for (auto kind : kHostKinds) enable(kind);
  // Synchronization records are a nicety (the cuda_sync lane); go on without them.
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION);
  // So are graph replays tied to their captures: without the subscription
  // they stay on their launch, as in PyTorch's traces.
  if (std::string refused = subscribe_graphs(); !refused.empty()) {
    add_note("CUDA graph replays not tied to their captured ranges (" + refused + ")");
  }
  running_ = true;
}

void CuptiCollector::stop() {
  if (!running_) return;
  running_ = false;
  // Host-side kinds off first, so the synchronize below stays out of the trace.
  cuptiActivityDisable(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION);
  for (auto kind : kHostKinds) cuptiActivityDisable(kind);
  // Device records complete only when their work has finished.
  const cudaError_t sync = cudaDeviceSynchronize();
  const CUptiResult flushed = cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  for (auto kind : kDeviceKinds) cuptiActivityDisable(kind);
  unsubscribe_graphs();  // before a detach; the captures stay for rewrite()

  Global& g = global();
  std::vector<Activity> raw;
  std::uint64_t dropped = 0;
  {
    std::lock_guard lock(g.mutex);
    raw.swap(g.records);
    dropped = g.dropped;
  }
  // g_running is released last: until then no other collector may attach.
  struct Release {
    ~Release() { g_running = false; }
  } release;
  if (sync != cudaSuccess) add_note(std::string("cudaDeviceSynchronize at stop failed: ") + cudaGetErrorString(sync));
  if (flushed != CUPTI_SUCCESS) add_note("cuptiActivityFlushAll failed: " + cupti_message(flushed));
  if (dropped) add_note("CUPTI dropped " + std::to_string(dropped) + " activity records (buffers full)");
  finish(raw);  // names come from CUPTI: before the detach
  if (sync != cudaSuccess || flushed != CUPTI_SUCCESS) {
    add_note("CUPTI left attached (a detach needs a synchronized device and flushed buffers)");
  } else if (std::string refused = detach(); !refused.empty()) {
    add_note(refused);
  }
  activities_.insert(activities_.end(), std::make_move_iterator(raw.begin()), std::make_move_iterator(raw.end()));
}

// Names, thread ids, external ids and occupancy, on the caller's thread.
void CuptiCollector::finish(std::vector<Activity>& raw) {
  Global& g = global();
  std::unordered_map<std::uint32_t, std::uint64_t> external;
  std::unordered_map<std::uint32_t, std::int64_t> threads;
  {
    std::lock_guard lock(g.mutex);
    external.swap(g.external);
    threads = g.threads;
  }
  std::unordered_map<std::uint64_t, std::string> api_names;  // (type << 32 | cbid) -> name
  std::unordered_map<std::string, std::string> kernel_names;
  std::unordered_map<std::uint64_t, std::int64_t> tid_of_correlation;
  std::unordered_map<std::int64_t, int> device_of_context;
  const std::int64_t pid = ::getpid();

  for (Activity& a : raw) {
    if (a.type == ActivityType::CudaRuntime || a.type == ActivityType::CudaDriver) {
      const std::uint64_t key = (static_cast<std::uint64_t>(a.type) << 32) | a.cbid;
      auto it = api_names.find(key);
      if (it == api_names.end()) it = api_names.emplace(key, api_name(a.type, a.cbid)).first;
      a.name = it->second;
      // CUPTI's thread id is pthread_self's low 32 bits (as Kineto reads it);
      // the CPU side records gettid, so map registered threads across.
      const auto t = threads.find(static_cast<std::uint32_t>(a.tid));
      if (t != threads.end()) a.tid = t->second;
      a.pid = pid;
      tid_of_correlation[a.correlation] = a.tid;
    } else if (a.on_device()) {
      device_of_context[a.context] = a.device;
      a.pid = a.device;  // GPU lanes: pid the device, tid the stream
      a.tid = a.stream;
    }
    if (a.type == ActivityType::Kernel && a.kernel) {
      auto it = kernel_names.find(a.name);
      if (it == kernel_names.end()) it = kernel_names.emplace(a.name, demangle(a.name)).first;
      a.name = it->second;
      const auto d = static_cast<std::size_t>(a.device);
      if (d < devices_.size()) fill_occupancy(*a.kernel, devices_[d]);
    }
    if (const auto e = external.find(static_cast<std::uint32_t>(a.correlation)); e != external.end()) {
      a.external_id = e->second;
    }
  }
  // Sync records name neither thread nor device: borrow them from their call.
  for (Activity& a : raw) {
    if (a.type != ActivityType::CudaSync) continue;
    a.pid = pid;
    if (const auto t = tid_of_correlation.find(a.correlation); t != tid_of_correlation.end()) a.tid = t->second;
    if (const auto d = device_of_context.find(a.context); d != device_of_context.end()) a.device = d->second;
  }
}

void CuptiCollector::flush(std::vector<Activity>& out) {
  if (!running_) return;
  // Every record of the work so far: the device finished, the buffers
  // handed over whole. What a later record needs (an external id, a
  // launch) comes after this point too, so nothing is kept back.
  const cudaError_t sync = cudaDeviceSynchronize();
  const CUptiResult flushed = cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  if (sync != cudaSuccess)
    add_note(std::string("cudaDeviceSynchronize at a flush failed: ") + cudaGetErrorString(sync));
  if (flushed != CUPTI_SUCCESS) add_note("cuptiActivityFlushAll failed: " + cupti_message(flushed));
  Global& g = global();
  std::vector<Activity> raw;
  {
    std::lock_guard lock(g.mutex);
    raw.swap(g.records);
  }
  finish(raw);
  out.insert(out.end(), std::make_move_iterator(raw.begin()), std::make_move_iterator(raw.end()));
}

void CuptiCollector::rewrite(Trace& trace) {
  Global& g = global();
  std::lock_guard lock(g.mutex);
  g.graphs.attribute(trace);
}

void CuptiCollector::drain(std::vector<Activity>& out) {
  out.insert(out.end(), std::make_move_iterator(activities_.begin()), std::make_move_iterator(activities_.end()));
  activities_.clear();
}

}  // namespace attnprof::cupti
