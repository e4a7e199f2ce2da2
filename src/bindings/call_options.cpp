// A call's plain options from the torch extension's C entry, walked against
// call_options.h's one table, and the table as Python reads it
// (_core._call_options). Python's keywords: def_call.h.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "bindings/bindings.h"

namespace attnprof::python {
namespace {

// Each member type's names: as _options.py's OPTIONS writes its schema type,
// and the kind the torch extension reads it as. A member of another type
// does not compile until it has its entry here.
template <class T>
struct Kind;
template <>
struct Kind<std::string> {
  static constexpr const char* schema = "str";
  static constexpr std::uint8_t entry = kAttnprofText;
};
template <>
struct Kind<std::optional<std::int64_t>> {
  static constexpr const char* schema = "int?";
  static constexpr std::uint8_t entry = kAttnprofInt;
};
template <>
struct Kind<std::optional<double>> {
  static constexpr const char* schema = "float?";
  static constexpr std::uint8_t entry = kAttnprofReal;
};
template <>
struct Kind<bool> {
  static constexpr const char* schema = "bool";
  static constexpr std::uint8_t entry = kAttnprofFlag;
};

// A member from the extension's slot of its kind (forward_entry.h).
void from_entry(const AttnprofOption& s, std::string& v) { v = s.text; }
void from_entry(const AttnprofOption& s, std::optional<std::int64_t>& v) {
  v = s.given ? std::optional<std::int64_t>(s.integer) : std::nullopt;
}
void from_entry(const AttnprofOption& s, std::optional<double>& v) {
  v = s.given ? std::optional<double>(s.real) : std::nullopt;
}
void from_entry(const AttnprofOption& s, bool& v) { v = s.given != 0; }

}  // namespace

CallOptions call_options(const AttnprofForwardArgs& args) {
  CallOptions o;
  std::size_t slot = 0;
  for_each_call_option([&](auto i, const auto& e) {
    if constexpr (kForwardTakes.has(decltype(i)::value)) from_entry(args.options[slot++], o.*e.member);
  });
  return o;
}

static_assert(kForwardTakes.count() <= static_cast<std::size_t>(kAttnprofMaxOptions),
              "AttnprofForwardArgs holds kAttnprofMaxOptions options");

const AttnprofForwardEntry& forward_entry_of(AttnprofForward forward) {
  static const AttnprofForwardEntry entry = [&] {
    AttnprofForwardEntry e{};
    e.forward = forward;
    for_each_call_option([&](auto i, const auto& o) {
      if constexpr (kForwardTakes.has(decltype(i)::value)) {
        e.names[e.options] = o.name.data();  // a literal's: NUL-terminated
        e.kinds[e.options] = Kind<OptionType<decltype(o)>>::entry;
        ++e.options;
      }
    });
    return e;
  }();
  return entry;
}

void bind_call_options(nb::module_& m) {
  m.def(
      "_call_options",
      [] {
        const CallOptions defaults;
        nb::list out;
        for_each_call_option([&](auto, const auto& e) {
          out.append(nb::make_tuple(std::string(e.name), Kind<OptionType<decltype(e)>>::schema, defaults.*e.member));
        });
        return nb::tuple(out);
      },
      "the plain options of a call (bindings/call_options.h's table): (name, schema type, default) in its order");
}

}  // namespace attnprof::python
