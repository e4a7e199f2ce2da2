#!/usr/bin/env bash
# Builds and runs our fused attention kernels outside the project's CMake:
#   scripts/fused_dev.sh build     # nvcc: test binary (GoogleTest) + timing harness into build/fused_dev
#   scripts/fused_dev.sh test      # correctness against the float64 reference
#   scripts/fused_dev.sh sanitize  # compute-sanitizer memcheck + racecheck on small cases
#   scripts/fused_dev.sh bench     # timing table (scripts/fused_dev_main.cu)
# Several steps may be given in one call: scripts/fused_dev.sh build test bench
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
OUT_DIR=build/fused_dev
FLAGS=(-std=c++20 -O3 -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90a,code=sm_90a
       --expt-relaxed-constexpr -Isrc -Iinclude)

# Compiles $1 to $OUT_DIR/<name>.o unless the object is newer than it and every kernel header.
compile() {
  local src=$1 obj="$OUT_DIR/$(basename "$1" .cu).o"
  if [[ -f "$obj" && -z "$(find "$src" src/backends/cuda -newer "$obj" -name '*.cu*' -o -newer "$obj" -name '*.h')" ]]; then
    return 0
  fi
  "$NVCC" "${FLAGS[@]}" -Xptxas=-v -c "$src" -o "$obj" > "$OUT_DIR/$(basename "$src" .cu).ptxas.log" 2>&1 ||
    { cat "$OUT_DIR/$(basename "$src" .cu).ptxas.log" | grep -v '^ptxas' >&2; return 1; }
}

build() {
  mkdir -p "$OUT_DIR"
  local pids=() status=0
  for src in src/backends/cuda/flash_launch.cu src/backends/cuda/efficient_launch.cu \
             tests/gpu/fused_kernels_test.cu scripts/fused_dev_main.cu; do
    compile "$src" & pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || status=1; done
  [[ $status == 0 ]] || { echo "build failed" >&2; exit 1; }
  "$NVCC" "${FLAGS[@]}" "$OUT_DIR/fused_kernels_test.o" "$OUT_DIR/flash_launch.o" "$OUT_DIR/efficient_launch.o" \
    -o "$OUT_DIR/fused_kernels_test" -lgtest -lgtest_main -lpthread
  "$NVCC" "${FLAGS[@]}" "$OUT_DIR/fused_dev_main.o" "$OUT_DIR/flash_launch.o" "$OUT_DIR/efficient_launch.o" \
    -o "$OUT_DIR/fused_dev_main"
  grep -hE "Function properties|registers|spill" "$OUT_DIR"/*.ptxas.log | paste - - - |
    sed -E 's/ptxas info *: //g; s/Function properties for //' > "$OUT_DIR/resources.txt" || true
}

for step in "$@"; do
  case "$step" in
    build) build ;;
    test) "$OUT_DIR/fused_kernels_test" --gtest_brief=1 ;;
    sanitize)
      filter='All/FusedKernels.*d64_causal_200:All/FusedKernels.*bottomright_q333_k200:All/FusedKernels.*window17*:All/FusedKernels.*bshd_gqa*'
      compute-sanitizer --tool memcheck --error-exitcode 3 "$OUT_DIR/fused_kernels_test" --gtest_filter="$filter" --gtest_brief=1
      compute-sanitizer --tool racecheck --error-exitcode 4 "$OUT_DIR/fused_kernels_test" --gtest_filter="$filter" --gtest_brief=1
      ;;
    bench) "$OUT_DIR/fused_dev_main" ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
