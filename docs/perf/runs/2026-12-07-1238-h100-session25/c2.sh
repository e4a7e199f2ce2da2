#!/usr/bin/env bash
# Session 25's second GPU call: is the grouped-query backward's gap to cuDNN grouped-query's own, or the
# shape's? The same rows as multi-head (the same FLOPs), flash and cudnn in one process a row, flash's
# kernels per row; then the wheel phase (issue 57's last check). A table last.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-/tmp/attnprof-gpu}; mkdir -p "$OUT"
B=build/gpu; T0=$SECONDS
CUDNN_DIR=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=$CUDNN_DIR:$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
left() { echo $((${LIMIT:-575} - (SECONDS - T0))); }
BUILD_TARGET="attnprof attnprof_cuda" scripts/gpu.sh build >"$OUT/build.txt" 2>&1 || { tail -30 "$OUT/build.txt"; echo "BUILD FAILED"; exit 1; }
echo "[c2] built at $((SECONDS - T0)) s"
nvcc -O2 -std=c++20 -arch=sm_90a -o /tmp/launch_floor bench/launch_floor.cu && timeout 30 /tmp/launch_floor >"$OUT/launch_floor.txt" 2>&1
echo "[c2] launch floor at $((SECONDS - T0)) s"
row() {  # label split b h hkv s d mask
  local label=$1 split=$2; shift 2
  local j=/tmp/c2_$RANDOM.json
  env ${split:+ATTNPROF_BWD_GROUP_SPLIT=$split} timeout 60 $B/attnprof compare --device cuda --pass backward --backends flash,cudnn \
    --batch $1 --heads $2 --kv-heads $3 --seq $4 --head-dim $5 --mask $6 --warmup 3 --active 10 --check-rows 16 \
    --trace-dir /tmp/c2t --json $j --quiet >/dev/null 2>>"$OUT/errors.txt"
  python3 - "$j" "$label" "${split:-auto}" <<'PY' | tee -a "$OUT/rows.txt"
import json, sys
try: r = {x["backend"]: x for x in json.load(open(sys.argv[1]))["results"]}
except Exception as e: print(f"| {sys.argv[2]} | {sys.argv[3]} | error {e} |"); sys.exit()
f, c = r.get("flash", {}), r.get("cudnn", {})
fu, cu = f.get("device_time_us"), c.get("device_time_us")
print(f"| {sys.argv[2]} | {sys.argv[3]} | {fu:.1f} | {cu:.1f} | {fu / cu:.3f} | {f.get('tflops', 0):.1f} | {f.get('accepted')} {c.get('accepted')} |")
PY
}
echo "| row | split | flash us | cudnn us | flash/cudnn | flash TF/s | accepted |" >"$OUT/rows.txt"
for rep in 1; do
row "mha 8x32x1024x128 causal" "" 8 32 32 1024 128 causal
row "gqa 8x32/8x1024x128 causal" "" 8 32 8 1024 128 causal
row "gqa 8x32/8x1024x128 causal" 4 8 32 8 1024 128 causal
row "gqa 8x32/8x1024x128 causal" 2 8 32 8 1024 128 causal
row "mha 1x16x16384x128 causal" "" 1 16 16 16384 128 causal
row "gqa 1x16/4x16384x128 causal" "" 1 16 4 16384 128 causal
row "gqa 1x16/4x16384x128 causal" 4 1 16 4 16384 128 causal
row "gqa 1x16/4x16384x128 causal" 2 1 16 4 16384 128 causal
row "mha 8x32x1024x128 none" "" 8 32 32 1024 128 none
row "gqa 8x32/8x1024x128 none" "" 8 32 8 1024 128 none
row "mha 16x16x2048x64 causal" "" 16 16 16 2048 64 causal
done
echo "[c2] rows at $((SECONDS - T0)) s"
for args in "8 32 8 1024" "8 32 32 1024" "1 16 4 16384" "1 16 16 16384"; do
  set -- $args
  echo "== flash backward $args x128 causal" >>"$OUT/kernels.txt"
  timeout 60 $B/attnprof profile --device cuda --backend flash --pass backward --batch $1 --heads $2 --kv-heads $3 --seq $4 --head-dim 128 \
    --mask causal --warmup 3 --active 5 --trace-dir /tmp/c2p --quiet 2>&1 | grep -E "kernel|Kernel|flash_bwd|convert|reduce|preprocess|per backward" | cut -c1-220 >>"$OUT/kernels.txt"
done
echo "[c2] kernels at $((SECONDS - T0)) s"
# hd64 forward A/B: FlashAttention-3's 192 x 128 tile (3 consumer warpgroups, intra-warpgroup overlap, no
# pingpong) against the default (2 consumers, pingpong), each build's plugin swapped in turn, cudnn beside.
B=build/gpu
cp $B/libattnprof_cuda.so /tmp/a.so
K=src/backends/cuda/kernels/flash_fwd_sm90_cfg.cuh; cp $K /tmp/cfg.orig
python3 - "$K" <<'PY'
import sys
p = sys.argv[1]; s = open(p).read()
old = "template <>\nstruct FlashSm90DefaultCfgOf<192> {"
assert old in s
s = s.replace(old, "template <>\nstruct FlashSm90DefaultCfgOf<64> {\n  using type = FlashSm90Cfg<64, 128, 3, 2, false, true, false, true>;\n};\n" + old)
open(p, "w").write(s)
PY
BUILD_TARGET="attnprof_cuda" scripts/gpu.sh build >/tmp/bbuild.txt 2>&1 || { tail -5 /tmp/bbuild.txt; echo "b build failed"; }
cp $B/libattnprof_cuda.so /tmp/b.so; cp /tmp/cfg.orig $K
echo "[c2] b built at $((SECONDS - T0)) s"
shapes=("--batch 16 --heads 16 --seq 2048 --head-dim 64 --mask causal" "--batch 8 --heads 16 --seq 1024 --head-dim 64 --mask causal"
  "--batch 4 --heads 16 --seq 4096 --head-dim 64 --mask causal" "--batch 16 --heads 16 --seq 2048 --head-dim 64 --mask none")
for round in 1 2; do for which in a b; do
  (( $(left) < 40 )) && break 2
  cp /tmp/$which.so $B/libattnprof_cuda.so
  for s in "${shapes[@]}"; do
    line=$(timeout 40 $B/attnprof compare --device cuda --backends flash,cudnn --dtype bf16 $s --warmup 5 --active 20 --quiet \
      --trace-dir /tmp/ab_traces 2>&1 | grep -E "^(flash|cudnn) " | awk '{print $1, $4, $5, $12, $13}' | tr '\n' ' ')
    echo "$which r$round | $s | $line" | tee -a "$OUT/ab64.txt" >/dev/null
  done
done; done
cp /tmp/a.so $B/libattnprof_cuda.so
echo "[c2] ab done at $((SECONDS - T0)) s"
echo "================ table ($((SECONDS - T0)) s)"
cat "$OUT/launch_floor.txt"; cat "$OUT/rows.txt"; tail -3 "$OUT/errors.txt" 2>/dev/null
cat "$OUT/kernels.txt" | head -40
cat "$OUT/ab64.txt" 2>/dev/null
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } | tee "$OUT/when.txt"
if (($(find "$OUT" -type f | wc -l) > 8)); then
  tar czf /tmp/results.tar.gz -C "$OUT" . && find "$OUT" -type f -delete && mv /tmp/results.tar.gz "$OUT/"
fi
