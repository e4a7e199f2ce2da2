// The Chrome trace reader. Two stages:
//   1. A byte scanner (Splitter, trace_splitter.h) walks the document a chunk
//      at a time and hands on each element of "traceEvents" and each top-level
//      value we read (deviceProperties, baseTimeNanoseconds, traceName), as text.
//   2. Each event's text is parsed with simdjson's On-Demand API (which also
//      validates UTF-8) into an Activity, reading only the fields the rules use.
// Where the text comes from (a file, gzip, memory) is trace_input.cpp's.
#include "attnprof/trace_reader.h"

#include <simdjson.h>

#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "analysis/format.h"
#include "analysis/trace_fields.h"
#include "analysis/trace_splitter.h"
#include "analysis/trace_stream.h"
#include "attnprof/error.h"
#include "attnprof/occupancy.h"
#include "profiler/trace_schema.h"

namespace attnprof {
namespace {

namespace od = simdjson::ondemand;
namespace sc = schema;
using namespace trace_reading;
using namespace trace_fields;

// Bounds that keep every sum and difference the rules make inside an int64.
constexpr std::int64_t kMaxBaseNs = 4'000'000'000'000'000'000;
constexpr std::int64_t kMaxTimeNs = 4'000'000'000'000'000'000;  // ts, and base + ts
constexpr std::int64_t kMaxDurNs = 1'000'000'000'000'000'000;
constexpr std::int64_t kMaxBytes = std::int64_t{1} << 50;
// Kineto's args of graph-launched device work (CuptiActivity.h's
// addGraphNodeTypedMetadata, CUDA 12 and later): a replay's graph and node.
constexpr std::string_view kGraphId = "graph id";
constexpr std::string_view kGraphNodeId = "graph node id";

// ---- Stage 2: events into Activities (their values: trace_fields.h) ----------------

class EventReader final : public Splitter::Sink {
 public:
  explicit EventReader(Trace& trace) : trace_(trace) {}

  void event(std::string& text, std::uint64_t index) override {
    index_ = index;
    const std::size_t len = text.size();
    text.reserve(len + simdjson::SIMDJSON_PADDING);
    od::document doc;
    if (auto e = parser_.iterate(simdjson::padded_string_view(text.data(), len, text.capacity())).get(doc)) bad(e);
    od::object obj;
    if (auto e = doc.get_object().get(obj)) {
      if (e == simdjson::INCORRECT_TYPE) refuse(prefix() + "not a JSON object");
      bad(e);
    }
    read_event(obj);
  }

  void top_level(std::string_view key, std::string& text) override {
    const std::size_t len = text.size();
    text.reserve(len + simdjson::SIMDJSON_PADDING);
    od::document doc;
    std::string what = "\"";  // built in steps: GCC 12 warns (-Wrestrict) on "\"" + std::string(key) here
    what.append(key).append("\": ");
    if (auto e = parser_.iterate(simdjson::padded_string_view(text.data(), len, text.capacity())).get(doc)) {
      refuse(what + json_error(e));
    }
    if (key == sc::kBaseTimeNanoseconds) {
      // A whole number written as one (1e3 is 1000, 1.5 is refused), the whole document.
      const std::optional<std::int64_t> base = integer(doc);
      if (!base || *base < 0 || *base > kMaxBaseNs) {
        refuse(what + "not a whole number of nanoseconds from 0 to 4e18");
      }
      base_ns_ = *base;
    } else if (key == sc::kTraceName || key == sc::kCollectorNote) {
      std::string_view s;
      if (doc.get_string().get(s) != simdjson::SUCCESS) refuse(what + "not a string");
      (key == sc::kTraceName ? trace_.name : trace_.collector_note) = std::string(s);
    } else if (key == sc::kDeviceProperties) {
      read_devices(doc, what, devices_);
    }
  }

