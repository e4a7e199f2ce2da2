#!/usr/bin/env bash
# Builds and runs flash's FP8 forward on its own (scripts/fp8_dev_main.cu): the host entry
# (flash_fp8_launch.cu), its kernel TU and the harness's Cfg variants, with nvcc for sm_90a, into
# build/fp8dev (carry that folder to the GPU machine):
#   scripts/fp8_dev.sh build      # here: nvcc, about a minute
#   scripts/fp8_dev.sh run        # there: timing table and sampled float64 checks
#   scripts/fp8_dev.sh sanitize   # there: compute-sanitizer memcheck + racecheck on the ragged shape
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT_DIR:-build/fp8dev}
flags=(-std=c++20 -O3 -I src -I include --expt-relaxed-constexpr -lineinfo
  "--generate-code=arch=compute_90a,code=[sm_90a]")
for step in "$@"; do
  case "$step" in
    build)
      mkdir -p "$OUT_DIR"
      for f in src/backends/cuda/launch/flash_fp8_launch.cu src/backends/cuda/instantiations/flash_fwd_sm90_fp8_hdim128.cu scripts/fp8_dev_main.cu; do
        nvcc "${flags[@]}" -c "$f" -o "$OUT_DIR/$(basename "$f").o"
      done
      nvcc -o "$OUT_DIR/fp8_dev_main" "$OUT_DIR"/*.o -lcuda
      ;;
    run) "$OUT_DIR/fp8_dev_main" ;;
    sanitize)
      FP8_DEV_SMALL=1 compute-sanitizer --tool memcheck --error-exitcode 3 "$OUT_DIR/fp8_dev_main"
      FP8_DEV_SMALL=1 compute-sanitizer --tool racecheck --error-exitcode 4 "$OUT_DIR/fp8_dev_main"
      ;;
    *) echo "fp8_dev.sh: unknown step '$step' (build, run, sanitize)" >&2; exit 2 ;;
  esac
done
