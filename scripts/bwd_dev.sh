#!/usr/bin/env bash
# The backward's development loop on the GPU machine, in one call: its GPU
# tests, compute-sanitizer on ragged shapes, flash's backward next to our
# cudnn backend's on issue 21's rows (attnprof compare --pass backward, GPU
# time from CUPTI), as a short table, and (det) flash's --deterministic
# backward against its default one. Takes a build dir (default build/gpu),
# which may be one built elsewhere and carried (its binaries and
# libattnprof_cuda.so). Known ceilings, so compare does not measure them.
#   scripts/bwd_dev.sh [BUILD_DIR] [tests] [sanitize] [bench] [det]
set -uo pipefail
cd "$(dirname "$0")/.."
B=${1:-build/gpu}; shift || true
steps=${*:-tests sanitize bench}
CUDNN_DIR=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=$PWD/$B:${CUDNN_DIR:+$CUDNN_DIR:}$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export ATTNPROF_CEILING_TFLOPS=774 ATTNPROF_COPY_GBS=4200
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
if [[ " $steps " == *" tests "* ]]; then
  timeout 200 $B/tests/attnprof_gpu_tests --gtest_filter='*FusedBackward*:*Occupancy*:*FlashBwdSm90Order*' --gtest_brief=1 2>&1 | tail -n 15
fi
if [[ " $steps " == *" sanitize "* ]]; then
  for tool in memcheck racecheck; do
    for args in "--seq 200 --kv-seq 333 --mask causal-bottom-right --head-dim 128 --heads 4 --kv-heads 2" \
      "--seq 130 --mask sliding-window --window 20 --head-dim 96 --heads 2" \
      "--seq 190 --kv-seq 77 --mask causal --head-dim 64 --heads 3 --kv-heads 1 --deterministic" \
      "--seq 150 --kv-seq 201 --mask causal-bottom-right --head-dim 256 --heads 2 --kv-heads 1" \
      "--seq 170 --mask sliding-window --window 40 --head-dim 192 --heads 2 --deterministic" \
      "--seq 150 --kv-seq 201 --mask causal-bottom-right --head-dim 192 --heads 4 --kv-heads 2" \
      "--seq 190 --kv-seq 250 --mask none --head-dim 192 --heads 2 --kv-heads 1" \
      "--seq 210 --kv-seq 333 --mask none --head-dim 64 --heads 3 --kv-heads 1" \
      "--seq 330 --kv-seq 700 --mask none --head-dim 128 --heads 3 --kv-heads 1 --deterministic"; do
      ATTNPROF_NO_CUPTI=1 timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 $B/attnprof profile --device cuda \
        --backend flash --pass backward --batch 1 $args --warmup 0 --active 1 --unprofiled-calls 0 --trace-dir /tmp/san \
        --quiet >/tmp/san.txt 2>&1
      echo "$tool [$args] rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt | tail -1)"
    done
  done
fi
if [[ " $steps " == *" bench "* ]]; then
  printf '%-34s %-8s %12s %9s %12s %9s %7s\n' row mask "flash ms" TFLOP/s "cudnn ms" TFLOP/s ratio
  while read -r label b h hkv s d mask dtype; do
    timeout 120 $B/attnprof compare --device cuda --pass backward --backends flash,cudnn --batch $b --heads $h \
      --kv-heads $hkv --seq $s --head-dim $d --mask $mask --dtype $dtype --check-rows 16 --json /tmp/bwd.json --trace-dir /tmp/bwd \
      --quiet >/tmp/bwd.txt 2>&1 || { echo "$label: compare rc $? $(tail -1 /tmp/bwd.txt)"; continue; }
    python3 - "$label" "$mask" <<'PY'
import json, sys
d = json.load(open("/tmp/bwd.json"))
runs = {r["backend"]: r for r in d["results"]}
def cell(name):
    m = runs.get(name, {})
    if m and not m.get("accepted", True):
        print(f"  {name}: NOT ACCEPTED rel_error {m.get('rel_error')} tolerance {m.get('tolerance')}")
    if m and m.get("device_time_us") is None:
        print(f"  {name}: {(m.get('reason') or '')[:160]}")
    return m.get("device_time_us"), m.get("tflops")
(fu, ft), (cu, ct) = cell("flash"), cell("cudnn")
f = lambda x, s: (s % x) if x is not None else "-"
ratio = fu / cu if fu and cu else None
print(f"{sys.argv[1]:<34} {sys.argv[2]:<8} {f(fu and fu / 1e3, '%12.3f')} {f(ft, '%9.1f')} {f(cu and cu / 1e3, '%12.3f')} "
      f"{f(ct, '%9.1f')} {f(ratio, '%7.2f')}")
PY
  done <<'ROWS'
grid_8x16x1024x64 8 16 16 1024 64 causal bf16
grid_4x16x4096x64 4 16 16 4096 64 causal bf16
grid_2x16x8192x128 2 16 16 8192 128 causal bf16
grid_2x16x8192x128 2 16 16 8192 128 none bf16
grid_1x16x16384x128 1 16 16 16384 128 causal bf16
gqa_2x32/8x4096x128 2 32 8 4096 128 causal bf16
hd64_2x16x8192x64 2 16 16 8192 64 none bf16
hd96_2x24x4096x96 2 24 24 4096 96 causal bf16
fp16_4x16x2048x128 4 16 16 2048 128 causal fp16
hd256_2x16x4096x256 2 16 16 4096 256 causal bf16
hd192_2x16x4096x192 2 16 16 4096 192 causal bf16
heads128_8x16x4096x128 8 16 16 4096 128 causal bf16
llama_4x16/4x2048x128 4 16 4 2048 128 causal bf16
ROWS
fi
if [[ " $steps " == *" det "* ]]; then
  printf '%-34s %-8s %12s %14s %7s\n' row mask "default ms" "determin. ms" ratio
  while read -r label b h hkv s d mask; do
    for det in "" --deterministic; do
      timeout 120 $B/attnprof compare --device cuda --pass backward --backends flash --batch $b --heads $h \
        --kv-heads $hkv --seq $s \
        --head-dim $d --mask $mask --check-rows 8 $det --json /tmp/det$det.json --trace-dir /tmp/det --quiet \
        >/tmp/det.txt 2>&1 || echo "$label $det: compare rc $? $(tail -1 /tmp/det.txt)"
    done
    python3 - "$label" "$mask" <<'PY'
import json, sys
t = [json.load(open(f))["results"][0]["device_time_us"] for f in ("/tmp/det.json", "/tmp/det--deterministic.json")]
print(f"{sys.argv[1]:<34} {sys.argv[2]:<8} {t[0] / 1e3:12.3f} {t[1] / 1e3:14.3f} {t[1] / t[0]:7.2f}")
PY
  done <<'ROWS'
grid_8x16x1024x64 8 16 16 1024 64 causal
grid_4x16x4096x64 4 16 16 4096 64 causal
grid_2x16x8192x128 2 16 16 8192 128 causal
grid_2x16x8192x128 2 16 16 8192 128 none
grid_1x16x16384x128 1 16 16 16384 128 causal
gqa_2x32/8x4096x128 2 32 8 4096 128 causal
hd64_2x16x8192x64 2 16 16 8192 64 none
hd96_2x24x4096x96 2 24 24 4096 96 causal
hd256_2x16x4096x256 2 16 16 4096 256 causal
hd192_2x16x4096x192 2 16 16 4096 192 causal
none_1x8x32768x64_past_the_SMs 1 8 8 32768 64 none
ROWS
fi
