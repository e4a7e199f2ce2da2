// Command-line parsing: the flags shared by profile, compare and explain.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "attnprof/error.h"
#include "attnprof/findings.h"
#include "attnprof/key_averages.h"
#include "attnprof/problem.h"
#include "attnprof/profiler.h"
#include "attnprof/runner.h"

namespace attnprof::cli {

struct Options {
  std::string command;  // profile, compare, explain, analyze, diff
  Problem problem;
  bool device_given = false;
  bool shape_given = false;           // any of batch/heads/seq/head_dim/dtype/mask set
  std::string backend;                // profile
  std::vector<std::string> backends;  // compare --backends
  // The library's option structs themselves, defaults and all: --wait,
  // --warmup, --active, --repeat, --seed, --threads, --layout (bshd_inputs),
  // --check-rows, --unprofiled-calls, --fp8-descale and --mask-file's tensor
  // (mask) land in `run`; --sort and --row-limit in `table`. The commands add
  // only the progress line.
  RunOptions run;
  TableOptions table;
  std::string trace_dir = "traces";
  bool fp8_descale_given = false;
  int gpus = 0;  // --gpus N: ring attention over N GPUs (0: not given)
  std::optional<std::string> json_path;
  std::optional<std::string> html_path;  // compare, profile
  Guesses guesses;
  bool help = false;
  bool quiet = false;
  // analyze and diff: the traces, and the --step given after each (diff: a
  // --step applies to the trace before it; one trace with two steps compares
  // the two steps).
  std::vector<std::string> traces;
  std::vector<std::optional<int>> trace_steps;
  int top = 10;     // rows of the per-op and per-kernel tables
  int max_gib = 4;  // --max-gib: the most JSON a trace may inflate to
  // --mask-file PATH: a .npy boolean or float mask in place of the generated
  // one; read once the problem is known (load_mask_file), into run.mask.
  std::optional<std::string> mask_file;
  // analyze --replay: the trace's attention problems run here; --device
  // (device_given, problem.device) picks where, --backends which.
  bool replay = false;
  std::optional<double> ceiling_tflops;  // analyze/diff --ceiling-tflops (else ATTNPROF_CEILING_TFLOPS)
  double replay_max_gflop = 2.0;         // --replay-max-gflop: CPU replays skip problems above it
};

// Reads o.mask_file (when given) against the finished problem: its dtype
// sets the mask kind (bool: boolean, float: bias), its shape must broadcast
// to [B, H, S, Skv]. A file that cannot be read throws Error(BadInput), a
// mask that does not fit the problem Error(InvalidArgument), both one line.
void load_mask_file(Options& o);

// Throws Error(InvalidArgument) with a one-line message for any bad flag.
Options parse(int argc, char** argv);

// An error's message in the CLI's terms: the library names fields
// ("head_dim must be positive", "use pass=forward"); the user typed flags
// ("--head-dim", "--pass forward"). The one table of fields and flags is
// args.cpp's.
std::string flag_message(const Error& e);

// The --help text (help.cpp).
std::string usage();  // top-level --help
std::string command_help(const std::string& command);

}  // namespace attnprof::cli
