#!/usr/bin/env bash
# Session 27, the short call (415 s of budget left): build; decode GPU tests; memcheck+racecheck on a split decode;
# the split sweep at batch 1 (auto shows the new combine); graph_decode if time is left; table last.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-/tmp/attnprof-gpu}; mkdir -p "$OUT"
B=build/gpu; T0=$SECONDS
CUDNN_DIR=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=$CUDNN_DIR:$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
python3 -c 'import nanobind' 2>/dev/null || { python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/nanobind-*.whl; export PYTHONPATH=/tmp/site; }
left() { echo $((${LIMIT:-300} - (SECONDS - T0))); }
cap() { local l=$(( $(left) - $2 )); echo $(( l < $1 ? l : $1 )); }
BUILD_TARGET="attnprof attnprof_cuda attnprof_gpu_tests" scripts/gpu.sh build >"$OUT/build.txt" 2>&1 || { tail -30 "$OUT/build.txt"; echo "BUILD FAILED"; exit 1; }
echo "[n] built at $((SECONDS - T0)) s"
timeout $(cap 45 110) $B/tests/attnprof_gpu_tests --gtest_brief=1 --gtest_filter='*FlashDecode*:*PagedCuda*' >"$OUT/tests.txt" 2>&1; echo "gpu tests rc $?" >>"$OUT/tests.txt"
echo "[n] tests at $((SECONDS - T0)) s"
for tool in memcheck racecheck; do a="--batch 1 --heads 32 --kv-heads 8 --seq 1 --kv-seq 2048 --head-dim 128 --kv-cache paged --page-size 16"
  env ATTNPROF_NO_CUPTI=1 ATTNPROF_CEILING_TFLOPS=774 ATTNPROF_COPY_GBS=4200 timeout 30 compute-sanitizer --tool $tool --error-exitcode 9 \
    $B/attnprof profile --device cuda $a --mask causal-bottom-right --backend flash --warmup 0 --active 1 --unprofiled-calls 0 --trace-dir /tmp/san --quiet >/tmp/s.txt 2>&1
  echo "$tool $a -> rc $? $(grep -E 'SUMMARY' /tmp/s.txt | tail -1)" >> "$OUT/sanitizer.txt"
done
echo "[n] sanitizer at $((SECONDS - T0)) s"
timeout $(cap 90 15) python3 bench/decode_rows.py --attnprof $B/attnprof --out "$OUT" --splits 8,32 --rows 3 >"$OUT/decode_splits.txt" 2>&1
echo "[n] splits at $((SECONDS - T0)) s"
echo "================ table ($((SECONDS - T0)) s)"
grep -E "PASSED|FAILED|tests rc|Failure|SKIPPED \]" "$OUT/tests.txt" | head -10
cat "$OUT/sanitizer.txt"
grep -v "^{" "$OUT/decode_splits.txt" | tail -12
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } | tee "$OUT/when.txt"
