// The Chrome trace reader's syntax check (stage 1, trace_splitter.h): a
// streaming validator of one JSON value at a time, fed the bytes the splitter
// hands on. Internal to the analysis layer.
#pragma once

#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "analysis/trace_unreadable.h"

namespace attnprof::trace_reading {

// A streaming check that bytes are exactly one JSON value (RFC 8259: the
// grammar, UTF-8, escapes, no control characters in strings). The splitter
// runs it over every event and top-level value: simdjson's On-Demand parse
// checks only what it reads, and skipped values are read by nothing.
class ValueChecker {
 public:
  void reset() {
    stack_.clear();
    state_ = S::Value;
    utf8_left_ = hex_left_ = 0;
    lit_ = nullptr;
  }

  // `offset`: the document offset of p[0], for messages.
  void feed(const char* p, std::size_t n, std::uint64_t offset) {
    for (std::size_t i = 0; i < n; ++i) step(static_cast<unsigned char>(p[i]), offset + i);
  }

  // The value must be complete here.
  void finish(std::uint64_t offset) {
    if (in_number()) state_ = S::After;
    if (state_ != S::After || !stack_.empty()) refuse("not JSON: a value ends early " + where(offset));
  }

 private:
  enum class S { Value, After, Key, KeyOrClose, Colon, Str, Esc, Lit, Minus, Zero, Int, Dot, Frac, E, ESign, Exp };

  static std::string where(std::uint64_t at) { return "at byte " + std::to_string(at); }
  [[noreturn]] static void bad(const char* what, std::uint64_t at) {
    refuse(std::string("not JSON: ") + what + " " + where(at));
  }
  static bool ws(unsigned char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
  static bool digit(unsigned char c) { return c >= '0' && c <= '9'; }
  bool in_number() const { return state_ == S::Zero || state_ == S::Int || state_ == S::Frac || state_ == S::Exp; }

  void value(unsigned char c, std::uint64_t at) {
    if (ws(c)) return;
    switch (c) {
      case '{':
        stack_.push_back('{');
        state_ = S::KeyOrClose;
        return;
      case '[':
        stack_.push_back('[');
        state_ = S::Value;
        array_start_ = true;
        return;
      case '"':
        key_ = false;
        state_ = S::Str;
        return;
      case 't':
        lit_ = "rue";
        state_ = S::Lit;
        return;
      case 'f':
        lit_ = "alse";
        state_ = S::Lit;
        return;
      case 'n':
        lit_ = "ull";
        state_ = S::Lit;
        return;
      case '-':
        state_ = S::Minus;
        return;
      case '0':
        state_ = S::Zero;
        return;
      default:
        if (digit(c)) {
          state_ = S::Int;
          return;
        }
        if (c == ']' && array_start_ && !stack_.empty() && stack_.back() == '[') {
          close(c, at);
          return;
        }
        bad("expected a value", at);
    }
  }

  void close(unsigned char c, std::uint64_t at) {
    if (stack_.empty() || (c == '}') != (stack_.back() == '{')) bad("a bracket that does not match", at);
    stack_.pop_back();
    state_ = S::After;
    array_start_ = false;
  }

  // After a value: a separator or a close; a number ends at the first byte not its own.
  void after(unsigned char c, std::uint64_t at) {
    if (ws(c)) return;
    if (stack_.empty()) bad("more than one value", at);
    if (c == ',') {
      state_ = stack_.back() == '{' ? S::Key : S::Value;
      array_start_ = false;
      return;
    }
    if (c == '}' || c == ']') return close(c, at);
    bad("expected ',' or a close", at);
  }

  void string_byte(unsigned char c, std::uint64_t at) {
    if (utf8_left_ > 0) {
      if (c < lo_ || c > hi_) bad("invalid UTF-8", at);
      lo_ = 0x80;
      hi_ = 0xBF;
      --utf8_left_;
      return;
    }
    if (c == '"') {
      state_ = key_ ? S::Colon : S::After;
      return;
    }
    if (c == '\\') {
      state_ = S::Esc;
      return;
    }
    if (c < 0x20) bad("a control character in a string", at);
    if (c < 0x80) return;
    lo_ = 0x80;
    hi_ = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      utf8_left_ = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      utf8_left_ = 2;
      if (c == 0xE0) lo_ = 0xA0;
      if (c == 0xED) hi_ = 0x9F;  // no UTF-16 surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      utf8_left_ = 3;
      if (c == 0xF0) lo_ = 0x90;
      if (c == 0xF4) hi_ = 0x8F;
    } else {
      bad("invalid UTF-8", at);
    }
  }

  void step(unsigned char c, std::uint64_t at) {
    switch (state_) {
      case S::Value:
        return value(c, at);
      case S::After:
        return after(c, at);
      case S::KeyOrClose:
        if (ws(c)) return;
        if (c == '}') return close(c, at);
        [[fallthrough]];
      case S::Key:
        if (ws(c)) return;
        if (c != '"') bad("expected a key", at);
        key_ = true;
        state_ = S::Str;
        return;
      case S::Colon:
        if (ws(c)) return;
        if (c != ':') bad("expected ':'", at);
        state_ = S::Value;
        array_start_ = false;
        return;
      case S::Str:
        return string_byte(c, at);
      case S::Esc:
        if (hex_left_ > 0) {
          if (!std::isxdigit(c)) bad("a \\u escape without four hex digits", at);
          if (--hex_left_ == 0) state_ = S::Str;
          return;
        }
        if (c == 'u') {
          hex_left_ = 4;
          return;
        }
        if (!std::strchr("\"\\/bfnrt", c) || c == 0) bad("an invalid escape", at);
        state_ = S::Str;
        return;
      case S::Lit:
        if (c != static_cast<unsigned char>(*lit_)) bad("an unknown literal", at);
        if (*++lit_ == 0) state_ = S::After;
        return;
      case S::Minus:
        if (c == '0')
          state_ = S::Zero;
        else if (digit(c))
          state_ = S::Int;
        else
          bad("a malformed number", at);
        return;
      case S::Zero:
      case S::Int:
        if (digit(c) && state_ == S::Int) return;
        if (c == '.')
          state_ = S::Dot;
        else if (c == 'e' || c == 'E')
          state_ = S::E;
        else if (digit(c))
          bad("a number with a leading zero", at);
        else {
          state_ = S::After;
          after(c, at);
        }
        return;
      case S::Dot:
        if (!digit(c)) bad("a malformed number", at);
        state_ = S::Frac;
        return;
      case S::Frac:
        if (digit(c)) return;
        if (c == 'e' || c == 'E') {
          state_ = S::E;
          return;
        }
        state_ = S::After;
        return after(c, at);
      case S::E:
        if (c == '+' || c == '-') {
          state_ = S::ESign;
          return;
        }
        [[fallthrough]];
      case S::ESign:
        if (!digit(c)) bad("a malformed number", at);
        state_ = S::Exp;
        return;
      case S::Exp:
        if (digit(c)) return;
        state_ = S::After;
        return after(c, at);
    }
  }

  std::string stack_;
  S state_ = S::Value;
  bool key_ = false, array_start_ = false;
  int utf8_left_ = 0, hex_left_ = 0;
  unsigned char lo_ = 0x80, hi_ = 0xBF;
  const char* lit_ = nullptr;
};

}  // namespace attnprof::trace_reading
