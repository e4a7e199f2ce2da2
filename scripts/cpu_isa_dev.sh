#!/usr/bin/env bash
# Issue 25 on a machine with other instructions than the dev box's (an Intel
# Xeon with AVX-512, AVX512-BF16, AMX): in one call, from a build carried
# there (`cmake --preset cpu -B build/cpu && cmake --build build/cpu --target
# attnprof attnprof_tests cpu_isa_bench` here), or built there when none is
# given and a compiler is at hand:
#   1. the CPU model and the /proc/cpuinfo flags the kernel levels need, and
#      what each level lacks (cpu_isa_bench --levels);
#   2. the CPU ISA tests (every level against float64, forward and backward,
#      fp32 and bf16; the levels this CPU lacks skipped by name; a forced
#      missing level refused in one line) and the CPU flash suites;
#   3. the ceilings per dtype (sgemm; the best bf16 product);
#   4. the benchmark: our CPU flash at each level against PyTorch's CPU SDPA on
#      issue 25's rows and the backward against autograd (2 threads, taskset
#      -c 0,1, medians), bench/cpu_isa_vs_torch.py.
# Usage: scripts/cpu_isa_dev.sh [BUILD_DIR]   (default build/cpu). Output: stdout,
# and $OUT/cpu_isa.txt when OUT is set. About 2-4 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
B=${1:-build/cpu}
OUT_FILE=${OUT:+$OUT/cpu_isa.txt}
exec > >(tee ${OUT_FILE:+"$OUT_FILE"}) 2>&1
log() { echo "[cpu_isa_dev $(date +%T)] $*"; }

# Libraries the carried programs need that the machine may lack (simdjson:
# scripts/device_carry.sh unpacks Debian's into .deps/).
[[ -d .deps/usr/lib/x86_64-linux-gnu ]] && export LD_LIBRARY_PATH=$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}

if [[ ! -x $B/bench/cpu_isa_bench ]]; then
  log "no build at $B: configuring and building the CPU-only preset there"
  extra=()
  [[ -d .deps/usr ]] && extra+=(-DCMAKE_PREFIX_PATH="$PWD/.deps/usr")
  cmake -S . -B "$B" -G Ninja -DATTNPROF_CUDA=OFF -DATTNPROF_PYTHON=OFF -DCMAKE_BUILD_TYPE=Release "${extra[@]}" \
    >/tmp/cpu_isa_cfg.txt 2>&1 && cmake --build "$B" -j"$(nproc)" --target attnprof attnprof_tests cpu_isa_bench \
    >/tmp/cpu_isa_build.txt 2>&1 || { tail -30 /tmp/cpu_isa_cfg.txt /tmp/cpu_isa_build.txt; log "build failed"; exit 1; }
fi
B=$(cd "$B" && pwd)
for prog in "$B/attnprof" "$B/tests/attnprof_tests" "$B/bench/cpu_isa_bench"; do
  if ldd "$prog" | grep -q "not found"; then
    ldd "$prog" | grep "not found"
    log "$prog misses libraries (carry .deps/ from scripts/device_carry.sh)"
    exit 1
  fi
done

log "1. the machine"
grep -m1 "model name" /proc/cpuinfo
echo "cores: $(nproc); flags the kernel levels use:"
grep -m1 "^flags" /proc/cpuinfo | tr ' ' '\n' | grep -xE 'sse2|avx2|fma|f16c|avx512f|avx512bw|avx512vl|avx512dq|avx512_bf16|avx512_fp16|amx_tile|amx_bf16|amx_int8' | tr '\n' ' '
echo
uname -r
"$B/bench/cpu_isa_bench" --levels

log "2. the CPU ISA tests and the CPU flash suites"
export ATTNPROF_CLI=$B/attnprof OMP_WAIT_POLICY=PASSIVE
timeout 300 taskset -c 0,1 "$B/tests/attnprof_tests" --gtest_brief=0 \
  --gtest_filter='*FlashIsa*:Softcap.FlashVectorTanh*:*FlashBackward*:FlashCpu.*:*FlashMasks*:Cpu/PagedPasses.*:Cpu/SoftcapBackends.*:Cpu/VarlenBackends.*' \
  >/tmp/cpu_isa_tests.txt 2>&1
echo "tests rc $?"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |cannot run here|^\[==========\]" /tmp/cpu_isa_tests.txt | head -60
grep -A8 "Failure" /tmp/cpu_isa_tests.txt | head -80

log "3. ceilings (2 threads)"
taskset -c 0,1 "$B/bench/cpu_isa_bench" --ceilings --threads 2

log "4. our CPU flash per level vs PyTorch CPU SDPA (2 threads)"
taskset -c 0,1 python3 bench/cpu_isa_vs_torch.py --bench "$B/bench/cpu_isa_bench" --threads 2 --repeats 5
log "done"
