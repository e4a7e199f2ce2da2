// Findings as records: what a rule read in a trace, the events it cites and
// the figures behind its sentence. The tables print the text; JSON, an HTML
// report and Python read the whole record (one data model, Kineto's layering).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace attnprof {

enum class Severity : std::uint8_t {
  Info,     // what the trace shows, neither good nor bad ("one fused kernel")
  Warning,  // work that costs time or memory and could be avoided ("hidden copy")
  Error,    // the output is wrong somewhere (NaN rows)
};

constexpr std::string_view severity_name(Severity s) {
  constexpr std::array<std::string_view, 3> kNames{"info", "warning", "error"};  // the enum's order
  return kNames[static_cast<std::size_t>(s)];
}

// One event a finding cites, with enough of it to draw or look up without the
// trace: times as the Chrome trace writes them (microseconds from its base).
struct EventRef {
  std::int64_t index = -1;  // into Trace::activities
  std::string name;         // as recorded
  std::string category;     // the Chrome trace "cat": cpu_op, kernel, gpu_memcpy, cuda_runtime ...
  double ts_us = 0;         // start, from the trace's base time
  double dur_us = 0;
  std::uint64_t correlation = 0;  // launch <-> device activity; 0 where none
};

// A user's own guesses, by backend ("guess first, then look"): device
// activities per forward on a GPU, CPU ops per forward on the CPU.
using Guesses = std::map<std::string, int, std::less<>>;

struct Finding {
  std::string rule;  // the rule's id in the rule table ("hidden-copy")
  Severity severity = Severity::Info;
  std::string text;                       // the sentence the tables print
  std::vector<EventRef> evidence;         // the events it read (capped; figures hold the counts)
  std::map<std::string, double> figures;  // the numbers behind the text ("copies_per_forward": 1)
};

}  // namespace attnprof
