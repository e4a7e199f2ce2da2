#!/usr/bin/env bash
# The sm90a flash kernels keep their wgmma asynchronous: ptxas reports
# "(C7512) Potential Performance Loss: wgmma.mma_async instructions are
# serialized" when a kernel's in-flight accumulators do not fit its
# registers, and then waits on every wgmma before the next. That cost the
# head dim 192 backward every overlap for two sessions before anyone read
# the build log (docs/perf/issue21-2026-12-03.md); this test reads it.
# Compiles each sm90 flash translation unit (forward, FP8 forward, backward)
# for sm_90a, several at once, and fails on any C7512, naming the kernels.
#   check_wgmma.sh NVCC SOURCE_DIR
set -uo pipefail
nvcc=$1 src=$2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
units=$(ls "$src"/src/backends/cuda/instantiations/flash_fwd_sm90_*.cu "$src"/src/backends/cuda/instantiations/flash_bwd_sm90_*.cu)
compile() {  # one unit: ptxas's messages into $out/<name>.txt
  local name
  name=$(basename "$1" .cu)
  if ! "$nvcc" -std=c++20 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
    -I"$src/src" -I"$src/include" -c "$1" -o "$out/$name.o" >"$out/$name.txt" 2>&1; then
    echo "check_wgmma: $name did not compile:" >&2
    head -20 "$out/$name.txt" >&2
    return 1
  fi
}
export -f compile
export nvcc src out
printf '%s\n' $units | xargs -P "$(nproc)" -I{} bash -c 'compile {}' || exit 1
bad=$(grep -h 'C7512' "$out"/*.txt | grep -oE "for the function '[^']+'" | sort -u)
n=$(printf '%s\n' $units | wc -l)
if [[ -n $bad ]]; then
  echo "check_wgmma: ptxas serialized the wgmmas of $(echo "$bad" | wc -l) kernel(s) (C7512):"
  echo "$bad" | sed "s/for the function '//; s/'\$//" | (c++filt 2>/dev/null || cat) | head -5 | sed 's/^/  /'
  [[ $(echo "$bad" | wc -l) -gt 5 ]] && echo "  ... and $(($(echo "$bad" | wc -l) - 5)) more"
  exit 1
fi
echo "check_wgmma: $n sm90 units, no serialized wgmma"
