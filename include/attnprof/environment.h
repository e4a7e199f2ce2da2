// The measuring variables that give a number (ATTNPROF_CEILING_TFLOPS,
// ATTNPROF_COPY_GBS): read one way by every reader, and refused in one line
// when set to something that is not one, never taken in part ("5x" as 5) or
// ignored.
#pragma once

#include <optional>
#include <string_view>

namespace attnprof {

// The ceilings' bounds, for the variables and the flags alike: a figure past them is a typo.
inline constexpr double kMaxCeilingTflops = 1e6;
inline constexpr double kMaxCopyGbs = 1e7;

// Unset or empty: nullopt. Else a decimal number above 0 and at most `max`
// (in `unit`), or Error(InvalidArgument) naming the variable and its value.
std::optional<double> environment_real(const char* name, double max, std::string_view unit);

}  // namespace attnprof
