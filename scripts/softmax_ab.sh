#!/usr/bin/env bash
# scripts/softmax_ab.sh: an A/B on one card, same run: flash's forward with the online softmax as this
# tree has it (new: one FMA a score against the row's rounded base, bf16 and
# fp16) against the rounded product less the base (old: FMUL and FADD, as
# fa395bc had it for issue 57 item 6), each build's
# plugin swapped in turn (new, old, new, old), cudnn beside as the yardstick.
# Reuses build/gpu when the machine is still warm.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-/tmp/attnprof-gpu}; mkdir -p "$OUT"; T0=$SECONDS
CUDNN_DIR=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=$CUDNN_DIR:$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
B=build/gpu
[[ -x $B/attnprof && -f $B/libattnprof_cuda.so ]] || BUILD_TARGET="attnprof attnprof_cuda" scripts/gpu.sh build >/dev/null 2>&1
echo "[ab] new built at $((SECONDS - T0)) s"
cp $B/libattnprof_cuda.so /tmp/new.so
K=src/backends/cuda/kernels/softmax_online.cuh
cp $K /tmp/softmax_online.cuh.new
sed -i 's/return fmaf(s, scale_log2, -base);/return scaled(s, scale_log2) - base;/' $K
grep -q "return fmaf(s, scale_log2, -base);" $K && { echo "sed did not apply"; exit 1; }
BUILD_TARGET="attnprof_cuda" scripts/gpu.sh build >/dev/null 2>&1 || { echo "old build failed"; exit 1; }
cp $B/libattnprof_cuda.so /tmp/old.so
echo "[ab] old built at $((SECONDS - T0)) s"
shapes=(
  "--batch 8 --heads 16 --seq 4096 --head-dim 128 --mask causal"
  "--batch 4 --heads 16 --seq 8192 --head-dim 128 --mask none"
  "--batch 16 --heads 16 --seq 2048 --head-dim 64 --mask causal"
  "--batch 64 --heads 32 --kv-heads 8 --seq 1 --kv-seq 8192 --head-dim 128 --mask causal-bottom-right --kv-cache paged --page-size 64"
  "--batch 8 --heads 32 --kv-heads 8 --seq 16 --kv-seq 8192 --head-dim 128 --mask causal-bottom-right"
)
# AB_SHAPES=3: the prefill rows only; AB_ROUNDS: rounds of (new, old).
shapes=("${shapes[@]:0:${AB_SHAPES:-${#shapes[@]}}}")
for round in $(seq 1 "${AB_ROUNDS:-2}"); do
  for which in new old; do
    cp /tmp/$which.so $B/libattnprof_cuda.so
    for s in "${shapes[@]}"; do
      line=$(timeout 60 $B/attnprof compare --device cuda --backends flash,cudnn --dtype bf16 $s --warmup 5 --active 20 --quiet \
             --trace-dir /tmp/ab_traces 2>&1 | grep -E "^(flash|cudnn) " | awk '{print $1, $4, $5}' | tr '\n' ' ')
      echo "$which r$round | $s | $line" | tee -a "$OUT/ab.txt"
    done
  done
done
cp /tmp/new.so $B/libattnprof_cuda.so
cp /tmp/softmax_online.cuh.new $K
echo "[ab] done at $((SECONDS - T0)) s"
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } >>"$OUT/ab.txt"
