#!/usr/bin/env python3
"""Our CPU flash at each kernel level against PyTorch's CPU SDPA (issue 25).

For every row of issue 25's table, in the same process order each time: our
flash at each level this CPU runs (bench/cpu_isa_bench, one process per level,
ATTNPROF_CPU_ISA forced), then PyTorch's scaled_dot_product_attention on the
CPU with torch.set_num_threads(threads); medians of --repeats after warm-up
(ours: untimed calls for cpu_isa_bench's --warmup-ms, 500 ms, past a fresh
process's slow first ~100 ms; PyTorch: one call in this long-lived process).
One backward row: our flash backward against autograd through PyTorch's CPU
SDPA (the backward alone, retain_graph). Prints a markdown table with the
machine's ISA, ratios against PyTorch and the 0.80x / 1.00x targets.

A lent machine's cores run slowly for their first seconds (seen on the H200
host: the same call 26 ms in the first seconds, 11 ms a minute later), so
the cores are kept busy for --warmup-seconds before the first row, and each
row is measured in --rounds rounds (ours at every level, then PyTorch, in
turn): each figure is the lowest of its rounds' medians, the round the
machine disturbed least, for both sides alike. "per round" gives the range
of ours / PyTorch within each round (the two measured a few seconds apart):
when the host drifts between rounds, that range says how far the ratio of
the lowest figures can be trusted.

--torch-isa avx2 holds both sides to AVX2, for issue 25's AVX2-only row on a
machine that has more: PyTorch's own kernels (ATEN_CPU_CAPABILITY), MKL's
(MKL_ENABLE_INSTRUCTIONS) and oneDNN's (ONEDNN_MAX_CPU_ISA) are capped at AVX2
before torch is imported, and ours run at the scalar and avx2 levels only.
The cores, caches and memory stay this machine's, so it stands in for an
AVX2-only machine's instructions, not for its speed.

  python3 bench/cpu_isa_vs_torch.py --bench BUILD/bench/cpu_isa_bench [--threads 2] [--repeats 5]
      [--rounds 3] [--warmup-seconds 20] [--torch-isa avx2]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    batch: int
    heads: int
    seq: int
    head_dim: int
    causal: bool
    dtype: str  # "fp32" or "bf16"
    backward: bool = False

    def label(self) -> str:
        mask = "causal" if self.causal else "non-causal"
        pass_ = " backward" if self.backward else ""
        return f"{self.batch}x{self.heads}x{self.seq}x{self.head_dim} {mask}{pass_}"


# Issue 25's rows, then the backward row.
ROWS = [
    Row(2, 8, 1024, 64, True, "fp32"),
    Row(2, 8, 1024, 64, True, "bf16"),
    Row(1, 16, 4096, 64, True, "fp32"),
    Row(1, 8, 8192, 64, True, "fp32"),
    Row(1, 16, 4096, 128, False, "bf16"),
    Row(2, 8, 1024, 64, True, "fp32", backward=True),
    Row(2, 8, 1024, 64, True, "bf16", backward=True),
]

# The levels worth timing per dtype: fp32 runs the same FP32 kernels at
# avx512, avx512bf16 and amx (their bf16 products take bf16 inputs only);
# the scalar level only on the smallest rows (it is 10x slower).
LEVELS = {"fp32": ["scalar", "avx2", "avx512"], "bf16": ["scalar", "avx2", "avx512", "avx512bf16", "amx"]}
SCALAR_MAX_FLOP = 5e9


def ours(bench: str, row: Row, level: str, threads: int, repeats: int) -> tuple[float | None, str]:
    cmd = [bench, "--isa", level, "--batch", str(row.batch), "--heads", str(row.heads), "--seq", str(row.seq),
           "--head-dim", str(row.head_dim), "--dtype", row.dtype, "--mask", "causal" if row.causal else "none",
           "--pass", "backward" if row.backward else "forward", "--threads", str(threads), "--repeats", str(repeats)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    line = (r.stdout.strip().splitlines() or [r.stderr.strip()])[-1]
    if r.returncode != 0 or not line.startswith("ms "):
        return None, line
    parts = line.split(" ", 5)
    return float(parts[1]), parts[5] if len(parts) > 5 else ""


def torch_ms(row: Row, threads: int, repeats: int) -> float:
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    dtype = torch.float32 if row.dtype == "fp32" else torch.bfloat16
    g = torch.Generator().manual_seed(0)
    shape = (row.batch, row.heads, row.seq, row.head_dim)
    q, k, v = (torch.rand(shape, generator=g).mul_(2).sub_(1).to(dtype) for _ in range(3))
    if not row.backward:
        def call() -> None:
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=row.causal)
    else:
        for t in (q, k, v):
            t.requires_grad_(True)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=row.causal)
        dout = torch.rand(shape, generator=g).to(dtype)

        def call() -> None:
            out.backward(dout, retain_graph=True)
    call()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def warm_up(bench: str, seconds: float, threads: int) -> int:
    """Keeps the cores busy with our kernel and PyTorch's until `seconds` have passed; returns the calls made."""
    row = Row(2, 8, 1024, 64, True, "fp32")
    calls = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        ours(bench, row, "auto", threads, 5)
        torch_ms(row, threads, 5)
        calls += 1
    return calls


