// trace_fields.h's readers.
#include "analysis/trace_fields.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <unordered_map>

#include "analysis/trace_unreadable.h"
#include "profiler/trace_schema.h"

namespace attnprof::trace_fields {

namespace sc = schema;
using trace_reading::refuse;

std::string json_error(simdjson::error_code e) {
  if (e == simdjson::UTF8_ERROR) return "not valid UTF-8";
  if (e == simdjson::DEPTH_ERROR) return "nested too deeply";
  if (e == simdjson::NUMBER_ERROR) return "a number out of range";
  return std::string("malformed JSON (") + simdjson::error_message(e) + ")";
}

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

std::optional<double> number(od::value v) {
  double d;
  if (v.get_double().get(d) || !std::isfinite(d)) return std::nullopt;
  return d;
}

std::int64_t lane_id(od::value v) {
  od::json_type t;
  if (v.type().get(t)) return 0;
  // A lane is a label: an unsigned id past 2^63 keeps its bits, as distinct lanes must stay apart.
  if (t == od::json_type::number) return static_cast<std::int64_t>(id(v).value_or(0));
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

int small(std::optional<std::int64_t> v) {
  if (!v) return 0;
  return static_cast<int>(std::clamp<std::int64_t>(*v, -kMaxSmall, kMaxSmall));
}

bool dim3(od::value v, std::array<int, 3>& out) {
  od::array arr;
  if (v.get_array().get(arr)) return false;
  std::size_t k = 0;
  for (auto el : arr) {
    od::value x;
    if (el.get(x)) return false;
    const auto n = integer_within(x, -kMaxSmall, kMaxSmall);
    if (!n || k >= 3) return false;
    out[k++] = small(n);
  }
  return k == 3;
}

std::string string_list(od::value v) {
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

std::vector<std::string> strings(od::value v) {
  od::array arr;
  std::vector<std::string> out;
  if (v.get_array().get(arr)) return out;
  for (auto el : arr) {
    std::string_view s;
    out.emplace_back(el.get_string().get(s) == simdjson::SUCCESS ? s : std::string_view());
  }
  return out;
}

// dims_list's text of one value, nested arrays to depth 8.
static void dims_text(od::value v, std::string& out, int depth, const std::string& what) {
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
      dims_text(x, out, depth + 1, what);
    }
    out += ']';
  } else if (t == od::json_type::number) {
    const std::string_view raw = v.raw_json_token();
    const std::string shown(raw.substr(0, std::min<std::size_t>(raw.find_last_not_of(" \t\r\n") + 1, 32)));
    const std::optional<std::int64_t> n = integer(v);
    od::number_type nt;
    const bool whole = n || (!v.get_number_type().get(nt) && nt == od::number_type::unsigned_integer);
    if (!whole) refuse(what + "has " + shown + " where a whole number (a tensor's size) belongs");
    if (!n || *n < 0 || *n > kMaxDim) refuse(what + "has " + shown + ", out of range (a size is from 0 to 2^50)");
    out += std::to_string(*n);
  }
}

std::string dims_list(od::value v, const std::string& what) {
  std::string out;
  dims_text(v, out, 0, what);
  if (out.size() >= 2 && out.front() == '[') out = out.substr(1, out.size() - 2);
  return out;
}

std::optional<ActivityType> activity_type(std::string_view cat) {
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

void read_devices(od::document& doc, const std::string& what, std::map<int, DeviceProperties>& devices) {
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
      const bool read = std::find(std::begin(kRead), std::end(kRead), key) != std::end(kRead);
      if (*n < 0 && read) refuse(what + "\"" + std::string(key) + "\" is negative");
      // Figures kept in an int: past kMaxSmall they would be clamped, so refused.
      const bool wide = key == k::kTotalGlobalMem || key == k::kSharedMemPerBlock ||
                        key == k::kSharedMemPerBlockOptin || key == k::kSharedMemPerMultiprocessor ||
                        key == k::kL2CacheSize;
      if (*n > kMaxSmall && read && !wide)
        refuse(what + "\"" + std::string(key) + "\" is out of range (more than 2^30)");
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
    devices.try_emplace(d.id, d);
  }
}

}  // namespace attnprof::trace_fields
