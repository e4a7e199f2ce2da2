// The values of a Chrome trace's events and top-level keys, read with
// simdjson's On-Demand API (the second stage of trace_reader.cpp): times as
// the trace writes them, whole numbers, process and thread ids, kernel
// dims, PyTorch's input lists, the event categories attnprof reads, and
// deviceProperties. None of them trusts the trace: a value of the wrong type
// or out of range is no value, or refused in one line (read_devices).
#pragma once

#include <simdjson.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnprof/activity.h"

namespace attnprof::trace_fields {

namespace od = simdjson::ondemand;

// simdjson's error as a reason a user reads ("not valid UTF-8").
std::string json_error(simdjson::error_code e);

// Microseconds as the trace writes them ("1234.567") to nanoseconds, exactly
// when the text is plain decimal, through a double otherwise.
std::optional<std::int64_t> us_to_ns(std::string_view t);

// Whole numbers, accepting integral doubles ("device": 0.0, 1e3); none for
// a wrong type, a fraction or a number out of range (past an int64: 2^63
// would otherwise read as -2^63).
template <class V>
inline std::optional<std::int64_t> integer(V& v) {
  od::number_type t;
  if (v.get_number_type().get(t)) return std::nullopt;
  if (t == od::number_type::signed_integer) {
    std::int64_t x;
    if (v.get_int64().get(x)) return std::nullopt;
    return x;
  }
  if (t == od::number_type::unsigned_integer) return std::nullopt;  // simdjson's type for 2^63 and above
  double d;
  if (v.get_double().get(d) || !std::isfinite(d) || std::abs(d) > 9.0e18 || d != std::trunc(d)) return std::nullopt;
  return static_cast<std::int64_t>(d);
}

// An id (correlation, External id, an address): any whole number up to
// 2^64 - 1, kept as the unsigned value Kineto writes; none otherwise.
template <class V>
inline std::optional<std::uint64_t> id(V& v) {
  od::number_type t;
  if (v.get_number_type().get(t)) return std::nullopt;
  if (t == od::number_type::unsigned_integer) {
    std::uint64_t x;
    if (v.get_uint64().get(x)) return std::nullopt;
    return x;
  }
  const std::optional<std::int64_t> x = integer(v);
  if (!x) return std::nullopt;
  return static_cast<std::uint64_t>(*x);  // a negative id wraps, as Kineto's unsigned ids do
}

// A whole number within [lo, hi]; none for a wrong type or a number outside.
template <class V>
inline std::optional<std::int64_t> integer_within(V& v, std::int64_t lo, std::int64_t hi) {
  const std::optional<std::int64_t> x = integer(v);
  if (!x || *x < lo || *x > hi) return std::nullopt;
  return x;
}

std::optional<double> number(od::value v);

// A process or thread id: a number, or a label whose trailing digits are
// the id ("stream 7", as older PyTorch wrote GPU lanes).
std::int64_t lane_id(od::value v);

// The bound of the fields read into an int (device ids, registers, shared
// memory, grid and block): a value past it is out of range, never clamped.
inline constexpr std::int64_t kMaxSmall = std::int64_t{1} << 30;

// An int within +-kMaxSmall, as read by integer_within (0 for none).
int small(std::optional<std::int64_t> v);

// [x, y, z] of whole numbers within +-kMaxSmall into out; false for anything else.
bool dim3(od::value v, std::array<int, 3>& out);

// "Input type": ["c10::BFloat16", "", "Scalar"] -> "c10::BFloat16, , Scalar".
std::string string_list(od::value v);

// "Concrete Inputs": ["", "0.", "True"], each entry kept (non-strings as "").
std::vector<std::string> strings(od::value v);

// "Input Dims": [[8, 16], [], [[1, 2], [3]]] -> "[8, 16], [], [[1, 2], [3]]".
// Every entry is a tensor's size: an entry that is not a whole number (1.5,
// "8") or not from 0 to kMaxDim is refused, `what` (the event and field)
// beginning the line, as a trace's shapes would otherwise be replayed wrong.
inline constexpr std::int64_t kMaxDim = std::int64_t{1} << 50;
std::string dims_list(od::value v, const std::string& what);

// The activity an event's "cat" names, case-insensitively; none for the
// categories attnprof does not read.
std::optional<ActivityType> activity_type(std::string_view cat);

// The deviceProperties array: each entry's device by its id (the first of
// an id kept); `what` begins every refusal ("\"deviceProperties\": ").
void read_devices(od::document& doc, const std::string& what, std::map<int, DeviceProperties>& devices);

}  // namespace attnprof::trace_fields
