#!/usr/bin/env bash
# Session 24's second call: the FMA fast path of the online softmax, its correctness tests, then the A/B.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-/tmp/attnprof-gpu}; mkdir -p "$OUT"; T0=$SECONDS
CUDNN_DIR=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=$CUDNN_DIR:$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
BUILD_TARGET="attnprof attnprof_cuda attnprof_gpu_tests" scripts/gpu.sh build >"$OUT/build.txt" 2>&1 || { tail -30 "$OUT/build.txt"; echo "BUILD FAILED"; exit 1; }
echo "[ab2] built at $((SECONDS - T0)) s"
F='ScoreRangeCuda.*:NanCuda.*:FusedKernels.*:FlashFp8.*:FlashRows.*:FlashPacked.*:FlashSoftcap.*:CudaBackendAccuracy.*:FlashDecode.*:PagedCudaDecode.*:MaskGeometryCuda.*:FusedBackward.*'
timeout 150 build/gpu/tests/attnprof_gpu_tests --gtest_brief=1 --gtest_filter="$F" >"$OUT/tests.txt" 2>&1; echo "gpu tests rc $?" >>"$OUT/tests.txt"
echo "[ab2] tests at $((SECONDS - T0)) s"
grep -E "PASSED|FAILED|SKIPPED|rc " "$OUT/tests.txt" | head -20
timeout $((560 - (SECONDS - T0))) bash scripts/softmax_ab.sh
