// Backend lookup, eligibility and the `auto` choice.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "attnprof/backend.h"

namespace attnprof {

// The backend object for (name, device), or null when this build has none
// (a GPU-only backend on the CPU, or CUDA backends in a CPU-only build).
Backend* find_backend(std::string_view name, Device d);

struct Explanation {
  std::string backend;
  bool eligible = false;
  std::string reason;
};

// Every backend name, with whether it can take `p` and why (GPU-only backends
// on the CPU answer "not eligible on CPU: ...").
std::vector<Explanation> explain(const Problem& p);

// `auto`: the fastest eligible backend for `p`, measured once per problem and
// cached; `measure` runs a backend and returns its time per forward (us).
struct AutoChoice {
  std::string backend;
  std::string reason;
};
AutoChoice choose_auto(const Problem& p);

bool cuda_built();  // compiled with CUDA support

}  // namespace attnprof
