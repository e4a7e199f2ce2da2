// CUPTI activity records -> attnprof Activities: the only place that reads
// CUPTI's record structs, so a new record version changes this file alone;
// and the names the collector finishes them with (API calls, kernels).
#include "profiler/cupti/cupti_records.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <string>

namespace attnprof::cupti {
namespace {

std::string memory_kind(std::uint32_t k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE:
      return "Pageable";
    case CUPTI_ACTIVITY_MEMORY_KIND_PINNED:
      return "Pinned";
    case CUPTI_ACTIVITY_MEMORY_KIND_DEVICE:
      return "Device";
    case CUPTI_ACTIVITY_MEMORY_KIND_ARRAY:
      return "Array";
    case CUPTI_ACTIVITY_MEMORY_KIND_MANAGED:
      return "Managed";
    case CUPTI_ACTIVITY_MEMORY_KIND_DEVICE_STATIC:
      return "Device Static";
    case CUPTI_ACTIVITY_MEMORY_KIND_MANAGED_STATIC:
      return "Managed Static";
    default:
      return "Unknown";
  }
}

std::string copy_kind(std::uint32_t k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
      return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
      return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOA:
      return "HtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOH:
      return "AtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOA:
      return "AtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOD:
      return "AtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOA:
      return "DtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
      return "DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH:
      return "HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP:
      return "PtoP";
    default:
      return "Unknown";
  }
}

// Kineto's names, which trace readers group on.
const char* sync_name(CUpti_ActivitySynchronizationType t) {
  switch (t) {
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE:
      return "Event Sync";
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT:
      return "Stream Wait Event";
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE:
      return "Stream Sync";
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE:
      return "Context Sync";
    default:
      return "Unknown Sync";
  }
}

std::int64_t stream_of(std::uint32_t id) { return id == CUPTI_INVALID_STREAM_ID ? -1 : id; }

// Copies one record into an Activity (raw names and thread ids: see finish()).
// Runs on CUPTI's thread, so it calls nothing in CUDA.
}  // namespace

