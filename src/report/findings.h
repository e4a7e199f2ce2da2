// "What the trace shows": rules that read the recorded events the way the
// reference study read its traces, one finding per rule that fires.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "attnprof/runner.h"

namespace attnprof::report {

// A user's own guess, stated on the command line: device activities per
// forward on a GPU, CPU ops per forward on the CPU.
using Guesses = std::map<std::string, int, std::less<>>;

// Rules that read one run's trace. `all` holds the other backends of the same
// comparison (for cross-backend rules such as memory against naive); may be empty.
std::vector<std::string> findings(const RunResult& r, const std::vector<RunResult>& all, const Guesses& guesses);

// Applies the DESIGN.md acceptance rule with math's error when math ran.
void apply_acceptance(std::vector<RunResult>& results);

}  // namespace attnprof::report
