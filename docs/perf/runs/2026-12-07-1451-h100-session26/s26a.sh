#!/usr/bin/env bash
# Session 26, call 1: build; the GPU tests the changed CUDA code touches (group split, the index arrays'
# one reading, the decode wide tile), then the decode tile A/B, the grouped-query backward at every split,
# then the whole suite with what is left; a table last.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-/tmp/attnprof-gpu}; mkdir -p "$OUT"
B=build/gpu; T0=$SECONDS
CUDNN_DIR=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=$CUDNN_DIR:$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
python3 -c 'import nanobind' 2>/dev/null || { python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/nanobind-*.whl; export PYTHONPATH=/tmp/site; }
left() { echo $((${LIMIT:-580} - (SECONDS - T0))); }
cap() { local l=$(( $(left) - $2 )); echo $(( l < $1 ? l : $1 )); }
BUILD_TARGET="attnprof attnprof_cuda attnprof_gpu_tests" scripts/gpu.sh build >"$OUT/build.txt" 2>&1 || { tail -30 "$OUT/build.txt"; echo "BUILD FAILED"; exit 1; }
echo "[a] built at $((SECONDS - T0)) s"
timeout $(cap 100 380) $B/tests/attnprof_gpu_tests --gtest_brief=1 --gtest_filter='FusedBackward*:FlashDecode*:*GroupSplit*:FlashRows*:FlashPacked*:FlashSequences*:VarlenCuda*:CudnnRagged*:PagedCuda*:BatchLayoutCuda*:MaskGeometryCuda*:PlanCuda*' >"$OUT/tests.txt" 2>&1; echo "gpu tests rc $?" >>"$OUT/tests.txt"
echo "[a] tests at $((SECONDS - T0)) s"
timeout $(cap 110 280) python3 bench/decode_rows.py --attnprof $B/attnprof --out "$OUT" >"$OUT/decode_rows.txt" 2>&1
echo "[a] decode rows at $((SECONDS - T0)) s"
timeout $(cap 230 40) python3 bench/gqa_backward.py --attnprof $B/attnprof --out "$OUT" --splits 1,2,4,8,16 >"$OUT/gqa.txt" 2>&1
echo "[a] gqa at $((SECONDS - T0)) s"
if (( $(left) > 60 )); then timeout $(( $(left) - 15 )) $B/tests/attnprof_gpu_tests --gtest_brief=1 --gtest_filter='-FusedBackward*:FlashDecode*:*GroupSplit*:FlashRows*:FlashPacked*:FlashSequences*:VarlenCuda*:CudnnRagged*:PagedCuda*:BatchLayoutCuda*:MaskGeometryCuda*:PlanCuda*' >"$OUT/tests_rest.txt" 2>&1; echo "rest gpu tests rc $?" >>"$OUT/tests_rest.txt"; fi
echo "================ table ($((SECONDS - T0)) s)"
grep -E "PASSED|FAILED|tests rc|Failure" "$OUT/tests.txt" | head -14
tail -24 "$OUT/decode_rows.txt"
tail -40 "$OUT/gqa.txt" | grep -v "^{"
grep -E "PASSED|FAILED|tests rc" "$OUT/tests_rest.txt" 2>/dev/null | tail -10
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } | tee "$OUT/when.txt"
if (($(find "$OUT" -type f | wc -l) > 8)); then
  tar czf /tmp/results.tar.gz -C "$OUT" . && find "$OUT" -type f -delete && mv /tmp/results.tar.gz "$OUT/"
fi
