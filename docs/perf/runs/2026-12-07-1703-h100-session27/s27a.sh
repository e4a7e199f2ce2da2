#!/usr/bin/env bash
# Session 27, call 5: the decode combine (loads batched, launched after the split kernel with PDL) and the split
# count at one query: build; decode/paged/plan GPU tests; memcheck+racecheck on split decode; decode_rows --splits;
# graph_decode; table last.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-/tmp/attnprof-gpu}; mkdir -p "$OUT"
B=build/gpu; T0=$SECONDS
CUDNN_DIR=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=$CUDNN_DIR:$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
python3 -c 'import nanobind' 2>/dev/null || { python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/nanobind-*.whl; export PYTHONPATH=/tmp/site; }
left() { echo $((${LIMIT:-560} - (SECONDS - T0))); }
cap() { local l=$(( $(left) - $2 )); echo $(( l < $1 ? l : $1 )); }
BUILD_TARGET="attnprof attnprof_cuda attnprof_gpu_tests" scripts/gpu.sh build >"$OUT/build.txt" 2>&1 || { tail -30 "$OUT/build.txt"; echo "BUILD FAILED"; exit 1; }
echo "[n] built at $((SECONDS - T0)) s"
timeout $(cap 100 330) $B/tests/attnprof_gpu_tests --gtest_brief=1 --gtest_filter='*FlashDecode*:*PagedCuda*:*Plan*:*Graph*:*Decode*' >"$OUT/tests.txt" 2>&1; echo "gpu tests rc $?" >>"$OUT/tests.txt"
echo "[n] tests at $((SECONDS - T0)) s"
for tool in memcheck racecheck; do for a in "--batch 1 --heads 32 --kv-heads 8 --seq 1 --kv-seq 2048 --head-dim 128 --kv-cache paged --page-size 16" "--batch 2 --heads 8 --kv-heads 2 --seq 16 --kv-seq 3000 --head-dim 64"; do
  env ATTNPROF_NO_CUPTI=1 ATTNPROF_CEILING_TFLOPS=774 ATTNPROF_COPY_GBS=4200 timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 \
    $B/attnprof profile --device cuda $a --mask causal-bottom-right --backend flash --warmup 0 --active 1 --unprofiled-calls 0 --trace-dir /tmp/san --quiet >/tmp/s.txt 2>&1
  echo "$tool $a -> rc $? $(grep -E 'SUMMARY' /tmp/s.txt | tail -1)" >> "$OUT/sanitizer.txt"
done; done
echo "[n] sanitizer at $((SECONDS - T0)) s"
timeout $(cap 170 150) python3 bench/decode_rows.py --attnprof $B/attnprof --out "$OUT" --splits 4,8,16,32 >"$OUT/decode_splits.txt" 2>&1
echo "[n] splits at $((SECONDS - T0)) s"
if (( $(left) > 120 )); then
  timeout $(( $(left) - 10 )) scripts/gpu.sh graph_decode >>"$OUT/log.txt" 2>&1
fi
if (( $(left) > 45 )); then
  (export PYTHONPATH=$PWD/$B/python${PYTHONPATH:+:$PYTHONPATH}; cd python/tests && timeout $(( $(left) - 12 )) python3 -m pytest -q -rs -p no:cacheprovider -m "not slow" test_plan_gpu.py >"$OUT/pytest.txt" 2>&1; echo "pytest rc $?" >>"$OUT/pytest.txt")
fi
echo "================ table ($((SECONDS - T0)) s)"
grep -E "PASSED|FAILED|tests rc|Failure|SKIPPED \]" "$OUT/tests.txt" | head -14
cat "$OUT/sanitizer.txt"
grep -v "^{" "$OUT/decode_splits.txt" | tail -32
cat "$OUT/graph_decode.md" 2>/dev/null | tail -9
grep -E "^(FAILED|ERROR)|passed|failed|rc " "$OUT/pytest.txt" 2>/dev/null | tail -6
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } | tee "$OUT/when.txt"
