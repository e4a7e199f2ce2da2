// The checking mode (attnprof/check_inputs.h).
#include "attnprof/check_inputs.h"

#include <cstdlib>
#include <cstring>

namespace attnprof {
namespace {

// -1: no scope on this thread, the environment decides; 0 or 1: a scope's.
thread_local int scoped = -1;

bool from_environment() {
  static const bool on = [] {
    const char* v = std::getenv("ATTNPROF_CHECK_INPUTS");
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  }();
  return on;
}

}  // namespace

bool checking_inputs() { return scoped >= 0 ? scoped == 1 : from_environment(); }

int exchange_checking_inputs(int setting) {
  const int previous = scoped;
  scoped = setting < 0 ? -1 : setting > 0 ? 1 : 0;
  return previous;
}

CheckingInputs::CheckingInputs(bool on) : previous_(scoped) { scoped = on ? 1 : 0; }

CheckingInputs::~CheckingInputs() { scoped = previous_; }

}  // namespace attnprof
