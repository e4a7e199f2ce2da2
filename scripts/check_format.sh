#!/usr/bin/env bash
# Fails, naming the files, when a tracked C++ or CUDA source differs from what
# clang-format (.clang-format at the root) would write. A CTest test runs it,
# so the README's test command and CI check formatting; fix with
#   clang-format -i $(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh')
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "check_format: clang-format is not installed (scripts/setup.sh installs it)" >&2; exit 1; }
mapfile -t files < <(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh')
((${#files[@]})) || { echo "check_format: no sources found (not a git checkout?)" >&2; exit 1; }
clang-format --dry-run --Werror "${files[@]}"
echo "check_format: ${#files[@]} files clean ($(clang-format --version))"
