#!/usr/bin/env bash
# Session 26, call 2: build (or reuse); compute-sanitizer (memcheck, racecheck) on the decode wide tile and the
# changed sequence reading; the CUDA Python tests with the options table; hd64 variants with what is left.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-/tmp/attnprof-gpu}; mkdir -p "$OUT"
B=build/gpu; T0=$SECONDS
CUDNN_DIR=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=$CUDNN_DIR:$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
python3 -c 'import nanobind' 2>/dev/null || { python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/nanobind-*.whl; export PYTHONPATH=/tmp/site; }
left() { echo $((${LIMIT:-580} - (SECONDS - T0))); }
cap() { local l=$(( $(left) - $2 )); echo $(( l < $1 ? l : $1 )); }
[[ -x $B/attnprof && -f $B/libattnprof_cuda.so ]] || BUILD_TARGET="attnprof attnprof_cuda" scripts/gpu.sh build >"$OUT/build.txt" 2>&1 || { tail -30 "$OUT/build.txt"; echo "BUILD FAILED"; exit 1; }
echo "[b] built at $((SECONDS - T0)) s"
san() {  # TOOL LABEL -- attnprof profile args
  local tool=$1 label=$2; shift 3
  env ATTNPROF_NO_CUPTI=1 timeout 90 compute-sanitizer --tool "$tool" --error-exitcode 9 $B/attnprof profile --device cuda "$@" \
    --backend flash --warmup 0 --active 1 --unprofiled-calls 0 --trace-dir /tmp/san --quiet >/tmp/san.txt 2>&1
  echo "$tool $label -> rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt | tail -1) $(grep -m1 -oE 'cannot run this problem: .*' /tmp/san.txt)" | tee -a "$OUT/sanitizer.txt"
}
for tool in memcheck racecheck; do
  san $tool "decode wide paged16 split" -- --batch 1 --heads 8 --kv-heads 2 --seq 16 --kv-seq 3000 --head-dim 128 --mask causal-bottom-right --kv-cache paged --page-size 16
  san $tool "decode wide d256 window" -- --batch 2 --heads 8 --kv-heads 2 --seq 16 --kv-seq 777 --head-dim 256 --mask sliding-window --window 300
  san $tool "decode wide d64 padded rows" -- --batch 3 --heads 12 --kv-heads 3 --seq 13 --kv-seq 1000 --head-dim 64 --mask causal-bottom-right --dtype fp16
  san $tool "packed fwd" -- --seq-lens 200,77,1 --kv-seq-lens 300,5,64 --heads 4 --kv-heads 2 --head-dim 128 --mask causal-bottom-right
  san $tool "packed train" -- --seq-lens 130,64 --heads 4 --head-dim 64 --mask causal --pass train
done
echo "[b] sanitizer at $((SECONDS - T0)) s"
cmake -S . -B $B -DATTNPROF_PYTHON=ON >>"$OUT/log.txt" 2>&1 && cmake --build $B --target _core _torch_call >/tmp/pybuild.txt 2>&1 || echo "python module build failed: $(grep -m3 error /tmp/pybuild.txt)" | tee -a "$OUT/pytest.txt"
export PYTHONPATH=$PWD/$B/python${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
(cd python/tests && timeout $(cap 200 150) python3 -m pytest -q -rs -p no:cacheprovider -m "not slow" test_options_table.py test_plan.py test_plan_gpu.py test_torch_ops.py test_gpu.py test_dropin.py >>"$OUT/pytest.txt" 2>&1; echo "pytest rc $?" >>"$OUT/pytest.txt")
echo "[b] pytest at $((SECONDS - T0)) s"
if (( $(left) > 150 )); then LIMIT=$(( $(left) - 10 )) scripts/fwd_d64_variants.sh >/dev/null 2>&1; fi
echo "================ table ($((SECONDS - T0)) s)"
cat "$OUT/sanitizer.txt"
grep -E "^(FAILED|ERROR)|passed|failed|rc |build failed" "$OUT/pytest.txt" | tail -10
cat "$OUT/ab64v.txt" 2>/dev/null | cut -c1-220
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } | tee "$OUT/when.txt"