  // Times from the base, every kernel's occupancy, the trace's device.
  void finish() {
    for (Activity& a : trace_.activities) {
      // Every start and end within +-5e18 ns keeps ends and differences of
      // any two times inside an int64.
      a.start_ns += base_ns_;
      if (a.start_ns < -kMaxTimeNs || a.start_ns > kMaxTimeNs) {
        refuse("an event's time (baseTimeNanoseconds + ts) is out of range: more than 4e18 ns from 0");
      }
    }
    trace_.base_ns = base_ns_;
    if (!devices_.empty()) {
      std::map<int, std::size_t> kernels_on;
      for (const Activity& a : trace_.activities) {
        if (a.type == ActivityType::Kernel) ++kernels_on[a.device];
      }
      int busiest = devices_.begin()->first;
      std::size_t most = 0;
      for (const auto& [dev, n] : kernels_on) {
        if (devices_.count(dev) && n > most) {
          most = n;
          busiest = dev;
        }
      }
      trace_.device = devices_.at(busiest);
      for (Activity& a : trace_.activities) {
        if (a.type != ActivityType::Kernel || !a.kernel) continue;
        const auto d = devices_.find(a.device);
        const DeviceProperties& props = d != devices_.end() ? d->second : *trace_.device;
        if (const auto occ = theoretical_occupancy(*a.kernel, props)) {
          a.kernel->blocks_per_sm = occ->blocks_per_sm;
          a.kernel->warps_per_sm = occ->warps_per_sm;
          a.kernel->occupancy_pct = occ->pct;
        }
      }
    }
  }

 private:
  std::string prefix() const { return "event " + std::to_string(index_) + ": "; }
  [[noreturn]] void bad(simdjson::error_code e) const { refuse(prefix() + json_error(e)); }
  [[noreturn]] void bad_field(std::string_view field, const std::string& why) const {
    refuse(prefix() + "\"" + std::string(field) + "\" " + why);
  }

