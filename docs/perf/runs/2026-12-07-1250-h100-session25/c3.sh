#!/usr/bin/env bash
# Session 25's third GPU call: the grouped-query backward's time at every group split (forced,
# ATTNPROF_BWD_GROUP_SPLIT) on the rows the split rule must serve, their multi-head twins (same FLOPs), then
# the wheel phase (issue 57's last check). A table last.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-/tmp/attnprof-gpu}; mkdir -p "$OUT"
B=build/gpu; T0=$SECONDS
CUDNN_DIR=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=$CUDNN_DIR:$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
left() { echo $((${LIMIT:-560} - (SECONDS - T0))); }
BUILD_TARGET="attnprof attnprof_cuda" scripts/gpu.sh build >"$OUT/build.txt" 2>&1 || { tail -30 "$OUT/build.txt"; echo "BUILD FAILED"; exit 1; }
echo "[c3] built at $((SECONDS - T0)) s"
one() {  # split b h hkv s d mask: flash's backward, CUPTI time per backward
  local split=$1; shift
  local t=$(env ${split:+ATTNPROF_BWD_GROUP_SPLIT=$split} timeout 40 $B/attnprof profile --device cuda --backend flash --pass backward \
    --batch $1 --heads $2 --kv-heads $3 --seq $4 --head-dim $5 --mask $6 --warmup 3 --active 6 --trace-dir /tmp/c3t --quiet 2>&1 |
    grep -oE "per backward: GPU activities [0-9.]+, copies [0-9]+, time [0-9.]+ [um]s|error vs float64 \([^)]*\): [a-z]+" | tr '\n' ' ')
  echo "| $1x$2/$3x$4x$5 $6 | ${split:-auto} | $t |" | tee -a "$OUT/splits.txt" >/dev/null
}
for row in "8 32 8 1024 128 causal" "1 16 4 16384 128 causal" "4 16 4 2048 128 causal" "2 32 8 4096 128 causal" \
           "1 32 8 8192 128 causal" "8 32 8 1024 128 none" "4 16 4 4096 128 none"; do
  (( $(left) < 260 )) && break
  for split in 1 2 4 ""; do one "$split" $row; done
done
for row in "4 28 4 2048 128 causal"; do for split in 1 7 ""; do one "$split" $row; done; done
for row in "8 8 1 1024 64 causal"; do for split in 2 4 8 ""; do one "$split" $row; done; done
for row in "1 16 16 16384 128 causal" "4 16 16 2048 128 causal" "2 32 32 4096 128 causal" "1 32 32 8192 128 causal" "4 16 16 4096 128 none"; do
  (( $(left) < 220 )) && break
  one "" $row
done
echo "[c3] splits at $((SECONDS - T0)) s"
if (( $(left) > 150 )); then
  python3 -c 'import nanobind' 2>/dev/null || { python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/nanobind-*.whl; export PYTHONPATH=/tmp/site; }
  timeout $(( $(left) - 10 )) scripts/gpu.sh wheel >"$OUT/wheel_phase.txt" 2>&1; echo "wheel phase rc $?" >>"$OUT/wheel_phase.txt"
fi
echo "================ table ($((SECONDS - T0)) s)"
cat "$OUT/splits.txt"
tail -12 "$OUT/wheel_phase.txt" 2>/dev/null
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } | tee "$OUT/when.txt"
