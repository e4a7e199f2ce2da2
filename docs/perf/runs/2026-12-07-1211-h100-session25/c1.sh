#!/usr/bin/env bash
# Session 25's first GPU call: build; plan.run's CUDA path (test_plan*.py); python overhead on CUDA;
# re-record generate_attnprof with the op's label inside; a table last.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-/tmp/attnprof-gpu}; mkdir -p "$OUT"
B=build/gpu; T0=$SECONDS
CUDNN_DIR=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=$CUDNN_DIR:$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
python3 -c 'import nanobind' 2>/dev/null || { python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/nanobind-*.whl; export PYTHONPATH=/tmp/site; }
cap() { local l=$(( $(left) - $2 )); echo $(( l < $1 ? l : $1 )); }
left() { echo $((${LIMIT:-575} - (SECONDS - T0))); }
BUILD_TARGET="attnprof attnprof_cuda" scripts/gpu.sh build >"$OUT/build.txt" 2>&1 || { tail -30 "$OUT/build.txt"; echo "BUILD FAILED"; exit 1; }
echo "[c1] built at $((SECONDS - T0)) s"
cmake -S . -B $B -DATTNPROF_PYTHON=ON >>"$OUT/log.txt" 2>&1 && cmake --build $B --target _core _torch_call >/tmp/pybuild.txt 2>&1 || echo "python module build failed: $(grep -m3 error /tmp/pybuild.txt)"
echo "[c1] python built at $((SECONDS - T0)) s"
export PYTHONPATH=$PWD/$B/python${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
(cd python/tests && timeout $(cap 150 250) python3 -m pytest -q -rs -p no:cacheprovider -m "not slow" test_plan.py test_plan_gpu.py test_torch_ops.py >"$OUT/pytest.txt" 2>&1; echo "pytest rc $?" >>"$OUT/pytest.txt")
echo "[c1] pytest done at $((SECONDS - T0)) s"
timeout $(cap 110 120) python3 scripts/record_graph_traces.py --out "$OUT/graph_traces" --only generate_attnprof >"$OUT/graph_record.txt" 2>&1
echo "record rc $?" >>"$OUT/graph_record.txt"
echo "[c1] record done at $((SECONDS - T0)) s"
timeout $(cap 90 20) python3 bench/python_overhead.py --device cuda --attnprof $B/attnprof >"$OUT/overhead.txt" 2>&1; echo "overhead rc $?" >>"$OUT/overhead.txt"
echo "[c1] overhead done at $((SECONDS - T0)) s"
if (( $(left) > 80 )); then (cd python/tests && timeout $(( $(left) - 20 )) python3 -m pytest -q -rs -p no:cacheprovider -m "not slow" test_gpu.py test_dropin.py test_dropin_flash_attn.py >"$OUT/pytest2.txt" 2>&1; echo "pytest2 rc $?" >>"$OUT/pytest2.txt"); fi
echo "================ table ($((SECONDS - T0)) s)"
grep -E "^(FAILED|ERROR)|passed|failed|rc " "$OUT/pytest.txt" | tail -14
tail -4 "$OUT/graph_record.txt"; ls -la "$OUT/graph_traces" 2>/dev/null
tail -25 "$OUT/overhead.txt"
grep -E "^(FAILED|ERROR)|passed|failed|rc " "$OUT/pytest2.txt" 2>/dev/null | tail -8
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } | tee "$OUT/when.txt"
if (($(find "$OUT" -type f | wc -l) > 8)); then
  tar czf /tmp/results.tar.gz -C "$OUT" . && find "$OUT" -type f -delete && mv /tmp/results.tar.gz "$OUT/"
fi