  void read_event(od::object& obj) {
    std::string_view ph, cat, name;
    std::optional<std::int64_t> ts, dur;
    std::int64_t pid = 0, tid = 0;
    bool has_args = false;
    Activity a;
    // args can come before cat in the text: keep what they say, apply once the type is known.
    struct Args {
      std::optional<std::uint64_t> external_id, correlation, addr, graph_id, graph_node_id;
      std::optional<std::int64_t> device, stream, context, cbid, registers, shared, bytes;
      std::optional<std::int64_t> mem_bytes, total_alloc, total_reserved, device_type, device_id;
      std::optional<double> queued_us;
      std::array<int, 3> grid{1, 1, 1}, block{1, 1, 1};
      bool has_grid = false, has_block = false;
      std::string input_type, input_dims;
      std::vector<std::string> concrete;
    } args;
    for (auto field : obj) {
      std::string_view key;
      if (auto e = field.unescaped_key().get(key)) bad(e);
      od::value v;
      if (auto e = field.value().get(v)) bad(e);
      if (key == sc::event::kPh) {
        if (v.get_string().get(ph)) bad_field(key, "is not a string");
        ph = keep(ph, ph_);
      } else if (key == sc::event::kCat) {
        if (v.get_string().get(cat)) bad_field(key, "is not a string");
        cat = keep(cat, cat_);
      } else if (key == sc::event::kName) {
        if (v.get_string().get(name)) bad_field(key, "is not a string");
        a.name = std::string(name);
      } else if (key == sc::event::kTs || key == sc::event::kDur) {
        std::string_view raw;
        od::json_type t;
        if (v.type().get(t) || t != od::json_type::number) bad_field(key, "is not a number");
        raw = v.raw_json_token();
        const auto ns = us_to_ns(raw);
        if (!ns) bad_field(key, "is out of range");
        (key == sc::event::kTs ? ts : dur) = ns;
      } else if (key == sc::event::kPid) {
        pid = lane_id(v);
      } else if (key == sc::event::kTid) {
        tid = lane_id(v);
      } else if (key == sc::event::kArgs) {
        od::object ao;
        if (v.get_object().get(ao)) continue;  // args of another shape: nothing we read
        has_args = true;
        read_args(ao, args);
      }
    }
    if (ph.empty()) bad_field("ph", "is missing");
    const bool complete = ph == sc::ph::kComplete;
    const bool instant = ph == sc::ph::kInstant || ph == "I";
    std::optional<ActivityType> type;
    if (complete) {
      type = activity_type(cat);
    } else if (instant && a.name == sc::kMemoryName) {
      type = ActivityType::Allocation;
    }
    if (!type) return;  // metadata, flows, python functions, other tools' events
    if (!ts) bad_field("ts", "is missing");
    if (complete && !dur) bad_field("dur", "is missing");
    if (dur && *dur < 0) bad_field("dur", "is negative");
    if (*ts < -kMaxTimeNs || *ts > kMaxTimeNs) bad_field("ts", "is out of range (more than 4e18 ns from 0)");
    if (dur && *dur > kMaxDurNs) bad_field("dur", "is out of range (more than 1e18 ns, 31 years)");
    check_sizes(*type, args);
    a.type = *type;
    a.start_ns = *ts;
    a.dur_ns = complete ? *dur : 0;
    a.pid = pid;
    a.tid = tid;
    (void)has_args;
    a.external_id = args.external_id.value_or(0);
    a.correlation = args.correlation.value_or(0);
    if (a.on_device()) {
      // CUPTI's graphId is 32 bits: past them the trace is no CUPTI record.
      if (args.graph_id && *args.graph_id > 0xffffffffu) bad_field(kGraphId, "is out of range (more than 2^32 - 1)");
      a.graph_id = static_cast<std::uint32_t>(args.graph_id.value_or(0));
      a.graph_node_id = args.graph_node_id.value_or(0);
    }
    a.cbid = static_cast<std::uint32_t>(args.cbid.value_or(0));
    a.context = args.context.value_or(-1);
    a.input_dtypes = std::move(args.input_type);
    a.input_dims = std::move(args.input_dims);
    a.concrete_inputs = std::move(args.concrete);
    if (a.on_device()) {
      a.device = small(args.device.value_or(pid));
      a.stream = args.stream.value_or(tid);
    }
    switch (a.type) {
      case ActivityType::Kernel: {
        KernelInfo k;
        k.grid = args.grid;
        k.block = args.block;
        k.registers_per_thread = small(args.registers);
        k.static_shared_bytes = 0;
        k.dynamic_shared_bytes = small(args.shared);  // Kineto writes static + dynamic as one figure
        if (args.queued_us) k.queued_ns = *args.queued_us * 1e3;
        if (args.has_block) a.kernel = k;
        break;
      }
      case ActivityType::Memcpy:
      case ActivityType::Memset: {
        TransferInfo t;
        t.bytes = args.bytes.value_or(0);
        if (a.type == ActivityType::Memcpy) {
          // "Memcpy DtoD (Device -> Device)": the kind is the word after "Memcpy".
          const auto at = a.name.find("Memcpy ");
          if (at != std::string::npos) t.kind = a.name.substr(at + 7, 4);
        }
        a.transfer = t;
        break;
      }
      case ActivityType::Allocation: {
        AllocationInfo m;
        m.bytes = args.mem_bytes.value_or(0);
        m.addr = args.addr.value_or(0);
        m.total_allocated = args.total_alloc.value_or(0);
        m.total_reserved = args.total_reserved.value_or(0);
        m.device_type = small(args.device_type);
        m.device_id = small(args.device_id.value_or(-1));
        a.allocation = m;
        break;
      }
      default:
        break;
    }
    trace_.activities.push_back(std::move(a));
  }

  // Sizes are never negative, and stay far enough inside an int64 that sums
  // over millions of events cannot overflow.
  template <class A>
  void check_sizes(ActivityType type, const A& args) const {
    const auto size = [&](std::string_view field, const std::optional<std::int64_t>& v) {
      if (!v) return;
      if (*v < 0) bad_field(field, "is negative");
      if (*v > kMaxBytes) bad_field(field, "is out of range (more than 2^50)");
    };
    namespace k = sc::args;
    // Read into an int: past 2^30 a figure would be clamped, so it is refused.
    const auto small_size = [&](std::string_view field, const std::optional<std::int64_t>& v) {
      size(field, v);
      if (v && *v > kMaxSmall) bad_field(field, "is out of range (more than 2^30)");
    };
    if (type == ActivityType::Kernel) {
      small_size(k::kRegistersPerThread, args.registers);
      small_size(k::kSharedMemory, args.shared);
      for (int i = 0; i < 3; ++i) {
        if (args.grid[i] < 0) bad_field(k::kGrid, "has a negative dimension");
        if (args.block[i] < 0) bad_field(k::kBlock, "has a negative dimension");
      }
    } else if (type == ActivityType::Memcpy || type == ActivityType::Memset) {
      size(k::kBytes, args.bytes);
    } else if (type == ActivityType::Allocation) {
      // A free's Bytes are negative; the totals never are.
      if (args.mem_bytes && (*args.mem_bytes < -kMaxBytes || *args.mem_bytes > kMaxBytes)) {
        bad_field(k::kMemBytes, "is out of range (more than 2^50)");
      }
      size(k::kTotalAllocated, args.total_alloc);
      size(k::kTotalReserved, args.total_reserved);
    }
  }

