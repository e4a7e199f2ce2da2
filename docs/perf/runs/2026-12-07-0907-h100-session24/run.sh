#!/usr/bin/env bash
# Session 24's first GPU call: build, last session's three failing GPU tests, the Python GPU tests that failed,
# the generate() graph fixtures, then the whole suite; a table last.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-/tmp/attnprof-gpu}; mkdir -p "$OUT"
B=build/gpu; T0=$SECONDS
CUDNN_DIR=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=$CUDNN_DIR:$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
python3 -c 'import nanobind' 2>/dev/null || { python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/nanobind-*.whl; export PYTHONPATH=/tmp/site; }
cap() { local l=$(( $(left) - $2 )); echo $(( l < $1 ? l : $1 )); }
left() { echo $((${LIMIT:-570} - (SECONDS - T0))); }
BUILD_TARGET="attnprof attnprof_cuda attnprof_gpu_tests" scripts/gpu.sh build >"$OUT/build.txt" 2>&1 || { tail -30 "$OUT/build.txt"; echo "BUILD FAILED"; exit 1; }
echo "[run] built at $((SECONDS - T0)) s"
NEW='CudnnBooleanMask.*:CudnnDeviceLengths.*:ScoreRangeCuda.*:NanCuda.*:FlashDecode.*:GraphReplaysCuda.*'
timeout $(cap 120 300) $B/tests/attnprof_gpu_tests --gtest_brief=1 --gtest_filter="$NEW" >"$OUT/tests.txt" 2>&1; echo "gpu tests rc $?" >>"$OUT/tests.txt"
echo "[run] tests done at $((SECONDS - T0)) s"
cmake -S . -B $B -DATTNPROF_PYTHON=ON >>"$OUT/log.txt" 2>&1 && cmake --build $B --target _core _torch_call >/tmp/pybuild.txt 2>&1 || echo "python module build failed: $(grep -m3 error /tmp/pybuild.txt)"
echo "[run] python built at $((SECONDS - T0)) s"
export PYTHONPATH=$PWD/$B/python${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
(cd python/tests && timeout $(cap 120 200) python3 -m pytest -q -rs -p no:cacheprovider -m "not slow" test_fp8_stream.py test_dropin_flash_attn.py test_torch_ops.py test_plan_gpu.py test_gpu.py test_dropin.py >"$OUT/pytest.txt" 2>&1; echo "pytest rc $?" >>"$OUT/pytest.txt")
echo "[run] pytest done at $((SECONDS - T0)) s"
timeout $(cap 150 60) python3 scripts/record_graph_traces.py --out "$OUT/graph_traces" >"$OUT/graph_record.txt" 2>&1
echo "record rc $?" >>"$OUT/graph_record.txt"
echo "[run] record done at $((SECONDS - T0)) s"
if (( $(left) > 60 )); then timeout $(( $(left) - 15 )) $B/tests/attnprof_gpu_tests --gtest_brief=1 >"$OUT/tests_all.txt" 2>&1; echo "all gpu tests rc $?" >>"$OUT/tests_all.txt"; fi
echo "================ table ($((SECONDS - T0)) s)"
grep -E "PASSED|FAILED|SKIPPED|gpu tests rc" "$OUT/tests.txt" | head -30
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.txt" | tail -14
tail -4 "$OUT/graph_record.txt"; ls -la "$OUT/graph_traces" 2>/dev/null
grep -E "PASSED|FAILED|tests rc" "$OUT/tests_all.txt" 2>/dev/null | tail -12
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } | tee "$OUT/when.txt"
if (($(find "$OUT" -type f | wc -l) > 8)); then
  tar czf /tmp/results.tar.gz -C "$OUT" . && find "$OUT" -type f -delete && mv /tmp/results.tar.gz "$OUT/"
fi
