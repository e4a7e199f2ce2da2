// attnprof: profile, compare and explain attention backends; analyze and diff traces.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <new>

#include "attnprof/error.h"
#include "attnprof/problem_spec.h"
#include "attnprof/runner.h"
#include "attnprof/trace_io.h"
#include "cli/args.h"
#include "cli/commands.h"

namespace {

using namespace attnprof;

// The device a run goes to when --device is not given: the GPU when one is
// usable, else the CPU; and the default shape for it.
void resolve_defaults(cli::Options& o) {
  Problem& p = o.problem;
  if (!o.device_given && o.gpus > 0) {
    p.device = Device::Cuda;  // --gpus is for GPUs: refused there with the reason if none
  } else if (!o.device_given) {
    p.device = Device::Cpu;
    if (cuda_built()) {
      try {
        device_runtime(Device::Cuda);
        p.device = Device::Cuda;
      } catch (const Error&) {  // no usable GPU: the CPU it is
      }
    }
  }
  fill_device_defaults(p).normalize().validate();
}

// What a command printed reached standard output: a full disk or a closed
// stdout is an error, never exit 0 with the tables lost.
int stdout_written(int rc) {
  errno = 0;
  std::cout.flush();
  const bool lost = !std::cout || std::fflush(stdout) != 0 || std::ferror(stdout);
  if (!lost) return rc;
  std::fprintf(stderr, "attnprof: cannot write to standard output (%s)\n",
               errno != 0 ? std::strerror(errno) : "a write failed");
  return rc == cli::kExitOk ? cli::kExitError : rc;
}

int run(int argc, char** argv) {
  try {
    cli::Options o = cli::parse(argc, argv);
    if (o.help) {
      std::fputs(cli::command_help(o.command).c_str(), stdout);
      return cli::kExitOk;
    }
    if (o.command == "analyze") return cli::run_analyze(o);
    if (o.command == "diff") return cli::run_diff(o);
    resolve_defaults(o);
    cli::load_mask_file(o);
    if (o.command == "profile") return cli::run_profile(o);
    if (o.command == "compare") return cli::run_compare(o);
    return cli::run_explain(o);
  } catch (const Error& e) {
    std::fprintf(stderr, "attnprof: %s\n", cli::flag_message(e).c_str());
    if (e.kind() == ErrorKind::BadInput) return cli::kExitBadInput;
    return e.kind() == ErrorKind::InvalidArgument ? cli::kExitUsage : cli::kExitError;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "attnprof: out of memory: use a smaller --batch, --heads or --seq\n");
    return cli::kExitError;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attnprof: internal error: %s\n", e.what());
    return cli::kExitError;
  }
}

}  // namespace

int main(int argc, char** argv) {
  // OpenMP threads that spin between parallel regions starve OpenBLAS's
  // threads on small machines, so they sleep instead unless the user says
  // otherwise. The OpenMP runtime reads its environment when it loads, before
  // main, hence the one re-exec with the variable set.
  if (!std::getenv("OMP_WAIT_POLICY")) {
    ::setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    ::execv("/proc/self/exe", argv);  // returns only on failure: carry on as we are
  }
  remove_temporaries_on_signals();
  return stdout_written(run(argc, argv));
}
