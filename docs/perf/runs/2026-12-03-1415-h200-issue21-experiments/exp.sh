#!/bin/bash
# Experiment (not committed): staged dQ at 192 (2 stages) / 256 (1 stage) for the default backward,
# and key-tile-fastest order under masks at every head dim.
CD=$(python3 -c 'import nvidia.cudnn,os;print(os.path.join(list(nvidia.cudnn.__path__)[0],"lib"))')
export LD_LIBRARY_PATH=$PWD/build/sm90:$CD:$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-} ATTNPROF_CEILING_TFLOPS=774 ATTNPROF_COPY_GBS=4200
date -u
ATTNPROF_EXP_STAGED=1 ATTNPROF_EXP_KEYFAST=1 timeout 100 build/sm90/tests/attnprof_gpu_tests --gtest_filter='*FusedBackward*' --gtest_brief=1 2>&1 | tail -3
run() {  # VAR LABEL args...
  local var=$1 label=$2; shift 2
  for v in base exp; do
    if [ $v = exp ]; then export $var=1; else unset $var; fi
    timeout 60 build/sm90/attnprof compare --device cuda --pass backward --backends flash "$@" --check-rows 4 \
      --json /tmp/x.json --trace-dir /tmp/x --quiet >/tmp/x.txt 2>&1 || { echo "$label $v rc $? $(tail -1 /tmp/x.txt)"; continue; }
    python3 -c "import json;r=json.load(open('/tmp/x.json'))['results'][0];print(f\"$label $v {r['device_time_us']:.1f} us {r['tflops']:.1f} TF accepted {r.get('accepted')}\")"
  done
  unset $var
}
for rep in 1 2; do
  run ATTNPROF_EXP_STAGED hd256_causal --batch 2 --heads 16 --seq 4096 --head-dim 256 --mask causal
  run ATTNPROF_EXP_STAGED hd192_causal --batch 2 --heads 16 --seq 4096 --head-dim 192 --mask causal
  run ATTNPROF_EXP_STAGED hd192_none_2k --batch 2 --heads 16 --seq 2048 --head-dim 192 --mask none
  run ATTNPROF_EXP_KEYFAST 8k_causal --batch 2 --heads 16 --seq 8192 --head-dim 128 --mask causal
  run ATTNPROF_EXP_KEYFAST 16k_causal --batch 1 --heads 16 --seq 16384 --head-dim 128 --mask causal
  run ATTNPROF_EXP_KEYFAST fp16_2k --batch 4 --heads 16 --seq 2048 --head-dim 128 --mask causal --dtype fp16
  run ATTNPROF_EXP_KEYFAST hd64_4k --batch 4 --heads 16 --seq 4096 --head-dim 64 --mask causal
  run ATTNPROF_EXP_KEYFAST hd64_1k --batch 8 --heads 16 --seq 1024 --head-dim 64 --mask causal
  run ATTNPROF_EXP_KEYFAST gqa_4k --batch 2 --heads 32 --kv-heads 8 --seq 4096 --head-dim 128 --mask causal
  run ATTNPROF_EXP_KEYFAST hd96_4k --batch 2 --heads 24 --seq 4096 --head-dim 96 --mask causal
done
date -u
