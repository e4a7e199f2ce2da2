// The Chrome trace reader. Two stages:
//   1. A byte scanner (Splitter, trace_splitter.h) walks the document a chunk
//      at a time and hands on each element of "traceEvents" and each top-level
//      value we read (deviceProperties, baseTimeNanoseconds, traceName), as text.
//   2. Each event's text is parsed with simdjson's On-Demand API (which also
//      validates UTF-8) into an Activity, reading only the fields the rules use.
// Where the text comes from (a file, gzip, memory) is trace_input.cpp's.
#include "attnprof/trace_reader.h"

#include <simdjson.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <new>
#include <optional>
#include <string>
#include <system_error>
#include <unordered_map>
#include <vector>

#include "analysis/format.h"
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

// Bounds that keep every sum and difference the rules make inside an int64.
constexpr std::int64_t kMaxBaseNs = 4'000'000'000'000'000'000;
constexpr std::int64_t kMaxTimeNs = 4'000'000'000'000'000'000;  // ts, and base + ts
constexpr std::int64_t kMaxDurNs = 1'000'000'000'000'000'000;
constexpr std::int64_t kMaxBytes = std::int64_t{1} << 50;

// ---- Stage 2: events into Activities ---------------------------------------------

std::string json_error(simdjson::error_code e) {
  if (e == simdjson::UTF8_ERROR) return "not valid UTF-8";
  if (e == simdjson::DEPTH_ERROR) return "nested too deeply";
  if (e == simdjson::NUMBER_ERROR) return "a number out of range";
  return std::string("malformed JSON (") + simdjson::error_message(e) + ")";
}

