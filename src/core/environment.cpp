// attnprof/environment.h.
#include "attnprof/environment.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "attnprof/error.h"
#include "attnprof/problem_spec.h"

namespace attnprof {

std::optional<double> environment_real(const char* name, double max, std::string_view unit) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  const double v = parse_real(name, text);  // refuses "5x", hex, NaN and what overflows, naming the variable
  if (!(v > 0) || v > max) {
    char bound[32];
    std::snprintf(bound, sizeof bound, "%g", max);
    fail(ErrorKind::InvalidArgument, std::string(name) + "=" + text + ": give a number above 0 and at most " + bound +
                                         " " + std::string(unit) + ", or unset it");
  }
  return v;
}

}  // namespace attnprof
