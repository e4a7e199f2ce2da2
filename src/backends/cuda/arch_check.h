#pragma once

#include <string>

namespace attnprof::cuda {

// Empty when the current GPU can run this build's kernels; else a one-line
// reason naming the architecture to build for.
std::string arch_unsupported_reason();

}  // namespace attnprof::cuda
