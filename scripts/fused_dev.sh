#!/usr/bin/env bash
# Builds and runs our fused attention kernels on their own (CMake targets that leave the rest of attnprof out):
#   scripts/fused_dev.sh build     # CMake targets: test binary (GoogleTest) + timing harness into build/fused_dev
#   scripts/fused_dev.sh test      # correctness against the float64 reference
#   scripts/fused_dev.sh sanitize  # compute-sanitizer memcheck + racecheck on small cases
#   scripts/fused_dev.sh bench     # timing table (scripts/fused_dev_main.cu)
#   scripts/fused_dev.sh torch     # PyTorch's flash, efficient and cuDNN, timed the same way (scripts/fused_dev_torch.py)
#   scripts/fused_dev.sh ncu       # Nsight Compute: our D=128 flash and PyTorch's FA2, 2x16x8192x128 non-causal
# Several steps may be given in one call: scripts/fused_dev.sh build test bench
set -euo pipefail
cd "$(dirname "$0")/.."
# The binaries are CMake targets (the dev-harness block at the end of
# CMakeLists.txt), so compiler flags and architectures are the project's own
# (ATTNPROF_CUDA_ARCHITECTURES); this build directory holds only them.
OUT_DIR=${OUT_DIR:-build/fused_dev}

build() {
  if [[ ! -f "$OUT_DIR/CMakeCache.txt" ]]; then
    mkdir -p "$(dirname "$OUT_DIR")"
    cmake --preset default -B "$OUT_DIR" ${CMAKE_ARGS:-} > "$OUT_DIR.configure.log" 2>&1 ||
      { cat "$OUT_DIR.configure.log" >&2; exit 1; }
  fi
  # ptxas -v lines of the translation units rebuilt by this call go to resources.txt.
  nice -n 10 cmake --build "$OUT_DIR" --target fused_kernels_test fused_dev_main > "$OUT_DIR/build.log" 2>&1 ||
    { grep -v 'ptxas info' "$OUT_DIR/build.log" >&2; echo "build failed" >&2; exit 1; }
  grep -hE "Function properties|registers|spill" "$OUT_DIR/build.log" | paste - - - |
    sed -E 's/ptxas info *: //g; s/Function properties for //' > "$OUT_DIR/resources.txt" || true
}

for step in "$@"; do
  case "$step" in
    build) build ;;
    test) "$OUT_DIR/fused_kernels_test" --gtest_brief=1 ;;
    sanitize)
      filter='All/FusedKernels.*d64_causal_200:All/FusedKernels.*bottomright_q333_k200:All/FusedKernels.*window17*:All/FusedKernels.*bshd_gqa*'
      compute-sanitizer --tool memcheck --error-exitcode 3 "$OUT_DIR/fused_kernels_test" --gtest_filter="$filter" --gtest_brief=1
      compute-sanitizer --tool racecheck --error-exitcode 4 "$OUT_DIR/fused_kernels_test" --gtest_filter="$filter" --gtest_brief=1
      ;;
    bench) "$OUT_DIR/fused_dev_main" ;;
    torch) python3 scripts/fused_dev_torch.py ;;
    ncu)
      # One launch of each kernel (after warmup), the same metrics side by side.
      metrics=sm__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum,smsp__inst_executed.sum
      metrics+=,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed_op_ldsm.sum
      metrics+=,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,smsp__issue_active.avg.pct_of_peak_sustained_active
      metrics+=,smsp__inst_executed_pipe_fma.sum,smsp__inst_executed_pipe_alu.sum,smsp__inst_executed_pipe_xu.sum
      metrics+=,"regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
      ncu --kernel-name-base mangled --launch-skip 3 --launch-count 1 --metrics "$metrics" \
        --kernel-name "regex:flash_fwd_sm80_kernel.*Li128ELi128ELi64ELb0ELi1ELb1ELNS1_8PrefetchE1EEELNS1_8MaskModeE0" "$OUT_DIR/fused_dev_main" |
        grep -vE '^(device|[0-9]+x|\|)' | grep -v '^==PROF=='
      python3 - <<'PY' >/tmp/fused_dev_torch_one.py
print("""import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
q, k, v = [torch.empty(2, 16, 8192, 128, device="cuda", dtype=torch.bfloat16).uniform_(-2, 2) for _ in range(3)]
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    for _ in range(5): F.scaled_dot_product_attention(q, k, v)
torch.cuda.synchronize()""")
PY
      ncu --launch-skip 3 --launch-count 1 --metrics "$metrics" --kernel-name regex:flash_fwd python3 /tmp/fused_dev_torch_one.py |
        grep -v '^==PROF=='
      ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
