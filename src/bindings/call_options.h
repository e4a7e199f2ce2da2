// A call's plain options (what a call takes beyond its arrays that is a
// name, a number or a flag) in ONE list: the struct with its defaults, and
// one table of (keyword, member, the ProblemArgs field it sets). Everything
// that walks the options walks this table: each binding's keywords and their
// conversion from Python (def_call.h), their conversion from the torch
// extension's C entry and what it is told to read (call_options.cpp), the
// call cache's key, equality and hash (call_key.h), the problem they make
// (problem_args) and the table Python's is tested against
// (_core._call_options). Adding an option is a member and an entry here; a
// binding that takes all of them (Takes::all(), less those it has no use
// for) takes it with no other change.
// Tensor options (attn_mask, the rows, cumulative lengths, descales) are no
// plain options: each binding names those itself.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "attnprof/problem_spec.h"

namespace attnprof::python {

struct CallOptions {
  std::string backend = "auto";
  // A structural mask's name; "" is the call's default: causal (with
  // attn_mask, the tensor alone).
  std::string mask;
  std::optional<std::int64_t> window;
  std::optional<double> scale;
  bool bshd = false;  // q, k, v and out as [B, S, H, D]
  std::optional<double> softcap;
  bool deterministic = false;  // read by a backward
};

// No field of ProblemArgs: an option the bindings read themselves.
struct NoProblemField {};

template <class T, class P>
struct CallOption {
  using type = T;
  std::string_view name;
  T CallOptions::*member;
  P problem;  // the ProblemArgs field it sets, or NoProblemField
};

template <class T>
constexpr CallOption<T, NoProblemField> option(std::string_view name, T CallOptions::*member) {
  return {name, member, {}};
}
template <class T, class P>
constexpr CallOption<T, P ProblemArgs::*> option(std::string_view name, T CallOptions::*member, P ProblemArgs::*field) {
  return {name, member, field};
}

// The table, in Python's order (attnprof/_options.py's OPTIONS, which a test
// compares with it). backend and mask are read by the bindings (a mask name
// means more to a call than to a Problem: "" and attn_mask), bshd by the views.
inline constexpr auto kCallOptions = std::tuple{
    option("backend", &CallOptions::backend),
    option("mask", &CallOptions::mask),
    option("window", &CallOptions::window, &ProblemArgs::window),
    option("scale", &CallOptions::scale, &ProblemArgs::scale),
    option("bshd", &CallOptions::bshd),
    option("softcap", &CallOptions::softcap, &ProblemArgs::softcap),
    option("deterministic", &CallOptions::deterministic, &ProblemArgs::deterministic),
};
inline constexpr std::size_t kCallOptionCount = std::tuple_size_v<decltype(kCallOptions)>;
// The type of an entry's member (E: an entry's type, as decltype gives it).
template <class E>
using OptionType = typename std::remove_cvref_t<E>::type;

// f(std::integral_constant<size_t, I>, entry I) for each entry, in order.
template <class F>
constexpr void for_each_call_option(F&& f) {
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (f(std::integral_constant<std::size_t, I>{}, std::get<I>(kCallOptions)), ...);
  }
  (std::make_index_sequence<kCallOptionCount>{});
}

inline constexpr std::array<std::string_view, kCallOptionCount> kCallOptionNames = [] {
  std::array<std::string_view, kCallOptionCount> names{};
  for_each_call_option([&](auto i, const auto& o) { names[i] = o.name; });
  return names;
}();

// The option named `name`'s index in the table; in a constant expression an
// unknown name does not compile.
constexpr std::size_t call_option_index(std::string_view name) {
  for (std::size_t i = 0; i < kCallOptionCount; ++i) {
    if (kCallOptionNames[i] == name) return i;
  }
  throw std::invalid_argument("not an option of CallOptions' table");
}

// Which plain options a binding takes, a bit per table entry. Written as all
// of them less those a binding has no use for, so that an option added to
// the table reaches every call (dense, padded, packed, paged, forward and
// backward) with no list to keep in step.
struct Takes {
  static constexpr Takes all() { return Takes{(std::uint32_t{1} << kCallOptionCount) - 1}; }
  static constexpr Takes none() { return Takes{0}; }
  constexpr Takes except(std::string_view name) const {
    return Takes{bits & ~(std::uint32_t{1} << call_option_index(name))};
  }
  constexpr Takes with(std::string_view name) const {
    return Takes{bits | (std::uint32_t{1} << call_option_index(name))};
  }
  constexpr bool has(std::size_t i) const { return ((bits >> i) & 1) != 0; }
  constexpr std::size_t count() const {
    std::size_t n = 0;
    for (std::size_t i = 0; i < kCallOptionCount; ++i) n += has(i) ? 1 : 0;
    return n;
  }

  // Public, so that Takes is a template argument (def_call.h); made by the functions above.
  std::uint32_t bits = 0;
};
static_assert(kCallOptionCount <= 32, "Takes holds a bit per option");

// What each kind of call takes (the bindings' lists, which their signatures
// show: Python reads them there). deterministic orders a backward's sums: a
// forward has no use for it (Python passes it to the calls that take it).
inline constexpr Takes kForwardTakes = Takes::all().except("deterministic");
inline constexpr Takes kTrainTakes = Takes::all();
// A packed batch is [total, H, D]: no layout to choose.
inline constexpr Takes kPackedForwardTakes = kForwardTakes.except("bshd");
inline constexpr Takes kPackedTrainTakes = kTrainTakes.except("bshd");
// A Problem is what is computed: no backend, no memory layout.
inline constexpr Takes kProblemTakes = Takes::all().except("backend").except("bshd");

// The options' share of a Problem (the table's entries with a ProblemArgs
// field) and the pass; the mask is the caller's (its "" and attn_mask).
inline ProblemArgs problem_args(const CallOptions& o, std::optional<Pass> pass) {
  ProblemArgs a;
  a.pass = pass;
  for_each_call_option([&](auto, const auto& e) {
    if constexpr (!std::is_same_v<decltype(e.problem), NoProblemField>) a.*e.problem = o.*e.member;
  });
  return a;
}

}  // namespace attnprof::python
