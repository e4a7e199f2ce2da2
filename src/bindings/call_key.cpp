// The call cache's key (call_key.h says what it holds).
#include "bindings/call_key.h"

#include <cstring>
#include <functional>
#include <string_view>
#include <tuple>

namespace attnprof::python {

bool Held<std::string>::set(const std::string& v, KeyName& out) {
  if (v.size() >= out.size()) return false;
  out.fill('\0');
  std::memcpy(out.data(), v.data(), v.size());
  return true;
}

namespace {

bool array_layout(const Array& a, ArrayLayout& l) {
  if (a.ndim > 4) return false;  // refused by prepare(), never cached
  l.ndim = static_cast<std::int32_t>(a.ndim);
  l.device_type = a.device_type;
  l.device_id = a.device_id;
  l.code = a.dtype.code;
  l.bits = a.dtype.bits;
  l.lanes = a.dtype.lanes;
  for (std::size_t i = 0; i < a.ndim; ++i) {
    l.shape[i] = a.shape[i];
    l.strides[i] = a.strides[i];
  }
  return true;
}

bool options_key(const CallOptions& o, OptionsKey& key) {
  bool held = true;
  for_each_call_option([&](auto i, const auto& e) {
    held = held && Held<OptionType<decltype(e)>>::set(o.*e.member, std::get<decltype(i)::value>(key));
  });
  return held;
}

template <class T>
void mix(std::size_t& h, const T& v) {
  h ^= std::hash<T>{}(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
}

// A held option into the hash, by its type (OptionsKey's members).
void mix_option(std::size_t& h, const KeyName& v) { mix(h, std::string_view(v.data())); }
void mix_option(std::size_t& h, bool v) { mix(h, v); }
void mix_option(std::size_t& h, const std::optional<std::int64_t>& v) {
  mix(h, v.has_value());
  mix(h, v.value_or(0));
}
void mix_option(std::size_t& h, const std::optional<double>& v) {
  mix(h, v.has_value());
  mix(h, v ? *v + 0.0 : 0.0);  // + 0.0: -0.0 and 0.0 compare equal, so they hash alike
}

}  // namespace

Sources sources_of(const Array& q, const Array& k, const Array& v, const Array& out, const Extras& x) {
  const auto opt = [](const std::optional<Array>& a) { return a ? &*a : nullptr; };
  return {
      &q,      &k,     &v, &out, opt(x.attn_mask), opt(x.block_table), opt(x.seq_lens), opt(x.q_rows), opt(x.kv_rows),
      nullptr, nullptr};
}

bool key_of(const Sources& arrays, const CallArgs& a, CallKey& key) {
  for (std::size_t i = 0; i < kSources; ++i) {
    if (arrays[i] != nullptr && !array_layout(*arrays[i], key.arrays[i])) return false;
  }
  if (!options_key(a.options, key.options)) return false;
  key.threads = a.threads;
  key.pass = a.pass;
  return true;
}

std::size_t CallKeyHash::operator()(const CallKey& k) const noexcept {
  std::size_t h = 0;
  for (const ArrayLayout& l : k.arrays) {
    mix(h, l.ndim);
    if (l.ndim < 0) continue;
    mix(h, (std::int64_t{l.device_type} << 32) | (std::int64_t{l.code} << 24) | (std::int64_t{l.bits} << 16) | l.lanes);
    for (std::int32_t i = 0; i < l.ndim; ++i) {
      mix(h, l.shape[static_cast<std::size_t>(i)]);
      mix(h, l.strides[static_cast<std::size_t>(i)]);
    }
  }
  std::apply([&](const auto&... option) { (mix_option(h, option), ...); }, k.options);
  mix(h, (k.threads << 8) | static_cast<int>(k.pass));
  mix(h, k.max_q.value_or(-1));
  mix(h, k.max_k.value_or(-1));
  for (const std::int32_t n : k.lengths) mix(h, n);
  return h;
}

}  // namespace attnprof::python
