// One pass over a trace that answers the questions the metrics and rules ask,
// each in O(1) or O(log n): which call launched a device activity, which CPU
// op that call ran inside, which forward and ProfilerStep an event belongs
// to, and the events' names normalised (analysis/normalize.h). Built once per
// trace; the rules never scan the trace to relate two events.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "attnprof/activity.h"
#include "attnprof/findings.h"

namespace attnprof::analysis {

// The name of the range the runner opens around each call: the pass's name
// (pass_name: "forward", "backward" or "train").
inline constexpr std::string_view kForwardRange = "forward";
bool is_call_range(std::string_view name);
// PyTorch's profiler (and ours) names each step's range "ProfilerStep#N".
inline constexpr std::string_view kProfilerStepPrefix = "ProfilerStep#";

// An index into Trace::activities; kNone where there is no such event.
using EventIndex = std::int32_t;
inline constexpr EventIndex kNone = -1;

class TraceIndex {
 public:
  // Keeps a reference to `trace`, which must outlive the index and not change.
  explicit TraceIndex(const Trace& trace);

  const Trace& trace() const { return trace_; }
  const Activity& at(EventIndex i) const { return trace_.activities[static_cast<std::size_t>(i)]; }

  // Normalised names: CPU ops as normalize_op spells them, other events as recorded.
  std::string_view op(EventIndex i) const { return names_[name_id_[static_cast<std::size_t>(i)]]; }
  std::string_view dtypes(EventIndex i) const { return dtypes_[dtype_id_[static_cast<std::size_t>(i)]]; }

  // Nesting of host ranges (CPU ops, annotations, runtime and driver calls) on
  // one thread: the innermost range that encloses event i, or kNone.
  EventIndex parent(EventIndex i) const { return parent_[static_cast<std::size_t>(i)]; }
  // The innermost and the outermost CPU op enclosing host range i (not i itself).
  EventIndex enclosing_op(EventIndex i, bool outermost = false) const {
    return (outermost ? outer_op_ : inner_op_)[static_cast<std::size_t>(i)];
  }

  // The first user annotation (in start order) whose innermost enclosing op is
  // op: a label a library opens inside its own op (attnprof's custom ops,
  // whose implementation runs under the op even in a compiled graph); kNone.
  EventIndex annotation_inside(EventIndex op) const {
    const auto it = annotation_inside_.find(op);
    return it == annotation_inside_.end() ? kNone : it->second;
  }

  // The op a CPU copy_ was made for: its parent op, above any clone (PyTorch's
  // out-of-place ops copy through clone); kNone when it was called from no op.
  EventIndex copy_owner(EventIndex copy) const;
  // A copy_ made by a dtype conversion ("to"): the upcast rule's business, not a hidden copy.
  bool is_conversion_copy(EventIndex copy) const;

  // The runtime or driver call that launched device activity i (by correlation id).
  EventIndex launch_call(EventIndex device_activity) const;
  // The CPU op enclosing that launch: the innermost, or the outermost (the op
  // a forward called directly).
  EventIndex launching_op(EventIndex device_activity, bool outermost = false) const;

  // The calls the per-call figures divide by, in time order: the "forward"
  // ranges the runner opens when there are any; else, in a trace from
  // elsewhere (torch.profiler's), its "ProfilerStep#N" ranges; else the whole
  // trace as one call. forwards()[f] is the range's event, kNone for the
  // whole trace; call_start_ns and call_end_ns hold the call's span.
  enum class CallScope : std::uint8_t { Forward, ProfilerStep, WholeTrace };
  CallScope call_scope() const { return scope_; }
  std::span<const EventIndex> forwards() const { return forwards_; }
  std::int64_t call_start_ns(std::size_t f) const { return call_spans_[f].first; }
  std::int64_t call_end_ns(std::size_t f) const { return call_spans_[f].second; }
  // The top-level CPU ops each call made (those inside no other op); the
  // device activities each launched.
  std::span<const EventIndex> forward_ops(std::size_t f) const { return forward_ops_[f]; }
  std::span<const EventIndex> forward_device(std::size_t f) const { return forward_device_[f]; }
  // The call whose span holds time `ns`, or -1.
  int forward_at(std::int64_t ns) const { return span_at(call_spans_, ns); }
  // The call host event i (or, for a device activity, its launch) ran inside,
  // or -1. Outside forward ranges: by time, for events on other threads.
  int forward_of(EventIndex i) const;

  // "ProfilerStep#N" ranges in time order, and the one holding time `ns` (-1 if none).
  std::span<const EventIndex> profiler_steps() const { return steps_; }
  int step_at(std::int64_t ns) const { return span_at(step_spans_, ns); }

  // Every kernel, memcpy and memset, in trace order.
  std::span<const EventIndex> device_activities() const { return device_; }
  // CPU ops by normalised name, in trace order.
  std::span<const EventIndex> ops_named(std::string_view normalized) const;

  // Allocation events in time order, and the bytes allocated (positive
  // records only) by those starting in [from_ns, to_ns].
  std::span<const EventIndex> allocations() const { return allocations_; }
  std::span<const EventIndex> allocations_between(std::int64_t from_ns, std::int64_t to_ns) const;
  double allocated_bytes_between(std::int64_t from_ns, std::int64_t to_ns) const;

  // The time every EventRef is relative to: the trace's base, or its earliest
  // event when the base is unset or later (as the Chrome trace writer does).
  std::int64_t base_ns() const { return base_ns_; }
  EventRef ref(EventIndex i) const;

 private:
  using Span = std::pair<std::int64_t, std::int64_t>;
  static int span_at(const std::vector<Span>& spans, std::int64_t ns);
  std::pair<std::size_t, std::size_t> allocation_span(std::int64_t from_ns, std::int64_t to_ns) const;

  const Trace& trace_;
  std::int64_t base_ns_ = 0;
  std::vector<std::string> names_, dtypes_;        // distinct normalised spellings
  std::vector<std::uint32_t> name_id_, dtype_id_;  // per event
  std::unordered_map<std::string, std::uint32_t> name_ids_;
  std::vector<EventIndex> parent_, inner_op_, outer_op_, forward_of_;
  std::unordered_map<std::uint64_t, EventIndex> launch_by_correlation_;
  std::unordered_map<EventIndex, EventIndex> annotation_inside_;
  CallScope scope_ = CallScope::Forward;
  std::vector<EventIndex> forwards_, steps_, device_, allocations_;
  std::vector<Span> call_spans_, step_spans_;
  std::vector<std::vector<EventIndex>> forward_ops_, forward_device_;
  std::vector<std::int64_t> allocation_start_;
  std::vector<double> allocated_prefix_;              // positive bytes of allocations_[0, k)
  std::vector<std::vector<EventIndex>> ops_by_name_;  // CPU ops, by name id
};

}  // namespace attnprof::analysis