  template <class A>
  void read_args(od::object& ao, A& args) {
    namespace k = sc::args;
    for (auto field : ao) {
      std::string_view key;
      if (auto e = field.unescaped_key().get(key)) bad(e);
      od::value v;
      if (auto e = field.value().get(v)) bad(e);
      if (key == k::kExternalId) {
        args.external_id = id(v);
      } else if (key == k::kCorrelation) {
        args.correlation = id(v);
      } else if (key == kGraphId) {
        args.graph_id = id(v);
      } else if (key == kGraphNodeId) {
        args.graph_node_id = id(v);
      } else if (key == k::kDevice) {
        args.device = integer_within(v, -kMaxSmall, kMaxSmall);
      } else if (key == k::kStream) {
        args.stream = integer(v);
      } else if (key == k::kContext) {
        args.context = integer(v);
      } else if (key == k::kCbid) {
        args.cbid = integer_within(v, 0, std::numeric_limits<std::uint32_t>::max());
      } else if (key == k::kRegistersPerThread) {
        args.registers = integer(v);
      } else if (key == k::kSharedMemory) {
        args.shared = integer(v);
      } else if (key == k::kBytes) {
        args.bytes = integer(v);
      } else if (key == k::kQueued) {
        args.queued_us = number(v);
      } else if (key == k::kGrid) {
        args.has_grid = dim3(v, args.grid);
      } else if (key == k::kBlock) {
        args.has_block = dim3(v, args.block);
      } else if (key == k::kInputType) {
        args.input_type = string_list(v);
      } else if (key == k::kInputDims) {
        args.input_dims = dims_list(v, prefix() + "\"" + std::string(key) + "\" ");
      } else if (key == k::kConcreteInputs) {
        args.concrete = strings(v);
      } else if (key == k::kMemBytes) {
        args.mem_bytes = integer(v);
      } else if (key == k::kTotalAllocated) {
        args.total_alloc = integer(v);
      } else if (key == k::kTotalReserved) {
        args.total_reserved = integer(v);
      } else if (key == k::kAddr) {
        args.addr = id(v);
      } else if (key == k::kDeviceType) {
        args.device_type = integer_within(v, -kMaxSmall, kMaxSmall);
      } else if (key == k::kDeviceId) {
        args.device_id = integer_within(v, -kMaxSmall, kMaxSmall);
      }
    }
  }

  // Strings from the parser live until the next field is read; the few kept
  // past that are copied.
  static std::string_view keep(std::string_view s, std::string& store) {
    store.assign(s);
    return store;
  }

  Trace& trace_;
  od::parser parser_;
  std::uint64_t index_ = 0;
  std::int64_t base_ns_ = 0;
  std::string ph_, cat_;
  std::map<int, DeviceProperties> devices_;
};

}  // namespace

Trace read_trace_stream(const ReadChunk& read, const TraceReadOptions& o) {
  Trace trace;
  EventReader reader(trace);
  Splitter splitter(reader, o);
  std::vector<char> chunk(std::size_t{1} << 20);
  std::uint64_t total = 0;
  while (true) {
    const std::size_t n = read(chunk.data(), chunk.size());
    if (n == 0) break;
    total += n;
    if (total > o.max_bytes) {
      refuse("more than " + size_str(o.max_bytes) +
             " of JSON (after decompression): a trace too big to read here, or a gzip bomb");
    }
    splitter.feed(chunk.data(), n);
  }
  splitter.finish();
  reader.finish();
  if (trace.activities.empty()) {
    refuse(splitter.events() == 0 ? "no events: \"traceEvents\" is empty"
                                  : "no events attnprof reads (CPU ops, annotations, kernels, memcpys, "
                                    "memsets, CUDA runtime or driver calls) among " +
                                        std::to_string(splitter.events()) + " events");
  }
  return trace;
}

}  // namespace attnprof
