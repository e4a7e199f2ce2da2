// A binding's signature with its plain options (call_options.h) made from
// the table: def_call<takes>(scope, name, f, annotations...) defines
// f(const CallOptions&, A...) as a function of A... and then one keyword
// parameter per option it takes, each with the table's name, type and
// CallOptions' default; the values are gathered into a CallOptions by
// walking the table. So an option added to the table is a keyword of every
// binding that takes it with no signature to edit, and Python still reads
// each binding's options from its signature (_options._keywords).
//
// Why parameters and not `**options` (nb::kwargs checked against the table):
// nanobind converts each as a typed parameter, as before the table (no dict
// made per call: **kwargs cost 0.1 us with 2 options and 0.3 us with 6 on
// the DLPack path, measured with _attention_until(0, ...)), and a wrong
// name or type is refused in nanobind's words, as it was.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <array>
#include <cstddef>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

#include "bindings/call_options.h"

namespace attnprof::python {
namespace call_signature {

namespace nb = nanobind;

template <std::size_t I>
using Type = OptionType<std::tuple_element_t<I, std::remove_cv_t<decltype(kCallOptions)>>>;

template <class T>
inline constexpr bool kOptional = false;
template <class T>
inline constexpr bool kOptional<std::optional<T>> = true;

// Option I's keyword: its name, and CallOptions' default (None may be passed
// for an optional one, as for any std::optional parameter).
template <std::size_t I>
auto keyword() {
  constexpr auto& e = std::get<I>(kCallOptions);
  static_assert(e.name.data()[e.name.size()] == '\0', "a name of the table is a literal");
  if constexpr (kOptional<Type<I>>) {
    return nb::arg(e.name.data()).none() = nb::none();
  } else {
    return nb::arg(e.name.data()) = CallOptions{}.*e.member;
  }
}

// The table's indices of the options `takes` has, in its order.
template <Takes takes>
inline constexpr auto kTaken = [] {
  std::array<std::size_t, takes.count()> out{};
  std::size_t n = 0;
  for (std::size_t i = 0; i < kCallOptionCount; ++i) {
    if (takes.has(i)) out[n++] = i;
  }
  return out;
}();

template <Takes takes, std::size_t... J>
constexpr auto taken(std::index_sequence<J...>) {
  return std::index_sequence<kTaken<takes>[J]...>{};
}

template <class Scope, class R, class... A, std::size_t... I, class... Extra>
void define(Scope& scope, const char* name, R (*f)(const CallOptions&, A...), std::index_sequence<I...>,
            const Extra&... extra) {
  scope.def(
      name,
      [f](A... a, Type<I>... values) -> R {
        CallOptions o;
        ((o.*std::get<I>(kCallOptions).member = std::move(values)), ...);
        return f(o, std::forward<A>(a)...);
      },
      extra..., keyword<I>()...);
}

}  // namespace call_signature

// scope.def(name, ...) of f, whose first parameter is its plain options:
// `extra` annotates its other parameters (and may add a docstring or a
// return policy); the options `takes` has follow as keywords.
template <Takes takes, class Scope, class R, class... A, class... Extra>
void def_call(Scope& scope, const char* name, R (*f)(const CallOptions&, A...), const Extra&... extra) {
  call_signature::define(scope, name, f, call_signature::taken<takes>(std::make_index_sequence<takes.count()>{}),
                         extra...);
}

}  // namespace attnprof::python
