// Uses only the installed public headers: profiles one CPU backend on a small
// problem and checks that it ran, was counted and matched float64.
#include <attnprof/dispatch.h>
#include <attnprof/runner.h>

#include <cstdio>

int main() {
  using namespace attnprof;
  Problem p;
  p.device = Device::Cpu;
  p.batch = 1;
  p.heads = 2;
  p.seq = 64;
  p.head_dim = 64;
  p.normalize().validate();
  Backend* b = find_backend("naive", Device::Cpu);
  if (!b) {
    std::fprintf(stderr, "consumer: no naive backend\n");
    return 1;
  }
  RunOptions o;
  o.schedule = {.wait = 0, .warmup = 1, .active = 1, .repeat = 1};
  const RunResult r = run_backend(*b, p, o);
  if (r.failure || r.metrics.steps != 1 || r.metrics.ops_per_forward < 3 || !r.acceptance || !r.acceptance->pass) {
    std::fprintf(stderr, "consumer: the run did not come back whole: %s\n", r.failure ? r.failure->c_str() : "");
    return 1;
  }
  std::printf("consumer: naive ran, %.0f ops per forward, rel error %.2e\n", r.metrics.ops_per_forward, r.error->rel);
  return 0;
}
