#!/usr/bin/env python3
"""Holistic Trace Analysis (PyPI's HolisticTraceAnalysis) reads attnprof's traces unchanged.

- A GPU-shaped trace (four profiler steps of the synthetic naive forward,
  written by our Chrome trace writer through tests/tools/report_fixtures.cpp):
  HTA finds rank 0 and the steps, and its temporal breakdown, kernel
  breakdown and CUDA kernel launch statistics agree with the numbers the
  synthetic trace was built from (tests/cpu/synthetic_trace.h).
- The CPU traces of a compare run: each loads as rank 0 with its steps.
Fails when HTA is not installed: scripts/setup.sh installs it.
"""
import argparse
import contextlib
import io
import logging
import os
import shutil
import subprocess
import sys

# The synthetic forward, per step (tests/cpu/synthetic_trace.h): kernels
# 30 + 20 + 15 + 25 + 30 us, one 40 us device-to-device memcpy, and
# launches: 4 cudaLaunchKernel, 1 cudaMemcpyAsync, 1 cuLaunchKernelEx (which
# HTA's launch statistics do not know).
COMPUTE_US = 30 + 20 + 15 + 25 + 30
MEMORY_US = 40
LAUNCHES_HTA_KNOWS = 5
KERNEL_NAMES = {"ampere_bf16_s16816gemm_bf16_128x64", "elementwise_kernel<mul>", "masked_fill_kernel",
                "softmax_warp_forward"}


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def expect(cond, msg):
    if not cond:
        fail(msg)


def analysis(trace_dir):
    from hta.trace_analysis import TraceAnalysis

    # HTA logs at INFO and prints progress; keep the test's output to what failed.
    logging.getLogger("hta").setLevel(logging.WARNING)
    with contextlib.redirect_stdout(io.StringIO()):
        return TraceAnalysis(trace_dir=trace_dir)


def check_gpu_trace(trace_dir):
    ta = analysis(trace_dir)
    expect(ta.t.get_ranks() == [0], f"ranks {ta.t.get_ranks()}, want [0] from distributedInfo")
    iterations = ta.t.get_iterations(0)
    # HTA drops the last ProfilerStep (it may be cut short): 4 written, 3 kept.
    expect([int(i) for i in iterations] == [1, 2, 3], f"iterations {iterations}, want [1, 2, 3]")

    temporal = ta.get_temporal_breakdown(visualize=False)
    row = temporal.iloc[0]
    print("HTA temporal breakdown:\n" + temporal.to_string(index=False))
    steps = len(iterations)
    expect(abs(row["compute_time(us)"] - steps * COMPUTE_US) < 1.0,
           f"compute time {row['compute_time(us)']} us, want {steps * COMPUTE_US}")
    expect(abs(row["non_compute_time(us)"] - steps * MEMORY_US) < 1.0,
           f"non-compute time {row['non_compute_time(us)']} us, want {steps * MEMORY_US}")
    expect(row["idle_time(us)"] > 0, "no idle time between the kernels")
    pct = row["idle_time_pctg"] + row["compute_time_pctg"] + row["non_compute_time_pctg"]
    expect(abs(pct - 100.0) < 0.5, f"percentages add up to {pct}")

    by_type, by_kernel = ta.get_gpu_kernel_breakdown(visualize=False, num_kernels=20)
    print("HTA kernel breakdown by type:\n" + by_type.to_string(index=False))
    types = dict(zip(by_type["kernel_type"], by_type["sum"]))
    expect(abs(types.get("COMPUTATION", 0) - steps * COMPUTE_US) < 1.0, f"COMPUTATION {types}")
    expect(abs(types.get("MEMORY", 0) - steps * MEMORY_US) < 1.0, f"MEMORY {types}")
    names = set(by_kernel["name"])
    expect(KERNEL_NAMES <= names, f"kernels {sorted(names)}, want {sorted(KERNEL_NAMES)}")
    gemm = by_kernel[by_kernel["name"] == "ampere_bf16_s16816gemm_bf16_128x64"].iloc[0]
    # Two 30 us GEMMs per step.
    expect(abs(gemm["sum (us)"] - 2 * steps * 30.0) < 0.01 and abs(gemm["mean (us)"] - 30.0) < 0.01,
           f"gemm row {gemm.to_dict()}")

    launches = ta.get_cuda_kernel_launch_stats(visualize=False)[0]
    print(f"HTA launch statistics: {len(launches)} launches, "
          f"CPU {launches['cpu_duration'].mean():.1f} us, GPU {launches['gpu_duration'].mean():.1f} us, "
          f"launch delay {launches['launch_delay'].mean():.1f} us on average")
    expect(len(launches) == steps * LAUNCHES_HTA_KNOWS, f"{len(launches)} launches, want {LAUNCHES_HTA_KNOWS} per step")
    # The first GEMM: launched at 30-40 us into the step, started at 45 us.
    first = launches[launches["correlation"] == 1].iloc[0]
    expect((first["cpu_duration"], first["gpu_duration"], first["launch_delay"]) == (10.0, 30.0, 5.0),
           f"first launch {first.to_dict()}")
    expect(abs(launches["cpu_duration"].max() - 20.0) < 0.01, "cudaMemcpyAsync's 20 us missing")


def check_cpu_traces(trace_dir, work):
    traces = sorted(f for f in os.listdir(trace_dir) if f.endswith(".json") and not f.endswith(".summary.json"))
    expect(len(traces) >= 3, f"compare wrote {traces}")
    for name in traces:
        # One directory per trace: every trace says rank 0, and HTA keeps one file per rank.
        d = os.path.join(work, "cpu-" + name[:-5])
        os.makedirs(d)
        shutil.copy(os.path.join(trace_dir, name), d)
        ta = analysis(d)
        expect(ta.t.get_ranks() == [0], f"{name}: ranks {ta.t.get_ranks()}")
        iterations = ta.t.get_iterations(0)
        expect(len(iterations) >= 1, f"{name}: no iterations")
        df = ta.t.get_trace(0)
        ops = set(ta.t.symbol_table.sym_table[i] for i in df["name"].unique())
        expect(any(o.startswith("ProfilerStep#") for o in ops), f"{name}: no ProfilerStep")
        # No kernels on the CPU: the kernel breakdown is empty. (HTA's temporal
        # breakdown needs GPU kernels and raises on a trace without them.)
        by_type, by_kernel = ta.get_gpu_kernel_breakdown(visualize=False)
        expect(by_type.empty and by_kernel.empty, f"{name}: kernels in a CPU trace: {by_kernel}")
        print(f"HTA read {name}: {len(df)} events, iterations {[int(i) for i in iterations]}, no kernels")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attnprof", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    try:
        import hta  # noqa: F401
    except ImportError:
        fail("HolisticTraceAnalysis is not installed: run scripts/setup.sh")
    shutil.rmtree(a.out, ignore_errors=True)
    gpu_dir = os.path.join(a.out, "gpu")
    os.makedirs(gpu_dir)
    subprocess.run([a.fixtures, "gpu-trace", os.path.join(gpu_dir, "synthetic_gpu.json")], check=True)
    check_gpu_trace(gpu_dir)

    cpu_dir = os.path.join(a.out, "cpu-traces")
    subprocess.run([a.attnprof, "compare", "--device", "cpu", "--batch", "1", "--heads", "2", "--seq", "128",
                    "--head-dim", "32", "--warmup", "1", "--active", "3", "--quiet", "--trace-dir", cpu_dir],
                   check=True, stdout=subprocess.DEVNULL)
    check_cpu_traces(cpu_dir, a.out)
    print("HTA test: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
