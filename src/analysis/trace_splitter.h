// Stage 1 of the Chrome trace reader (trace_reader.cpp): a byte scanner that
// walks the document a chunk at a time and hands on each element of
// "traceEvents" and each top-level value the reader wants, as text. It tracks
// only strings and nesting, so it runs at memory speed and keeps at most one
// event in memory. Internal to the analysis layer.
#pragma once

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

#include "analysis/format.h"
#include "analysis/json_value_checker.h"
#include "analysis/trace_unreadable.h"
#include "attnprof/trace_reader.h"
#include "profiler/trace_schema.h"

namespace attnprof::trace_reading {

namespace sc = schema;

class Splitter {
 public:
  struct Sink {
    virtual ~Sink() = default;
    virtual void event(std::string& text, std::uint64_t index) = 0;
    virtual void top_level(std::string_view key, std::string& text) = 0;
  };

  Splitter(Sink& sink, const TraceReadOptions& o) : sink_(sink), o_(o) {}

  void feed(const char* p, std::size_t n) {
    std::size_t i = 0;
    vstart_ = 0;
    while (i < n) i = step(p, n, i);
    if (state_ == State::Value && capture_) keep(p, vstart_, n);
    if (state_ == State::Key) key_.append(p + kstart_, n - kstart_);
    kstart_ = 0;
    offset_ += n;
  }

  void finish() {
    // A number at the very end of the input ends there.
    if (state_ == State::Value && !in_string_ && kind_ == Kind::Scalar && depth_ == level_) complete(offset_);
    if (state_ == State::Start) refuse("empty file: no JSON in it");
    if (state_ == State::Done) {
      if (!saw_events_) refuse("not a Chrome trace: no \"traceEvents\" array");
      return;
    }
    if (in_events_ || (state_ == State::Value && target_ == Target::Event)) {
      refuse("truncated: the file ends inside \"traceEvents\" after " + std::to_string(events_) + " events");
    }
    refuse("truncated: the file ends before the JSON document does");
  }

  std::uint64_t events() const { return events_; }

 private:
  enum class State { Start, Key, Colon, ObjValue, ObjAfter, ExpectKey, ArrElem, ArrAfter, Value, Done };
  enum class Kind { Container, String, Scalar };
  enum class Target { Event, TopLevel, Skip };

  static bool space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

  std::string where(std::size_t i) const { return byte_at(offset_ + i); }

  [[noreturn]] void unexpected(const char* p, std::size_t i, const char* wanted) const {
    const unsigned char c = static_cast<unsigned char>(p[i]);
    std::string found;
    if (c >= 0x20 && c < 0x7f) {
      found = std::string("'") + static_cast<char>(c) + "'";
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x", static_cast<unsigned>(c));
      found = std::string("byte ") + hex;
    }
    // What the first byte of a file says it is, when it is no JSON.
    if (offset_ + i == 0 && state_ == State::Start) {
      if (c == 0x00) found += " (a NUL: a binary or zero-filled file, not a trace)";
      if (c == 0x1f) found += " (a gzip stream inside the gzip stream: decompress it once more)";
      if (c == 0xff || c == 0xfe) found += " (UTF-16 text: a trace is UTF-8)";
    }
    refuse("not JSON: expected " + std::string(wanted) + " " + where(i) + ", found " + found);
  }

  void keep(const char* p, std::size_t from, std::size_t to) {
    // Every value is checked whole: simdjson's On-Demand parse of an event
    // skips the fields we do not read without checking them. Only the bytes
    // up to the size limit are checked, so that a value both too large and
    // malformed is refused for the same fault wherever the chunks end.
    const std::size_t room =
        target_ == Target::Skip ? to - from : std::min(to - from, o_.max_event_bytes - text_.size());
    checked([&] { checker_.feed(p + from, room, offset_ + from); });
    if (target_ == Target::Skip) return;  // not kept

    if (room < to - from) {
      refuse((target_ == Target::Event ? "event " + std::to_string(events_) : "\"" + key_ + "\"") + " is larger than " +
             size_str(o_.max_event_bytes));
    }
    text_.append(p + from, room);
  }

  // The checker's refusal, named by the event it is in.
  template <class F>
  void checked(F&& f) {
    if (target_ != Target::Event) return f();
    try {
      f();
    } catch (const Unreadable& u) {
      refuse("event " + std::to_string(events_) + ": " + u.why);
    }
  }

  void deeper(const char* p, std::size_t i) {
    if (++depth_ > o_.max_depth) refuse("nested deeper than " + std::to_string(o_.max_depth) + " levels " + where(i));
    (void)p;
  }

