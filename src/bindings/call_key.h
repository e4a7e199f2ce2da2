// The call cache's key (call_cache.cpp): everything prepare() reads of a
// call but its arrays' data pointers, held inline so that a lookup allocates
// nothing: each array's layout, the plain options (a tuple made from
// call_options.h's table, so that equality and the hash walk every option
// there is), the threads and pass, and a packed call's maxima and lengths.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "bindings/bindings.h"

namespace attnprof::python {

// An array's layout: everything prepare() reads of it but its data pointer.
struct ArrayLayout {
  std::int32_t ndim = -1;  // -1: no array (an optional one not given)
  std::int32_t device_type = 0;
  std::int32_t device_id = 0;
  std::uint8_t code = 0;
  std::uint8_t bits = 0;
  std::uint16_t lanes = 0;
  std::array<std::int64_t, 4> shape{};
  std::array<std::int64_t, 4> strides{};
  bool operator==(const ArrayLayout&) const = default;
};

// The names a key holds inline (no allocation per lookup); a longer one
// (which no backend or mask has) is never cached.
using KeyName = std::array<char, 24>;

// A plain option as a key holds it: as itself, a name inline (set: false
// where it cannot be held, and the call is not cached).
template <class T>
struct Held {
  using type = T;
  static bool set(const T& v, T& out) {
    out = v;
    return true;
  }
};
template <>
struct Held<std::string> {
  using type = KeyName;
  static bool set(const std::string& v, KeyName& out);
};
using OptionsKey = decltype(std::apply(
    [](const auto&... e) { return std::tuple<typename Held<OptionType<decltype(e)>>::type...>{}; }, kCallOptions));

// The caller's arrays, in the order the key and the entries' views name them.
enum Source : std::uint8_t { kQ, kK, kV, kOut, kMask, kTable, kLens, kQRows, kKvRows, kCuQ, kCuK, kSources };
// The caller's arrays by Source (null: not given).
using Sources = std::array<const Array*, kSources>;

struct CallKey {
  std::array<ArrayLayout, kSources> arrays;
  OptionsKey options{};
  int threads = 0;
  Pass pass = Pass::Forward;
  // A packed call: max_seqlen_q and _k as given, and on the CPU its
  // cumulative lengths themselves (cu_seqlens_q's, then _k's), from which its
  // problem is made; empty where the kernels read them (a GPU's flash).
  std::optional<std::int64_t> max_q, max_k;
  std::vector<std::int32_t> lengths;
  bool operator==(const CallKey&) const = default;
};

struct CallKeyHash {
  std::size_t operator()(const CallKey& k) const noexcept;
};

Sources sources_of(const Array& q, const Array& k, const Array& v, const Array& out, const Extras& x);
// The key of a call on `arrays` with `a`'s options, threads and pass; false
// where a call cannot be keyed (an array of more than 4 dimensions, a name
// too long to hold), which then goes uncached.
bool key_of(const Sources& arrays, const CallArgs& a, CallKey& key);

}  // namespace attnprof::python
