// Translation of raw CUPTI activity records (see cupti_records.cpp).
#pragma once

#include <cupti.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "attnprof/activity.h"

namespace attnprof::cupti {

// Appends the Activity for one record to `out` (kernels, memcpys, memsets,
// runtime and driver calls, synchronizations), or its (correlation, external
// id) pair to `external`; other kinds are skipped. Times get `offset_ns`
// added. Names stay mangled, API names empty and thread ids CUPTI's: the
// collector finishes those on the caller's thread. Calls nothing in CUDA, so
// it is safe inside CUPTI's buffer callback.
void translate_record(const CUpti_Activity* record, std::int64_t offset_ns, std::vector<Activity>& out,
                      std::vector<std::pair<std::uint32_t, std::uint64_t>>& external);

// What the collector finishes on the caller's thread (it calls CUPTI and the
// demangler, so never inside the buffer callback): a runtime or driver call's
// name from its callback id, without its version and per-thread-stream
// suffixes ("cudaLaunchKernel_v7000" -> "cudaLaunchKernel"), and a kernel's
// demangled name (the mangled one where it does not demangle).
std::string api_name(ActivityType type, std::uint32_t cbid);
std::string demangle(const std::string& name);

}  // namespace attnprof::cupti
