#!/usr/bin/env bash
# Session 29's follow-up on a warm machine (build/gpu kept): the grouped-query backward rows against cudnn
# (auto only), then FP8's bench. Table last.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$SECONDS; LIMIT=${LIMIT:-560}
left() { echo $(( LIMIT - (SECONDS - T0) )); }
B=build/gpu
if [[ ! -x $B/attnprof ]]; then scripts/gpu.sh build || { tail -40 $OUT/log.txt; exit 1; }; fi
echo "build ready at $((SECONDS-T0)) s"
CUDNN_DIR=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=$CUDNN_DIR:$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } >$OUT/env.txt
PYTHONUNBUFFERED=1 timeout $(( $(left) / 2 )) python3 bench/gqa_backward.py --attnprof $B/attnprof --out /tmp --splits "" \
  >$OUT/gqa.txt 2>&1; echo "gqa rc $?" >>$OUT/gqa.txt
echo "gqa done at $((SECONDS-T0)) s"
PYTHONUNBUFFERED=1 timeout $(( $(left) - 15 )) python3 bench/fp8_bench.py --attnprof $B/attnprof --out /tmp \
  >$OUT/fp8.txt 2>&1; echo "fp8 rc $?" >>$OUT/fp8.txt
echo "=== table ==="
cat $OUT/env.txt
grep -v '^{' $OUT/gqa.txt | tail -20
grep -v '^{' $OUT/fp8.txt | tail -30
