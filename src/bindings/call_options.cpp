// A call's plain options from Python: a binding's keywords and the torch
// extension's C entry, each walked against call_options.h's one table; and
// the table as Python reads it (_core._call_options, _core._options_taken).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <array>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "bindings/bindings.h"

namespace attnprof::python {
namespace {

// Each member type's names: as _options.py's OPTIONS writes its schema type,
// as a message says what it takes, and the kind the torch extension reads it
// as. A member of another type does not compile until it has its entry here.
template <class T>
struct Kind;
template <>
struct Kind<std::string> {
  static constexpr const char* schema = "str";
  static constexpr const char* text = "str";
  static constexpr std::uint8_t entry = kAttnprofText;
};
template <>
struct Kind<std::optional<std::int64_t>> {
  static constexpr const char* schema = "int?";
  static constexpr const char* text = "int or None";
  static constexpr std::uint8_t entry = kAttnprofInt;
};
template <>
struct Kind<std::optional<double>> {
  static constexpr const char* schema = "float?";
  static constexpr const char* text = "float or None";
  static constexpr std::uint8_t entry = kAttnprofReal;
};
template <>
struct Kind<bool> {
  static constexpr const char* schema = "bool";
  static constexpr const char* text = "bool";
  static constexpr std::uint8_t entry = kAttnprofFlag;
};

// The names as interned Python strings: a call's keywords are interned (the
// caller's literals), so a name is mostly found by its pointer.
const std::array<PyObject*, kCallOptionCount>& interned_names() {
  static const std::array<PyObject*, kCallOptionCount> names = [] {
    std::array<PyObject*, kCallOptionCount> a{};
    for (std::size_t i = 0; i < kCallOptionCount; ++i) {
      a[i] =
          PyUnicode_FromStringAndSize(kCallOptionNames[i].data(), static_cast<Py_ssize_t>(kCallOptionNames[i].size()));
      PyUnicode_InternInPlace(&a[i]);  // held for the process
    }
    return a;
  }();
  return names;
}

// The table's index of a keyword, kCallOptionCount for none.
std::size_t index_of(PyObject* key) {
  const auto& names = interned_names();
  for (std::size_t i = 0; i < kCallOptionCount; ++i) {
    if (names[i] == key) return i;
  }
  Py_ssize_t n = 0;
  const char* s = PyUnicode_AsUTF8AndSize(key, &n);
  if (s == nullptr) {
    PyErr_Clear();
    return kCallOptionCount;
  }
  for (std::size_t i = 0; i < kCallOptionCount; ++i) {
    if (kCallOptionNames[i] == std::string_view(s, static_cast<std::size_t>(n))) return i;
  }
  return kCallOptionCount;
}

// A member from the extension's slot of its kind (forward_entry.h).
void from_entry(const AttnprofOption& s, std::string& v) { v = s.text; }
void from_entry(const AttnprofOption& s, std::optional<std::int64_t>& v) {
  v = s.given ? std::optional<std::int64_t>(s.integer) : std::nullopt;
}
void from_entry(const AttnprofOption& s, std::optional<double>& v) {
  v = s.given ? std::optional<double>(s.real) : std::nullopt;
}
void from_entry(const AttnprofOption& s, bool& v) { v = s.given != 0; }

struct Registered {
  std::string binding;
  Takes takes;
};

// Never destroyed (read until the module goes); a deque keeps each name where it is.
std::deque<Registered>& registry() {
  static auto* const r = new std::deque<Registered>;
  return *r;
}

}  // namespace

CallOptions call_options(const nb::kwargs& options, Takes takes, const char* binding) {
  CallOptions o;
  PyObject *key = nullptr, *value = nullptr;
  Py_ssize_t pos = 0;
  while (PyDict_Next(options.ptr(), &pos, &key, &value)) {
    const std::size_t i = index_of(key);
    if (i == kCallOptionCount || !takes.has(i)) {
      throw nb::type_error(
          (std::string(binding) + "() got an unexpected keyword argument '" + nb::str(key).c_str() + "'").c_str());
    }
    for_each_call_option([&](auto j, const auto& e) {
      if (j != i) return;
      if (!nb::try_cast(nb::handle(value), o.*e.member)) {
        throw nb::type_error((std::string(binding) + "() takes " + std::string(e.name) + " as " +
                              Kind<OptionType<decltype(e)>>::text + ", not " + Py_TYPE(value)->tp_name)
                                 .c_str());
      }
    });
  }
  return o;
}

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

const char* register_call(std::string binding, Takes takes) {
  registry().push_back({std::move(binding), takes});
  return registry().back().binding.c_str();
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
  m.def(
      "_options_taken",
      [] {
        nb::dict out;
        for (const Registered& r : registry()) {
          nb::list names;
          for (std::size_t i = 0; i < kCallOptionCount; ++i) {
            if (r.takes.has(i)) names.append(std::string(kCallOptionNames[i]));
          }
          out[r.binding.c_str()] = nb::tuple(names);
        }
        return out;
      },
      "the plain options each binding takes as keywords (**options), by its name ('Problem.__init__' for a method)");
}

}  // namespace attnprof::python
