// Uses only the installed public headers, as the README shows: compares two
// CPU backends on a small problem through the library's one call, and checks
// that they ran, were read by the rules and matched float64. From a CUDA
// build's install, it also probes the GPU: the CUDA plugin must be found
// (through the RUNPATH the package gave this program), whatever the machine.
#include <attnprof/error.h>
#include <attnprof/report.h>
#include <attnprof/runner.h>

#include <cstdio>
#include <string>

int main() {
  using namespace attnprof;
  Problem p;
  p.device = Device::Cpu;
  p.batch = 1;
  p.heads = 2;
  p.seq = 64;
  p.head_dim = 64;
  p.normalize().validate();
  PipelineOptions o;
  o.run.schedule = {.wait = 0, .warmup = 1, .active = 1, .repeat = 1};
  const PipelineReport rep = compare(p, o, {"naive", "flash"});
  if (rep.results.size() != 2 || !rep.accepted()) {
    std::fprintf(stderr, "consumer: the comparison did not come back whole\n");
    return 1;
  }
  for (const RunResult& r : rep.results) {
    if (r.metrics.steps != 1 || !r.error) {
      std::fprintf(stderr, "consumer: %s did not run: %s\n", r.backend.c_str(), r.failure ? r.failure->c_str() : "");
      return 1;
    }
    std::printf("consumer: %s ran, rel error %.2e, %zu findings%s%s\n", r.backend.c_str(), r.error->rel,
                r.findings.size(),
                r.findings.empty() ? "" : ", first: ", r.findings.empty() ? "" : r.findings.front().rule.c_str());
  }
  if (rep.results[0].findings.empty()) return 1;  // naive's hidden copy is always found
  if (cuda_built()) {
    try {
      std::printf("consumer: CUDA usable: %s\n", device_runtime(Device::Cuda).description().c_str());
    } catch (const Error& e) {
      // No driver or no GPU is this machine's business; a plugin not found is the install's.
      if (std::string(e.what()).find("looked in") != std::string::npos) {
        std::fprintf(stderr, "consumer: the CUDA plugin was not found: %s\n", e.what());
        return 1;
      }
      std::printf("consumer: CUDA probed, not usable here: %s\n", e.what());
    }
  }
  return 0;
}
