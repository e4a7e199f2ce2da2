// The report's tables format numbers as the findings do.
#pragma once

#include "analysis/format.h"

namespace attnprof::report {
using analysis::format;
using analysis::mib;
}  // namespace attnprof::report