// Microseconds as the trace writes them ("1234.567") to nanoseconds, exactly
// when the text is plain decimal, through a double otherwise.
std::optional<std::int64_t> us_to_ns(std::string_view t) {
  while (!t.empty() && (t.back() == ' ' || t.back() == '\n' || t.back() == '\r' || t.back() == '\t'))
    t.remove_suffix(1);
  bool neg = false;
  std::size_t i = 0;
  if (i < t.size() && t[i] == '-') {
    neg = true;
    ++i;
  }
  std::int64_t whole = 0;
  std::size_t digits = 0;
  while (i < t.size() && t[i] >= '0' && t[i] <= '9' && digits < 15) {
    whole = whole * 10 + (t[i] - '0');
    ++i;
    ++digits;
  }
  if (digits > 0 && (i == t.size() || t[i] == '.')) {
    std::int64_t frac = 0;
    int fd = 0;
    bool round_up = false;
    if (i < t.size()) {
      ++i;
      while (i < t.size() && t[i] >= '0' && t[i] <= '9') {
        if (fd < 3) {
          frac = frac * 10 + (t[i] - '0');
          ++fd;
        } else if (fd == 3) {
          round_up = t[i] >= '5';
          ++fd;
        }
        ++i;
      }
    }
    if (i == t.size()) {
      for (int k = std::min(fd, 3); k < 3; ++k) frac *= 10;
      const std::int64_t ns = whole * 1000 + frac + (round_up ? 1 : 0);
      return neg ? -ns : ns;
    }
  }
  // Exponents, or more digits than an int64 of nanoseconds holds.
  char buf[64];
  if (t.size() >= sizeof buf) return std::nullopt;
  std::memcpy(buf, t.data(), t.size());
  buf[t.size()] = 0;
  char* end = nullptr;
  const double v = std::strtod(buf, &end);
  if (end != buf + t.size() || !std::isfinite(v) || std::abs(v) > 9.0e15) return std::nullopt;
  return static_cast<std::int64_t>(std::llround(v * 1000.0));
}

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
    const std::string what = "\"" + std::string(key) + "\": ";
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
      read_devices(doc, what);
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

  // Whole numbers, accepting integral doubles ("device": 0.0, 1e3); none for
  // a wrong type, a fraction or a number out of range.
  template <class V>
  static std::optional<std::int64_t> integer(V& v) {
    od::number_type t;
    if (v.get_number_type().get(t)) return std::nullopt;
    if (t == od::number_type::signed_integer) {
      std::int64_t x;
      if (v.get_int64().get(x)) return std::nullopt;
      return x;
    }
    if (t == od::number_type::unsigned_integer) {
      std::uint64_t x;
      if (v.get_uint64().get(x)) return std::nullopt;
      return static_cast<std::int64_t>(x);  // correlation ids wrap as Kineto's do
    }
    double d;
    if (v.get_double().get(d) || !std::isfinite(d) || std::abs(d) > 9.0e18 || d != std::trunc(d)) return std::nullopt;
    return static_cast<std::int64_t>(d);
  }

  static std::optional<double> number(od::value v) {
    double d;
    if (v.get_double().get(d) || !std::isfinite(d)) return std::nullopt;
    return d;
  }

  // A process or thread id: a number, or a label whose trailing digits are
  // the id ("stream 7", as older PyTorch wrote GPU lanes).
  static std::int64_t lane_id(od::value v) {
    od::json_type t;
    if (v.type().get(t)) return 0;
    if (t == od::json_type::number) return integer(v).value_or(0);
    std::string_view s;
    if (t != od::json_type::string || v.get_string().get(s)) return 0;
    std::size_t k = s.size();
    while (k > 0 && s[k - 1] >= '0' && s[k - 1] <= '9') --k;
    std::int64_t id = 0;
    if (k < s.size() && s.size() - k < 18) {
      std::from_chars(s.data() + k, s.data() + s.size(), id);
      return id;
    }
    return static_cast<std::int64_t>(std::hash<std::string_view>{}(s)&0x7fffffff);
  }

  static int small(std::optional<std::int64_t> v) {
    if (!v) return 0;
    return static_cast<int>(std::clamp<std::int64_t>(*v, -(1 << 30), 1 << 30));
  }

  static bool dim3(od::value v, std::array<int, 3>& out) {
    od::array arr;
    if (v.get_array().get(arr)) return false;
    std::size_t k = 0;
    for (auto el : arr) {
      od::value x;
      if (el.get(x)) return false;
      const auto n = integer(x);
      if (!n || k >= 3) return false;
      out[k++] = small(n);
    }
    return k == 3;
  }

  // "Input type": ["c10::BFloat16", "", "Scalar"] -> "c10::BFloat16, , Scalar".
  static std::string string_list(od::value v) {
    od::array arr;
    std::string out;
    if (v.get_array().get(arr)) return out;
    bool first = true;
    for (auto el : arr) {
      std::string_view s;
      if (!first) out += ", ";
      first = false;
      if (el.get_string().get(s) == simdjson::SUCCESS) out += s;
    }
    return out;
  }

  // "Concrete Inputs": ["", "0.", "True"], each entry kept (non-strings as "").
  static std::vector<std::string> strings(od::value v) {
    od::array arr;
    std::vector<std::string> out;
    if (v.get_array().get(arr)) return out;
    for (auto el : arr) {
      std::string_view s;
      out.emplace_back(el.get_string().get(s) == simdjson::SUCCESS ? s : std::string_view());
    }
    return out;
  }

  // "Input Dims": [[8, 16], [], [[1, 2], [3]]] -> "[8, 16], [], [[1, 2], [3]]".
  static void dims_text(od::value v, std::string& out, int depth) {
    od::json_type t;
    if (v.type().get(t) || depth > 8) return;
    if (t == od::json_type::array) {
      od::array arr;
      if (v.get_array().get(arr)) return;
      out += '[';
      bool first = true;
      for (auto el : arr) {
        od::value x;
        if (el.get(x)) return;
        if (!first) out += ", ";
        first = false;
        dims_text(x, out, depth + 1);
      }
      out += ']';
    } else if (t == od::json_type::number) {
      out += std::to_string(integer(v).value_or(0));
    }
  }

  static std::string dims_list(od::value v) {
    std::string out;
    dims_text(v, out, 0);
    if (out.size() >= 2 && out.front() == '[') out = out.substr(1, out.size() - 2);
    return out;
  }

  static std::optional<ActivityType> type_of(std::string_view cat) {
    std::string c(cat);
    std::transform(c.begin(), c.end(), c.begin(), [](unsigned char x) { return std::tolower(x); });
    static const std::unordered_map<std::string, ActivityType> kCats = {
        {"cpu_op", ActivityType::CpuOp},
        {"operator", ActivityType::CpuOp},
        {"user_annotation", ActivityType::UserAnnotation},
        {"gpu_user_annotation", ActivityType::GpuUserAnnotation},
        {"kernel", ActivityType::Kernel},
        {"gpu_memcpy", ActivityType::Memcpy},
        {"memcpy", ActivityType::Memcpy},
        {"gpu_memset", ActivityType::Memset},
        {"memset", ActivityType::Memset},
        {"cuda_runtime", ActivityType::CudaRuntime},
        {"runtime", ActivityType::CudaRuntime},
        {"cuda_driver", ActivityType::CudaDriver},
        {"driver", ActivityType::CudaDriver},
        {"cuda_sync", ActivityType::CudaSync},
    };
    const auto it = kCats.find(c);
    if (it == kCats.end()) return std::nullopt;
    return it->second;
  }

  void read_event(od::object& obj) {
    std::string_view ph, cat, name;
    std::optional<std::int64_t> ts, dur;
    std::int64_t pid = 0, tid = 0;
    bool has_args = false;
    Activity a;
    // args can come before cat in the text: keep what they say, apply once the type is known.
    struct Args {
      std::optional<std::int64_t> external_id, correlation, device, stream, context, cbid, registers, shared, bytes;
      std::optional<std::int64_t> mem_bytes, total_alloc, total_reserved, addr, device_type, device_id;
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
      type = type_of(cat);
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
    a.external_id = static_cast<std::uint64_t>(args.external_id.value_or(0));
    a.correlation = static_cast<std::uint64_t>(args.correlation.value_or(0));
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
        m.addr = static_cast<std::uint64_t>(args.addr.value_or(0));
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
    if (type == ActivityType::Kernel) {
      size(k::kRegistersPerThread, args.registers);
      size(k::kSharedMemory, args.shared);
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
        args.external_id = integer(v);
      } else if (key == k::kCorrelation) {
        args.correlation = integer(v);
      } else if (key == k::kDevice) {
        args.device = integer(v);
      } else if (key == k::kStream) {
        args.stream = integer(v);
      } else if (key == k::kContext) {
        args.context = integer(v);
      } else if (key == k::kCbid) {
        args.cbid = integer(v);
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
        args.input_dims = dims_list(v);
      } else if (key == k::kConcreteInputs) {
        args.concrete = strings(v);
      } else if (key == k::kMemBytes) {
        args.mem_bytes = integer(v);
      } else if (key == k::kTotalAllocated) {
        args.total_alloc = integer(v);
      } else if (key == k::kTotalReserved) {
        args.total_reserved = integer(v);
      } else if (key == k::kAddr) {
        args.addr = integer(v);
      } else if (key == k::kDeviceType) {
        args.device_type = integer(v);
      } else if (key == k::kDeviceId) {
        args.device_id = integer(v);
      }
    }
  }

  // Strings from the parser live until the next field is read; the few kept
  // past that are copied.
  static std::string_view keep(std::string_view s, std::string& store) {
    store.assign(s);
    return store;
  }

  void read_devices(od::document& doc, const std::string& what) {
    od::array arr;
    if (doc.get_array().get(arr)) refuse(what + "not an array");
    for (auto el : arr) {
      od::object o;
      if (el.get_object().get(o)) refuse(what + "an entry is not an object");
      DeviceProperties d;
      namespace k = sc::device;
      for (auto field : o) {
        std::string_view key;
        od::value v;
        if (field.unescaped_key().get(key) || field.value().get(v)) refuse(what + "malformed");
        if (key == k::kName) {
          std::string_view s;
          if (v.get_string().get(s) == simdjson::SUCCESS) d.name = std::string(s);
          continue;
        }
        const auto n = integer(v);
        if (!n) continue;  // of another type: ignored, as in args
        static constexpr std::string_view kRead[] = {k::kId,
                                                     k::kTotalGlobalMem,
                                                     k::kComputeMajor,
                                                     k::kComputeMinor,
                                                     k::kMaxThreadsPerBlock,
                                                     k::kMaxThreadsPerMultiprocessor,
                                                     k::kRegsPerBlock,
                                                     k::kWarpSize,
                                                     k::kSharedMemPerBlock,
                                                     k::kNumSms,
                                                     k::kRegsPerMultiprocessor,
                                                     k::kSharedMemPerBlockOptin,
                                                     k::kSharedMemPerMultiprocessor,
                                                     k::kMaxBlocksPerMultiprocessor,
                                                     k::kL2CacheSize};
        if (*n < 0 && std::find(std::begin(kRead), std::end(kRead), key) != std::end(kRead)) {
          refuse(what + "\"" + std::string(key) + "\" is negative");
        }
        if (key == k::kId) d.id = small(n);
        if (key == k::kTotalGlobalMem) d.total_global_mem = *n;
        if (key == k::kComputeMajor) d.compute_major = small(n);
        if (key == k::kComputeMinor) d.compute_minor = small(n);
        if (key == k::kMaxThreadsPerBlock) d.max_threads_per_block = small(n);
        if (key == k::kMaxThreadsPerMultiprocessor) d.max_threads_per_sm = small(n);
        if (key == k::kRegsPerBlock) d.regs_per_block = small(n);
        if (key == k::kWarpSize) d.warp_size = small(n);
        if (key == k::kSharedMemPerBlock) d.shared_mem_per_block = *n;
        if (key == k::kNumSms) d.num_sms = small(n);
        if (key == k::kRegsPerMultiprocessor) d.regs_per_sm = small(n);
        if (key == k::kSharedMemPerBlockOptin) d.shared_mem_per_block_optin = *n;
        if (key == k::kSharedMemPerMultiprocessor) d.shared_mem_per_sm = *n;
        if (key == k::kMaxBlocksPerMultiprocessor) d.max_blocks_per_sm = small(n);
        if (key == k::kL2CacheSize) d.l2_cache_bytes = *n;
      }
      devices_.try_emplace(d.id, d);
    }
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
