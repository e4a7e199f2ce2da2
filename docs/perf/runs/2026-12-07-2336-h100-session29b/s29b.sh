#!/usr/bin/env bash
# Session 29's second call: the split rule (decode_splits) and the fast path's index arrays.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$SECONDS; LIMIT=${LIMIT:-575}
left() { echo $(( LIMIT - (SECONDS - T0) )); }
B=build/gpu
if [[ ! -x $B/attnprof ]]; then scripts/gpu.sh build || { tail -40 $OUT/log.txt; exit 1; }; fi
echo "build done at $((SECONDS-T0)) s"
CUDNN_DIR=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=$CUDNN_DIR:$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
timeout 60 $B/tests/attnprof_gpu_tests --gtest_brief=1 --gtest_filter='*FlashDecode*:*PagedCuda*:*Plan*:*Decode*:*PagedStreamOrder*' >$OUT/tests.txt 2>&1
echo "gpu tests rc $?" >>$OUT/tests.txt; tail -3 $OUT/tests.txt
echo "tests done at $((SECONDS-T0)) s"
setsid scripts/gpu.sh graph_decode >/dev/null 2>&1 &
gp=$!; ( sleep 120; kill -- -$gp 2>/dev/null ) & wd=$!; wait $gp; kill $wd 2>/dev/null
echo "graph done at $((SECONDS-T0)) s"
[[ -d /tmp/site ]] && export PYTHONPATH=/tmp/site
PYTHONPATH=$B/python${PYTHONPATH:+:$PYTHONPATH} timeout 90 python3 -m pytest -q -p no:cacheprovider -x \
  python/tests/test_torch_call.py python/tests/test_plan_gpu.py >$OUT/pytest.txt 2>&1
echo "pytest rc $?" >>$OUT/pytest.txt; tail -3 $OUT/pytest.txt
echo "pytest done at $((SECONDS-T0)) s"
prof() {  # label ENV... : the decode kernels' lines of one profile
  local label=$1; shift
  env "$@" timeout 30 $B/attnprof profile --device cuda --backend flash --batch 1 --heads 32 --kv-heads 8 --seq 1 \
    --kv-seq 2048 --head-dim 128 --mask causal-bottom-right --kv-cache paged --page-size 16 --warmup 3 --active 10 \
    --trace-dir /tmp/prof >/tmp/prof.txt 2>&1
  { echo "== $label"; grep -iE 'decode|combine|per forward|kernel' /tmp/prof.txt | head -14; } >>$OUT/kernels.txt
}
prof "auto" ATTNPROF_X=1; prof "32 splits" ATTNPROF_DECODE_SPLITS=32; prof "16 splits" ATTNPROF_DECODE_SPLITS=16
echo "profiles done at $((SECONDS-T0)) s"
if [[ $(left) -gt 120 ]]; then
  PYTHONUNBUFFERED=1 timeout $(( $(left) - 70 < 150 ? $(left) - 70 : 150 )) python3 bench/decode_rows.py --attnprof $B/attnprof \
    --out /tmp --splits 4,8,16,32,64 --split-rows check >$OUT/splits_check.txt 2>&1; echo "check rc $?" >>$OUT/splits_check.txt
fi
echo "check done at $((SECONDS-T0)) s"
if [[ $(left) -gt 70 ]]; then
  PYTHONUNBUFFERED=1 timeout $(( $(left) - 30 < 60 ? $(left) - 30 : 60 )) python3 bench/decode_rows.py --attnprof $B/attnprof \
    --out /tmp --splits 16,32 >$OUT/splits.txt 2>&1; echo "fitted rc $?" >>$OUT/splits.txt
fi
echo "fitted done at $((SECONDS-T0)) s"
if [[ $(left) -gt 30 ]]; then
  env ATTNPROF_NO_CUPTI=1 ATTNPROF_CEILING_TFLOPS=774 ATTNPROF_COPY_GBS=4200 timeout $(( $(left) - 8 )) compute-sanitizer --tool memcheck \
    --error-exitcode 9 $B/attnprof profile --device cuda --batch 1 --backend flash --heads 8 --kv-heads 2 --seq 1 --kv-seq 2048 \
    --head-dim 128 --kv-cache paged --page-size 16 --warmup 0 --active 1 --unprofiled-calls 0 --trace-dir /tmp/san --quiet >/tmp/san.txt 2>&1
  echo "memcheck b1 2048 paged (auto splits) rc $? $(grep 'ERROR SUMMARY' /tmp/san.txt | tail -1)" >>$OUT/kernels.txt
fi
echo "=== table ==="
grep -E 'PASSED|FAILED|rc' $OUT/tests.txt | tail -4
tail -4 $OUT/pytest.txt
cat $OUT/kernels.txt
grep -v '^{' $OUT/splits_check.txt | tail -52
grep -v '^{' $OUT/splits.txt | tail -20
tail -12 $OUT/graph_decode.md