void translate_record(const CUpti_Activity* record, std::int64_t offset, std::vector<Activity>& out,
                      std::vector<std::pair<std::uint32_t, std::uint64_t>>& external) {
  Activity a;
  switch (record->kind) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
    case CUPTI_ACTIVITY_KIND_KERNEL: {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      a.type = ActivityType::Kernel;
      a.name = k->name ? k->name : "?";
      a.start_ns = static_cast<std::int64_t>(k->start) + offset;
      a.dur_ns = static_cast<std::int64_t>(k->end - k->start);
      a.device = static_cast<int>(k->deviceId);
      a.context = k->contextId;
      a.stream = stream_of(k->streamId);
      a.correlation = k->correlationId;
      a.graph_id = k->graphId;
      a.graph_node_id = k->graphNodeId;
      KernelInfo info;
      info.grid = {k->gridX, k->gridY, k->gridZ};
      info.block = {k->blockX, k->blockY, k->blockZ};
      info.registers_per_thread = k->registersPerThread;
      info.static_shared_bytes = k->staticSharedMemory;
      info.dynamic_shared_bytes = k->dynamicSharedMemory;
      // queued is only filled with latency timestamps on; a value after the
      // start would be a clock mix-up, not a queue.
      if (k->queued != CUPTI_TIMESTAMP_UNKNOWN && k->queued <= k->start) {
        info.queued_ns = static_cast<double>(k->start - k->queued);
      }
      a.kernel = info;
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      a.type = ActivityType::Memcpy;
      a.name =
          "Memcpy " + copy_kind(m->copyKind) + " (" + memory_kind(m->srcKind) + " -> " + memory_kind(m->dstKind) + ")";
      a.start_ns = static_cast<std::int64_t>(m->start) + offset;
      a.dur_ns = static_cast<std::int64_t>(m->end - m->start);
      a.device = static_cast<int>(m->deviceId);
      a.context = m->contextId;
      a.stream = stream_of(m->streamId);
      // A runtime-launched copy carries the id of its cudaMemcpy* record
      // separately; that is the call the flow arrow should start from.
      a.correlation = m->runtimeCorrelationId ? m->runtimeCorrelationId : m->correlationId;
      a.transfer = TransferInfo{static_cast<std::int64_t>(m->bytes), copy_kind(m->copyKind)};
      a.graph_id = m->graphId;
      a.graph_node_id = m->graphNodeId;
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
      a.type = ActivityType::Memset;
      a.name = "Memset (" + memory_kind(m->memoryKind) + ")";
      a.start_ns = static_cast<std::int64_t>(m->start) + offset;
      a.dur_ns = static_cast<std::int64_t>(m->end - m->start);
      a.device = static_cast<int>(m->deviceId);
      a.context = m->contextId;
      a.stream = stream_of(m->streamId);
      a.correlation = m->correlationId;
      a.transfer = TransferInfo{static_cast<std::int64_t>(m->bytes), {}};
      a.graph_id = m->graphId;
      a.graph_node_id = m->graphNodeId;
      break;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: {
      const auto* api = reinterpret_cast<const CUpti_ActivityAPI*>(record);
      a.type = record->kind == CUPTI_ACTIVITY_KIND_RUNTIME ? ActivityType::CudaRuntime : ActivityType::CudaDriver;
      a.cbid = api->cbid;
      a.start_ns = static_cast<std::int64_t>(api->start) + offset;
      a.dur_ns = static_cast<std::int64_t>(api->end - api->start);
      a.pid = api->processId;
      a.tid = api->threadId;  // pthread_self's low bits; mapped in finish()
      a.correlation = api->correlationId;
      break;
    }
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: {
      const auto* s = reinterpret_cast<const CUpti_ActivitySynchronization2*>(record);
      a.type = ActivityType::CudaSync;
      a.name = sync_name(s->type);
      a.start_ns = static_cast<std::int64_t>(s->start) + offset;
      a.dur_ns = static_cast<std::int64_t>(s->end - s->start);
      a.context = s->contextId;
      a.stream = stream_of(s->streamId);
      a.correlation = s->correlationId;
      break;
    }
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
      const auto* e = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(record);
      external.emplace_back(e->correlationId, e->externalId);
      return;
    }
    default:
      return;  // overhead and other kinds we did not ask for
  }
  if (a.dur_ns < 0) return;  // an incomplete record from a forced flush
  out.push_back(std::move(a));
}

// "cudaLaunchKernel_v7000" -> "cudaLaunchKernel", "cuMemcpyDtoDAsync_v2_ptsz" -> "cuMemcpyDtoDAsync".
namespace {

std::string strip_version(std::string name) {
  for (bool changed = true; changed;) {
    changed = false;
    for (const char* suffix : {"_ptsz", "_ptds"}) {
      if (name.size() > 5 && name.ends_with(suffix)) {
        name.resize(name.size() - 5);
        changed = true;
      }
    }
    const auto v = name.rfind("_v");
    if (v != std::string::npos && v + 2 < name.size() &&
        std::all_of(name.begin() + static_cast<std::ptrdiff_t>(v) + 2, name.end(),
                    [](char c) { return c >= '0' && c <= '9'; })) {
      name.resize(v);
      changed = true;
    }
  }
  return name;
}

}  // namespace

std::string api_name(ActivityType type, std::uint32_t cbid) {
  const char* name = nullptr;
  const auto domain = type == ActivityType::CudaRuntime ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API;
  if (cuptiGetCallbackName(domain, cbid, &name) != CUPTI_SUCCESS || !name) {
    return (type == ActivityType::CudaRuntime ? "cuda runtime cbid " : "cuda driver cbid ") + std::to_string(cbid);
  }
  return strip_version(name);
}

std::string demangle(const std::string& name) {
  int status = 0;
  char* out = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status);
  std::string result = status == 0 && out ? out : name;
  std::free(out);
  return result;
}

}  // namespace attnprof::cupti