  // A value begins at p[i] inside a container at depth_; the caller's state
  // resumes after it.
  void begin_value(const char* p, std::size_t i, Target target, State resume) {
    state_ = State::Value;
    target_ = target;
    resume_ = resume;
    capture_ = true;  // kept, or for a skipped value checked (keep)
    level_ = depth_;
    vstart_ = i;
    text_.clear();
    checker_.reset();
    const char c = p[i];
    if (c == '{' || c == '[') {
      kind_ = Kind::Container;
      deeper(p, i);
    } else if (c == '"') {
      kind_ = Kind::String;
      in_string_ = true;
    } else if (c == '}' || c == ']' || c == ',' || c == ':') {
      unexpected(p, i, "a value");
    } else {
      kind_ = Kind::Scalar;
    }
  }

  // The value ends before document offset `end`, where a refusal names it
  // (not the start of the chunk that holds its end).
  void complete(std::uint64_t end) {
    state_ = resume_;
    checked([&] { checker_.finish(end); });
    if (target_ == Target::Event) {
      if (++events_ > o_.max_events) refuse("more than " + std::to_string(o_.max_events) + " events");
      sink_.event(text_, events_ - 1);
    } else if (target_ == Target::TopLevel) {
      sink_.top_level(key_, text_);
    }
  }

  // Consumes one or more bytes from p[i]; returns the next position.
  std::size_t step(const char* p, std::size_t n, std::size_t i) {
    const char c = p[i];
    switch (state_) {
      case State::Start:
        if (space(c)) return i + 1;
        if (offset_ + i == 0 && static_cast<unsigned char>(c) == 0xEF) {  // a UTF-8 byte order mark
          bom_ = 1;
          return i + 1;
        }
        if (bom_ > 0 && bom_ < 3) {  // the rest of the mark, EF BB BF, and nothing else
          if (static_cast<unsigned char>(c) != (bom_ == 1 ? 0xBB : 0xBF)) unexpected(p, i, "a UTF-8 byte order mark");
          ++bom_;
          return i + 1;
        }
        if (c == '{') {
          deeper(p, i);
          state_ = State::ExpectKey;
          return i + 1;
        }
        if (c == '[') {  // the JSON Array Format: a bare list of events
          deeper(p, i);
          saw_events_ = in_events_ = true;
          state_ = State::ArrElem;
          return i + 1;
        }
        unexpected(p, i, "'{' (a Chrome trace is a JSON object)");
      case State::ExpectKey:
        if (space(c)) return i + 1;
        if (c == '"') {
          state_ = State::Key;
          key_.clear();
          kstart_ = i + 1;
          key_at_ = offset_ + i + 1;
          return i + 1;
        }
        if (c == '}' && !after_comma_) return close_top(i);
        unexpected(p, i, "a key");
      case State::Key: {
        if (key_escape_pending_) {  // the byte after a backslash, maybe in the next chunk
          if (!std::strchr("\"\\/bfnrtu", c) || c == 0) unexpected(p, i, "an escape ('\\\"', '\\n', ...)");
          key_ += c;
          key_escape_pending_ = false;
          kstart_ = i + 1;
          return i + 1;
        }
        std::size_t j = i;
        while (j < n && p[j] != '"' && p[j] != '\\') ++j;
        if (j == n) return n;  // feed() keeps the partial key
        key_.append(p + kstart_, j - kstart_);
        if (key_.size() > 4096) refuse("a key longer than 4096 bytes " + byte_at(key_at_));
        if (p[j] == '\\') {
          key_escape_ = key_escape_pending_ = true;  // an escaped key is none of the keys we read
          kstart_ = j + 1;
          return j + 1;
        }
        check_key();
        state_ = State::Colon;
        after_comma_ = false;
        return j + 1;
      }
      case State::Colon:
        if (space(c)) return i + 1;
        if (c != ':') unexpected(p, i, "':'");
        state_ = State::ObjValue;
        return i + 1;
      case State::ObjValue:
        if (space(c)) return i + 1;
        if (key_ == sc::kTraceEvents && !key_escape_) {
          if (c != '[') refuse("\"traceEvents\" is not an array " + where(i));
          if (saw_events_) refuse("a second \"traceEvents\" array " + where(i));
          deeper(p, i);
          saw_events_ = in_events_ = true;
          state_ = State::ArrElem;
          return i + 1;
        }
        begin_value(p, i, wanted(key_) ? Target::TopLevel : Target::Skip, State::ObjAfter);
        key_escape_ = false;
        return i + 1;
      case State::ObjAfter:
        if (space(c)) return i + 1;
        if (c == ',') {
          state_ = State::ExpectKey;
          after_comma_ = true;
          return i + 1;
        }
        if (c == '}') return close_top(i);
        unexpected(p, i, "',' or '}'");
      case State::ArrElem:
        if (space(c)) return i + 1;
        if (c == ']' && !after_comma_) return close_events(i);
        after_comma_ = false;
        begin_value(p, i, Target::Event, State::ArrAfter);
        return i + 1;
      case State::ArrAfter:
        if (space(c)) return i + 1;
        if (c == ',') {
          state_ = State::ArrElem;
          after_comma_ = true;
          return i + 1;
        }
        if (c == ']') return close_events(i);
        unexpected(p, i, "',' or ']' between events");
      case State::Value:
        return value_step(p, n, i);
      case State::Done:
        if (space(c)) return i + 1;
        unexpected(p, i, "nothing after the end of the trace");
    }
    return i + 1;
  }

