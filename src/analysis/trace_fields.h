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
// a wrong type, a fraction or a number out of range.
template <class V>
inline std::optional<std::int64_t> integer(V& v) {
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

std::optional<double> number(od::value v);

// A process or thread id: a number, or a label whose trailing digits are
// the id ("stream 7", as older PyTorch wrote GPU lanes).
std::int64_t lane_id(od::value v);

// An int clamped to +-2^30 (0 for none).
int small(std::optional<std::int64_t> v);

// [x, y, z] of whole numbers into out; false for anything else.
bool dim3(od::value v, std::array<int, 3>& out);

// "Input type": ["c10::BFloat16", "", "Scalar"] -> "c10::BFloat16, , Scalar".
std::string string_list(od::value v);

// "Concrete Inputs": ["", "0.", "True"], each entry kept (non-strings as "").
std::vector<std::string> strings(od::value v);

// "Input Dims": [[8, 16], [], [[1, 2], [3]]] -> "[8, 16], [], [[1, 2], [3]]".
std::string dims_list(od::value v);

// The activity an event's "cat" names, case-insensitively; none for the
// categories attnprof does not read.
std::optional<ActivityType> activity_type(std::string_view cat);

// The deviceProperties array: each entry's device by its id (the first of
// an id kept); `what` begins every refusal ("\"deviceProperties\": ").
void read_devices(od::document& doc, const std::string& what, std::map<int, DeviceProperties>& devices);

}  // namespace attnprof::trace_fields
