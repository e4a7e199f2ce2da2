// The commands. Each returns the process exit code and throws
// attnprof::Error for a problem the user can fix.
#pragma once

#include "cli/args.h"

namespace attnprof::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitInaccurate = 3;  // a backend's error was over tolerance
inline constexpr int kExitBadInput = 4;    // a trace that cannot be read

int run_profile(const Options& o);
int run_compare(const Options& o);
int run_explain(const Options& o);
int run_analyze(const Options& o);
int run_diff(const Options& o);

}  // namespace attnprof::cli
