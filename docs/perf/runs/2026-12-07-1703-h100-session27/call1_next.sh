#!/usr/bin/env bash
# For session 27's first GPU call (written in session 26): build; the GPU tests the session-26 CUDA changes touch
# (the wide decode tile's parametrised cases carry the Gpu/ prefix), racecheck on the wide tile with the card's
# ceilings given (else the tool times the ceiling microbenchmarks and runs past any limit), the multi-query d96
# row at splits 4 and 8 (the new few-heavy rule's 8), the decode tiles, then the CUDA Python tests; a table last.
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
echo "[n] built at $((SECONDS - T0)) s"
timeout $(cap 120 330) $B/tests/attnprof_gpu_tests --gtest_brief=1 --gtest_filter='*FlashDecode*:*FusedBackward*:*GroupSplit*:*FlashRows*:*FlashPacked*:*FlashSequences*:*VarlenCuda*:*CudnnRagged*:*PagedCuda*' >"$OUT/tests.txt" 2>&1; echo "gpu tests rc $?" >>"$OUT/tests.txt"
echo "[n] tests at $((SECONDS - T0)) s"
for a in "--heads 4 --kv-heads 1 --seq 16 --kv-seq 200 --head-dim 64 --kv-cache paged --page-size 16" "--heads 8 --kv-heads 2 --seq 16 --kv-seq 300 --head-dim 128"; do
  env ATTNPROF_NO_CUPTI=1 ATTNPROF_CEILING_TFLOPS=774 ATTNPROF_COPY_GBS=4200 timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 \
    $B/attnprof profile --device cuda --batch 1 $a --mask causal-bottom-right --backend flash --warmup 0 --active 1 --unprofiled-calls 0 --trace-dir /tmp/san --quiet >/tmp/s.txt 2>&1
  echo "racecheck $a -> rc $? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' /tmp/s.txt | tail -1)" | tee -a "$OUT/sanitizer.txt"
done
echo "[n] racecheck at $((SECONDS - T0)) s"
timeout $(cap 60 200) python3 bench/gqa_backward.py --attnprof $B/attnprof --out "$OUT" --rows 1 --splits 4,8 >"$OUT/gqa.txt" 2>&1
timeout $(cap 150 60) python3 bench/decode_rows.py --attnprof $B/attnprof --out "$OUT" >"$OUT/decode_rows.txt" 2>&1
echo "[n] benches at $((SECONDS - T0)) s"
if (( $(left) > 100 )); then
  cmake -S . -B $B -DATTNPROF_PYTHON=ON >>"$OUT/log.txt" 2>&1 && cmake --build $B --target _core _torch_call >/tmp/pybuild.txt 2>&1 || echo "python module build failed" >>"$OUT/pytest.txt"
  export PYTHONPATH=$PWD/$B/python${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
  (cd python/tests && timeout $(( $(left) - 15 )) python3 -m pytest -q -rs -p no:cacheprovider -m "not slow" test_options_table.py test_plan.py test_plan_gpu.py test_torch_ops.py test_gpu.py >>"$OUT/pytest.txt" 2>&1; echo "pytest rc $?" >>"$OUT/pytest.txt")
fi
echo "================ table ($((SECONDS - T0)) s)"
grep -E "PASSED|FAILED|tests rc|Failure" "$OUT/tests.txt" | head -14
cat "$OUT/sanitizer.txt"
grep -v "^{" "$OUT/gqa.txt" | tail -6
grep -v "^{" "$OUT/decode_rows.txt" | tail -24
grep -E "^(FAILED|ERROR)|passed|failed|rc " "$OUT/pytest.txt" 2>/dev/null | tail -8
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } | tee "$OUT/when.txt"
