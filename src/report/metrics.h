// Per-forward figures read off a recorded trace.
#pragma once

#include <vector>

#include "attnprof/activity.h"
#include "attnprof/problem.h"
#include "attnprof/runner.h"

namespace attnprof::report {

// The name of the range the runner opens around each forward call.
inline constexpr const char* kForwardRange = "forward";

// Direct CPU-op children of each "forward" range, in order.
std::vector<std::vector<const Activity*>> forward_ops(const Trace& t);

// Device activities (kernels, memcpys, memsets) launched from inside a forward.
std::vector<const Activity*> device_activities(const Trace& t);

// The CPU op enclosing the launch of a device activity (by correlation): the
// innermost one, or the outermost (the op a forward called directly).
const Activity* launching_op(const Trace& t, const Activity& device_activity, bool outermost = false);
// The runtime or driver call that launched a device activity.
const Activity* launch_call(const Trace& t, const Activity& device_activity);

Metrics measure(const Trace& t, const Problem& p, double ceiling_tflops);

}  // namespace attnprof::report
