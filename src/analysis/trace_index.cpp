#include "analysis/trace_index.h"

#include <algorithm>
#include <tuple>

#include "analysis/normalize.h"
#include "attnprof/problem.h"

namespace attnprof::analysis {

bool is_call_range(std::string_view name) { return parse_pass(name).has_value(); }
namespace {

bool is_host_range(ActivityType t) {
  return t == ActivityType::CpuOp || t == ActivityType::UserAnnotation || t == ActivityType::CudaRuntime ||
         t == ActivityType::CudaDriver || t == ActivityType::CudaSync;
}

bool is_device_work(ActivityType t) {
  return t == ActivityType::Kernel || t == ActivityType::Memcpy || t == ActivityType::Memset;
}

bool is_launch(ActivityType t) { return t == ActivityType::CudaRuntime || t == ActivityType::CudaDriver; }

std::uint32_t intern(std::string s, std::vector<std::string>& table,
                     std::unordered_map<std::string, std::uint32_t>& ids) {
  auto [it, added] = ids.try_emplace(std::move(s), static_cast<std::uint32_t>(table.size()));
  if (added) table.push_back(it->first);
  return it->second;
}

}  // namespace

TraceIndex::TraceIndex(const Trace& trace) : trace_(trace) {
  const auto& v = trace.activities;
  const auto n = static_cast<EventIndex>(v.size());
  auto type = [&](EventIndex i) { return v[static_cast<std::size_t>(i)].type; };

  std::int64_t earliest = trace.base_ns;
  for (const auto& a : v) earliest = std::min(earliest, a.start_ns);
  base_ns_ = v.empty() || (trace.base_ns > 0 && trace.base_ns <= earliest) ? trace.base_ns : earliest;

  // Names: each distinct recorded spelling normalised once.
  name_id_.resize(v.size());
  dtype_id_.resize(v.size());
  std::unordered_map<std::string, std::uint32_t> dtype_ids;
  intern(std::string(), dtypes_, dtype_ids);  // id 0: no dtypes
  std::unordered_map<std::string_view, std::uint32_t> cpu_names, other_names, raw_dtypes;
  for (EventIndex i = 0; i < n; ++i) {
    const Activity& a = v[static_cast<std::size_t>(i)];
    const bool cpu = a.type == ActivityType::CpuOp;
    auto& seen = cpu ? cpu_names : other_names;
    auto it = seen.find(a.name);
    if (it == seen.end()) it = seen.emplace(a.name, intern(normalize(a).op, names_, name_ids_)).first;
    name_id_[static_cast<std::size_t>(i)] = it->second;
    if (cpu && !a.input_dtypes.empty()) {
      auto d = raw_dtypes.find(a.input_dtypes);
      if (d == raw_dtypes.end())
        d = raw_dtypes.emplace(a.input_dtypes, intern(normalize(a).dtypes, dtypes_, dtype_ids)).first;
      dtype_id_[static_cast<std::size_t>(i)] = d->second;
    }
  }

  // Events by kind; forwards and steps in time order.
  ops_by_name_.resize(names_.size());
  for (EventIndex i = 0; i < n; ++i) {
    const Activity& a = v[static_cast<std::size_t>(i)];
    if (a.type == ActivityType::CpuOp) ops_by_name_[name_id_[static_cast<std::size_t>(i)]].push_back(i);
    if (is_device_work(a.type)) device_.push_back(i);
    if (is_launch(a.type)) launch_by_correlation_.try_emplace(a.correlation, i);  // the first call wins
    if (a.type == ActivityType::Allocation && a.allocation) allocations_.push_back(i);
    if (a.type == ActivityType::UserAnnotation && is_call_range(a.name)) forwards_.push_back(i);
    if (a.type == ActivityType::UserAnnotation && a.name.starts_with(kProfilerStepPrefix)) steps_.push_back(i);
  }
  auto by_start = [&](EventIndex x, EventIndex y) { return at(x).start_ns < at(y).start_ns; };
  std::stable_sort(forwards_.begin(), forwards_.end(), by_start);
  std::stable_sort(steps_.begin(), steps_.end(), by_start);
  std::stable_sort(allocations_.begin(), allocations_.end(), by_start);
  for (EventIndex s : steps_) step_spans_.emplace_back(at(s).start_ns, at(s).end_ns());
  if (forwards_.empty() && !steps_.empty()) {
    scope_ = CallScope::ProfilerStep;
    forwards_ = steps_;
  }
  for (EventIndex f : forwards_) call_spans_.emplace_back(at(f).start_ns, at(f).end_ns());
  if (forwards_.empty() && n > 0) {
    scope_ = CallScope::WholeTrace;
    forwards_.push_back(kNone);
    std::int64_t first = v.front().start_ns, last = v.front().end_ns();
    for (const auto& a : v) {
      first = std::min(first, a.start_ns);
      last = std::max(last, a.end_ns());
    }
    call_spans_.emplace_back(first, last);
  }

  // Nesting: host ranges per thread in start order (an enclosing range first
  // when two start together: the lower recorded depth, else the longer), each
  // popping the ranges that end before it does.
  parent_.assign(v.size(), kNone);
  inner_op_.assign(v.size(), kNone);
  outer_op_.assign(v.size(), kNone);
  forward_of_.assign(v.size(), -1);
  for (std::size_t f = 0; f < forwards_.size(); ++f) {
    if (forwards_[f] != kNone) forward_of_[static_cast<std::size_t>(forwards_[f])] = static_cast<EventIndex>(f);
  }
  std::vector<EventIndex> host;
  for (EventIndex i = 0; i < n; ++i) {
    if (is_host_range(type(i)) || type(i) == ActivityType::Allocation) host.push_back(i);
  }
  std::sort(host.begin(), host.end(), [&](EventIndex x, EventIndex y) {
    const Activity& a = at(x);
    const Activity& b = at(y);
    return std::tuple(a.start_ns, a.depth, -a.dur_ns, x) < std::tuple(b.start_ns, b.depth, -b.dur_ns, y);
  });
  std::unordered_map<std::int64_t, std::vector<EventIndex>> open;  // per thread
  for (EventIndex i : host) {
    const Activity& a = at(i);
    auto& stack = open[a.tid];
    while (!stack.empty() && at(stack.back()).end_ns() < a.end_ns()) stack.pop_back();
    const auto k = static_cast<std::size_t>(i);
    if (!stack.empty()) {
      const EventIndex p = stack.back();
      const auto pk = static_cast<std::size_t>(p);
      const bool p_op = type(p) == ActivityType::CpuOp;
      parent_[k] = p;
      inner_op_[k] = p_op ? p : inner_op_[pk];
      outer_op_[k] = outer_op_[pk] != kNone ? outer_op_[pk] : (p_op ? p : kNone);
      if (forward_of_[k] < 0) forward_of_[k] = forward_of_[pk];
      if (a.type == ActivityType::UserAnnotation && inner_op_[k] != kNone) annotation_inside_.emplace(inner_op_[k], i);
    }
    // A step or the whole trace holds what runs in its time on any thread
    // (the autograd engine's thread, a data loader's).
    if (forward_of_[k] < 0 && scope_ != CallScope::Forward) forward_of_[k] = forward_at(a.start_ns);
    if (a.type != ActivityType::Allocation) stack.push_back(i);
  }
  forward_ops_.resize(forwards_.size());
  for (EventIndex i : host) {
    const auto k = static_cast<std::size_t>(i);
    if (type(i) == ActivityType::CpuOp && outer_op_[k] == kNone && forward_of_[k] >= 0) {
      forward_ops_[static_cast<std::size_t>(forward_of_[k])].push_back(i);
    }
  }

  forward_device_.resize(forwards_.size());
  for (EventIndex d : device_) {
    const EventIndex call = launch_call(d);
    int f = call == kNone ? -1 : forward_of_[static_cast<std::size_t>(call)];
    if (call == kNone && scope_ != CallScope::Forward) f = forward_at(at(d).start_ns);
    forward_of_[static_cast<std::size_t>(d)] = f;
    if (f >= 0) forward_device_[static_cast<std::size_t>(f)].push_back(d);
  }

  allocation_start_.reserve(allocations_.size());
  allocated_prefix_.reserve(allocations_.size() + 1);
  allocated_prefix_.push_back(0);
  for (EventIndex i : allocations_) {
    const std::int64_t bytes = at(i).allocation->bytes;
    allocation_start_.push_back(at(i).start_ns);
    allocated_prefix_.push_back(allocated_prefix_.back() + (bytes > 0 ? static_cast<double>(bytes) : 0.0));
  }
}

EventIndex TraceIndex::launch_call(EventIndex device_activity) const {
  const auto it = launch_by_correlation_.find(at(device_activity).correlation);
  return it == launch_by_correlation_.end() ? kNone : it->second;
}

EventIndex TraceIndex::launching_op(EventIndex device_activity, bool outermost) const {
  const EventIndex call = launch_call(device_activity);
  return call == kNone ? kNone : enclosing_op(call, outermost);
}

EventIndex TraceIndex::copy_owner(EventIndex copy) const {
  EventIndex p = parent(copy);
  while (p != kNone && at(p).type == ActivityType::CpuOp && op(p) == "clone") p = parent(p);
  return p != kNone && at(p).type == ActivityType::CpuOp ? p : kNone;
}

bool TraceIndex::is_conversion_copy(EventIndex copy) const {
  const EventIndex owner = copy_owner(copy);
  return owner != kNone && op(owner) == "to";
}

int TraceIndex::forward_of(EventIndex i) const { return forward_of_[static_cast<std::size_t>(i)]; }

std::span<const EventIndex> TraceIndex::ops_named(std::string_view normalized) const {
  const auto it = name_ids_.find(std::string(normalized));
  if (it == name_ids_.end()) return {};
  return ops_by_name_[it->second];
}

int TraceIndex::span_at(const std::vector<Span>& spans, std::int64_t ns) {
  const auto it =
      std::upper_bound(spans.begin(), spans.end(), ns, [](std::int64_t t, const Span& r) { return t < r.first; });
  if (it == spans.begin()) return -1;
  return ns <= std::prev(it)->second ? static_cast<int>(std::prev(it) - spans.begin()) : -1;
}

std::pair<std::size_t, std::size_t> TraceIndex::allocation_span(std::int64_t from_ns, std::int64_t to_ns) const {
  const auto lo = std::lower_bound(allocation_start_.begin(), allocation_start_.end(), from_ns);
  const auto hi = std::upper_bound(lo, allocation_start_.end(), to_ns);
  return {static_cast<std::size_t>(lo - allocation_start_.begin()),
          static_cast<std::size_t>(hi - allocation_start_.begin())};
}

std::span<const EventIndex> TraceIndex::allocations_between(std::int64_t from_ns, std::int64_t to_ns) const {
  if (to_ns < from_ns) return {};
  const auto [lo, hi] = allocation_span(from_ns, to_ns);
  return std::span<const EventIndex>(allocations_).subspan(lo, hi - lo);
}

double TraceIndex::allocated_bytes_between(std::int64_t from_ns, std::int64_t to_ns) const {
  if (to_ns < from_ns) return 0;
  const auto [lo, hi] = allocation_span(from_ns, to_ns);
  return allocated_prefix_[hi] - allocated_prefix_[lo];
}

EventRef TraceIndex::ref(EventIndex i) const {
  const Activity& a = at(i);
  return EventRef{.index = i,
                  .name = a.name,
                  .category = activity_category(a.type),
                  .ts_us = static_cast<double>(a.start_ns - base_ns_) / 1e3,
                  .dur_us = static_cast<double>(a.dur_ns) / 1e3,
                  .correlation = a.correlation};
}

}  // namespace attnprof::analysis
