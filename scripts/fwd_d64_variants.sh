#!/usr/bin/env bash
# scripts/fwd_d64_variants.sh: head dim 64's sm90 forward tile variants against the default, on one card in one
# call (flash is 8-11% behind cudnn there: docs/perf/forward.md, 2026-12-07). Each variant specializes
# FlashSm90DefaultCfgOf<64> (or the persistent grid's switch) in the head-dim-64 translation unit only: one TU
# rebuilt and the plugin relinked, about 30 s. Then the hd64 prefill rows under `attnprof compare` (flash, cudnn
# beside), and the default again last. Reuses build/gpu when it is there (BUILD=1 rebuilds). Lines land in
# $OUT/ab64v.txt. The source tree is put back as it was at the end.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export OUT=${OUT:-/tmp/attnprof-gpu}; mkdir -p "$OUT"; T0=$SECONDS
CUDNN_DIR=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=$CUDNN_DIR:$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
B=build/gpu
left() { echo $((${LIMIT:-560} - (SECONDS - T0))); }
[[ -x $B/attnprof && -f $B/libattnprof_cuda.so && -z ${BUILD:-} ]] || BUILD_TARGET="attnprof attnprof_cuda" scripts/gpu.sh build >/dev/null 2>&1
TU=src/backends/cuda/instantiations/flash_fwd_sm90_hdim64.cu; cp $TU /tmp/hd64.cu.orig
trap 'cp /tmp/hd64.cu.orig $TU' EXIT  # the tree as it was, however the run ends
# name|the specialization put before the kernels (FlashSm90Cfg<D, N, consumers, stages, skip_rescale, wg_producer,
# pingpong, intra_overlap, fma_exp2, cap_fixed_base, tensor_row_sums>); the default is <64, 128, 2, 2, false, true,
# true, true>, persistent. Each compiled on the dev machine (sm_90a) first: none fails, none spills.
variants=(
  "no_pingpong|template <> struct FlashSm90DefaultCfgOf<64> { using type = FlashSm90Cfg<64, 128, 2, 2, false, true, false, true>; };"
  "three_stages|template <> struct FlashSm90DefaultCfgOf<64> { using type = FlashSm90Cfg<64, 128, 2, 3, false, true, true, true>; };"
  "tensor_row_sums|template <> struct FlashSm90DefaultCfgOf<64> { using type = FlashSm90Cfg<64, 128, 2, 2, false, true, true, true, 0, false, true>; };"
  "skip_rescale|template <> struct FlashSm90DefaultCfgOf<64> { using type = FlashSm90Cfg<64, 128, 2, 2, true, true, true, true>; };"
  "fma_exp2_1|template <> struct FlashSm90DefaultCfgOf<64> { using type = FlashSm90Cfg<64, 128, 2, 2, false, true, true, true, 1>; };"
  "not_persistent|template <> inline constexpr bool kFlashSm90PersistentDefault<64> = false;"
)
shapes=("--batch 16 --heads 16 --seq 2048 --head-dim 64 --mask causal" "--batch 8 --heads 16 --seq 1024 --head-dim 64 --mask causal"
  "--batch 4 --heads 16 --seq 4096 --head-dim 64 --mask causal" "--batch 16 --heads 16 --seq 2048 --head-dim 64 --mask none")
measure() {
  for s in "${shapes[@]}"; do
    line=$(timeout 40 $B/attnprof compare --device cuda --backends flash,cudnn --dtype bf16 $s --warmup 5 --active 20 --quiet \
      --trace-dir /tmp/ab_traces 2>&1 | grep -E "^(flash|cudnn) " | awk '{print $1, $4, $5, $12, $13}' | tr '\n' ' ')
    echo "$1 | $s | $line" | tee -a "$OUT/ab64v.txt"
  done
}
measure default
for v in "${variants[@]}"; do
  (( $(left) < 70 )) && break
  name=${v%%|*}; code=${v#*|}
  { echo '#include "backends/cuda/kernels/flash_fwd_sm90_cfg.cuh"'
    echo "namespace attnprof::cuda::kernels { $code }"
    cat /tmp/hd64.cu.orig; } >$TU
  if ! cmake --build $B --target attnprof_cuda >/tmp/v.txt 2>&1; then echo "$name | build failed: $(grep -m2 error /tmp/v.txt)" | tee -a "$OUT/ab64v.txt"; continue; fi
  echo "$name | spills: $(grep -c spill /tmp/v.txt)" | tee -a "$OUT/ab64v.txt"
  measure "$name"
done
cp /tmp/hd64.cu.orig $TU; cmake --build $B --target attnprof_cuda >/dev/null 2>&1
(( $(left) > 40 )) && measure default_again
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } >>"$OUT/ab64v.txt"
