// analyze --replay: each distinct attention problem a trace holds (its
// calls' pass, shapes, mask, dtype and scale, attnprof/analyze.h's
// AttentionCall) run through every attnprof backend that can take it on this
// machine, each measured as compare measures it (attnprof/runner.h), and set
// against the time the trace spent on it. The results land in the
// analysis's TraceReplay, which the text, JSON and HTML of analyze show.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "attnprof/analyze.h"
#include "attnprof/runner.h"

namespace attnprof {

// The replay's runs: a short schedule (one warm-up, three recorded calls) and
// 8 unprofiled calls on a GPU: many problems, each one a few calls.
inline RunOptions replay_run_options() {
  RunOptions r;
  r.schedule = {.wait = 0, .warmup = 1, .active = 3, .repeat = 1};
  r.unprofiled_calls = 8;
  return r;
}

struct ReplayOptions {
  // Where to replay. Unset: the trace's own device when this machine has it;
  // else nothing runs and TraceReplay::note says how to ask (a CUDA trace on
  // a CPU-only machine is replayed on the CPU only when asked).
  std::optional<Device> device;
  // The runs' schedule, seed, threads, float64 check; progress is called
  // with one line per backend run.
  RunOptions run = replay_run_options();
  std::vector<std::string> backends;  // only these (empty: every eligible one)
  // A CPU replay skips a problem above this many GFLOP per call, with a
  // line saying so (the CPU's slower backends would take minutes on it).
  double cpu_max_gflop = 2.0;
  // No replay at all past this many distinct problems (the rest listed, skipped).
  int max_problems = 32;
};

// Fills a.replay. Never throws for a problem that cannot run: each is one
// line in its ReplayProblem (or TraceReplay::note for the device).
void replay_attention(TraceAnalysis& a, const ReplayOptions& options = {});

}  // namespace attnprof
