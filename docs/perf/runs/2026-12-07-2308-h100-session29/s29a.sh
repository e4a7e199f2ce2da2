#!/usr/bin/env bash
# Session 29's first call: build, decode GPU tests, sanitizer on split decode, split sweep, graph_decode, table.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$SECONDS; LIMIT=${LIMIT:-585}
left() { echo $(( LIMIT - (SECONDS - T0) )); }
B=build/gpu
scripts/gpu.sh build || { tail -40 $OUT/log.txt; exit 1; }
echo "build done at $((SECONDS-T0)) s"
CUDNN_DIR=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=$CUDNN_DIR:$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
timeout 90 $B/tests/attnprof_gpu_tests --gtest_brief=1 --gtest_filter='*FlashDecode*:*PagedCuda*:*Plan*:*Graph*:*Decode*:*PagedStreamOrder*' >$OUT/tests.txt 2>&1
echo "gpu tests rc $?" >>$OUT/tests.txt; tail -5 $OUT/tests.txt
echo "tests done at $((SECONDS-T0)) s"
setsid scripts/gpu.sh graph_decode >/dev/null 2>&1 &
gp=$!; ( sleep 150; kill -- -$gp 2>/dev/null ) & wd=$!; wait $gp; kill $wd 2>/dev/null
echo "graph done at $((SECONDS-T0)) s"
if [[ $(left) -gt 150 ]]; then
  PYTHONUNBUFFERED=1 timeout $(( $(left) - 80 < 140 ? $(left) - 80 : 140 )) python3 bench/decode_rows.py --attnprof $B/attnprof --out $OUT \
    --splits 4,8,16,32 >$OUT/splits.txt 2>&1; echo "splits rc $?" >>$OUT/splits.txt
fi
echo "splits done at $((SECONDS-T0)) s"
san() { local tool=$1; shift
  env ATTNPROF_NO_CUPTI=1 ATTNPROF_CEILING_TFLOPS=774 ATTNPROF_COPY_GBS=4200 timeout $(( $(left) - 15 )) \
    compute-sanitizer --tool $tool --error-exitcode 9 $B/attnprof profile --device cuda --batch 1 "$@" \
    --warmup 0 --active 1 --unprofiled-calls 0 --trace-dir /tmp/san --quiet >/tmp/san.txt 2>&1
  echo "$tool $* -> rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt | tail -1)" | tee -a $OUT/sanitizer.txt; }
for tool in memcheck racecheck; do
  [[ $(left) -gt 25 ]] || break
  san $tool --backend flash --heads 8 --kv-heads 2 --seq 1 --kv-seq 2048 --head-dim 128 --kv-cache paged --page-size 16
done
echo "sanitize done at $((SECONDS-T0)) s"
echo "=== table ==="
cat /tmp/env.txt 2>/dev/null
grep -E 'PASSED|FAILED|rc' $OUT/tests.txt | tail -6
cat $OUT/sanitizer.txt 2>/dev/null
tail -25 $OUT/splits.txt 2>/dev/null
tail -25 $OUT/graph_decode.md 2>/dev/null