  std::size_t close_top(std::size_t i) {
    --depth_;
    state_ = State::Done;
    after_comma_ = false;
    return i + 1;
  }

  std::size_t close_events(std::size_t i) {
    --depth_;
    in_events_ = false;
    after_comma_ = false;
    state_ = depth_ == 0 ? State::Done : State::ObjAfter;
    return i + 1;
  }

  std::size_t value_step(const char* p, std::size_t n, std::size_t i) {
    after_comma_ = false;
    if (in_string_) {
      if (escape_) {
        escape_ = false;
        return i + 1;
      }
      std::size_t j = i;
      while (j < n && p[j] != '"' && p[j] != '\\') ++j;
      if (j == n) return n;
      if (p[j] == '\\') {
        escape_ = true;
        return j + 1;
      }
      in_string_ = false;
      if (kind_ == Kind::String && depth_ == level_) {
        if (capture_) keep(p, vstart_, j + 1);
        complete(offset_ + j + 1);
      }
      return j + 1;
    }
    const char c = p[i];
    switch (c) {
      case '"':
        in_string_ = true;
        return i + 1;
      case '{':
      case '[':
        // The checker reads the value's bytes before this one first: a
        // fault there is the one named, as when a chunk ended before it.
        if ((kind_ == Kind::Scalar || depth_ >= o_.max_depth) && capture_) keep(p, vstart_, i);
        if (kind_ == Kind::Scalar) unexpected(p, i, "',' after a value");
        deeper(p, i);
        return i + 1;
      case '}':
      case ']':
        if (depth_ == level_) {  // a scalar ends at its container's close
          if (capture_) keep(p, vstart_, i);
          complete(offset_ + i);
          return i;  // the container's state reads the close
        }
        --depth_;
        if (depth_ == level_) {
          if (capture_) keep(p, vstart_, i + 1);
          complete(offset_ + i + 1);
        }
        return i + 1;
      case ',':
        if (depth_ == level_) {
          if (capture_) keep(p, vstart_, i);
          complete(offset_ + i);
          return i;
        }
        return i + 1;
      default:
        if (space(c) && depth_ == level_) {
          if (capture_) keep(p, vstart_, i);
          complete(offset_ + i);
        }
        return i + 1;
    }
  }

  // A top-level key: UTF-8 with no control characters (its escapes were
  // checked as they were read).
  void check_key() const {
    ValueChecker k;
    std::string quoted = "\"";
    for (const char ch : key_) quoted += (ch == '"' || ch == '\\') ? ' ' : ch;
    quoted += '"';
    try {
      k.feed(quoted.data(), quoted.size(), 0);
      k.finish(0);
    } catch (const Unreadable&) {
      refuse("not JSON: a key that is not valid UTF-8 or holds a control character " + byte_at(key_at_));
    }
  }

  static bool wanted(const std::string& key) {
    return key == sc::kDeviceProperties || key == sc::kBaseTimeNanoseconds || key == sc::kTraceName ||
           key == sc::kCollectorNote;
  }

  Sink& sink_;
  const TraceReadOptions& o_;
  State state_ = State::Start, resume_ = State::Done;
  Kind kind_ = Kind::Scalar;
  Target target_ = Target::Skip;
  bool capture_ = false, in_string_ = false, escape_ = false, in_events_ = false, saw_events_ = false;
  bool after_comma_ = false, key_escape_ = false, key_escape_pending_ = false;
  int depth_ = 0, level_ = 0, bom_ = 0;
  std::size_t vstart_ = 0, kstart_ = 0;
  std::uint64_t offset_ = 0, events_ = 0;
  // Where the key being read starts: a refusal names it there, not at the
  // chunk (or escape) its reading resumed from, which depends on the reads.
  std::uint64_t key_at_ = 0;
  std::string key_, text_;
  ValueChecker checker_;
};

}  // namespace attnprof::trace_reading