def flops(row: Row) -> float:
    pairs = row.seq * (row.seq + 1) / 2 if row.causal else row.seq * row.seq
    f = 4.0 * row.batch * row.heads * pairs * row.head_dim
    return f * 2.5 if row.backward else f


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", required=True, help="path to cpu_isa_bench")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rows", default="", help="comma-separated row indices (default: all)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per row; each figure is the lowest round median")
    ap.add_argument("--warmup-seconds", type=float, default=20.0, help="busy seconds before the first row")
    ap.add_argument("--torch-isa", choices=("best", "avx2"), default="best",
                    help="avx2: both sides held to AVX2 (see above); best: each side at its best")
    a = ap.parse_args()
    levels_cap = None
    if a.torch_isa == "avx2":
        if "torch" in sys.modules:
            sys.exit("cpu_isa_vs_torch: --torch-isa must be set before torch is imported")
        os.environ.update(ATEN_CPU_CAPABILITY="avx2", MKL_ENABLE_INSTRUCTIONS="AVX2", ONEDNN_MAX_CPU_ISA="AVX2")
        levels_cap = {"scalar", "avx2"}

    levels_out = subprocess.run([a.bench, "--levels"], capture_output=True, text=True, check=True).stdout
    runnable = {ln.split()[0] for ln in levels_out.splitlines() if ln.endswith(" ok")}
    print("levels on this CPU:\n" + "".join("  " + ln + "\n" for ln in levels_out.splitlines()))
    import torch

    rounds = max(1, a.rounds)
    warm = warm_up(a.bench, a.warmup_seconds, a.threads) if a.warmup_seconds > 0 else 0
    capped = ""
    if levels_cap:
        held = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")
        capped = " (held to AVX2: " + ", ".join(f"{k}={os.environ[k]}" for k in held) + ")"
    print(f"torch {torch.__version__}, threads {a.threads}, CPU capability {torch.backends.cpu.get_cpu_capability()}"
          f"{capped}; "
          f"{a.warmup_seconds:g} s of warm-up ({warm} rounds of both at 2x8x1024x64), then per row {rounds} rounds "
          f"of (ours at each level, PyTorch), each a median of {a.repeats} after one warmup call; the lowest "
          f"round median of each\n")

    rows = ROWS if not a.rows else [ROWS[int(i)] for i in a.rows.split(",")]
    print("| shape | dtype | level | our flash | PyTorch SDPA | ours / PyTorch | per round | target | met |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    stories: dict[str, str] = {}
    for row in rows:
        levels = [lv for lv in LEVELS[row.dtype] if not (lv == "scalar" and flops(row) > SCALAR_MAX_FLOP)
                  and (levels_cap is None or lv in levels_cap)]
        best: dict[str, float | None] = {}
        notes: dict[str, str] = {}
        paired: dict[str, list[float]] = {}  # ours / PyTorch within each round: drift between rounds cancels
        ref = float("inf")
        for _ in range(rounds):
            this_round: dict[str, float] = {}
            for level in levels:
                if level not in runnable:
                    best[level], notes[level] = None, "skipped: this CPU lacks it"
                    continue
                ms, story = ours(a.bench, row, level, a.threads, a.repeats)
                if ms is None:
                    best[level], notes[level] = None, story
                    continue
                prev = best.get(level)
                best[level] = ms if prev is None else min(prev, ms)
                this_round[level] = ms
                notes[level] = story
                stories[f"{level} {row.dtype}{' backward' if row.backward else ''}"] = story
            ref_round = torch_ms(row, a.threads, a.repeats)
            ref = min(ref, ref_round)
            for level, ms in this_round.items():
                paired.setdefault(level, []).append(ms / ref_round)
        results = [(level, best.get(level), notes.get(level, "")) for level in levels]
        target = 1.00 if row.backward else 0.80
        for level, ms, story in results:
            if ms is None:
                print(f"| {row.label()} | {row.dtype} | {level} | {story} | {ref:.1f} ms | - | - | {target:.2f} | - |")
                continue
            ratio = ms / ref
            met = "yes" if ratio <= target else "no"
            pr = paired.get(level, [])
            per_round = f"{min(pr):.2f}-{max(pr):.2f}" if len(pr) > 1 else "-"
            print(f"| {row.label()} | {row.dtype} | {level} | {ms:.1f} ms | {ref:.1f} ms | {ratio:.2f} | {per_round} | "
                  f"{target:.2f} | {met} |", flush=True)
    print("\nkernels (each level's own story):")
    for key, story in stories.items():
        print(f"  {key}: {story}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
