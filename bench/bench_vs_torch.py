#!/usr/bin/env python3
"""attnprof's CUDA backends next to PyTorch's: DESIGN.md's grid, issue 12's shape classes, issue 21's backward set.

One run on the GPU machine: for every row, `attnprof compare --json` times our
backends (GPU time = kernel time per forward read from CUPTI records; host
time = CPU time of one forward call, with no profiler attached and under CUPTI),
and torch.profiler times PyTorch's the same way (SDPA math, efficient, flash,
cudnn, and hand-written naive and in-place naive). Prints one table per backend
pair (GPU time, TFLOP/s, host us per call, ratio ours/PyTorch), then a summary
with one line per row: our flash and cudnn, PyTorch's SDPA as it dispatches by
itself and its cuDNN SDPA, flash/cudnn and flash/torch, TFLOP/s, for decode rows
the K/V bytes read per second against a device-to-device copy measured in the
same run, and whether issue 12's targets are met. Writes JSON and Markdown.

--shapes picks the rows:
  grid      DESIGN.md's grid, every backend (files bench.*; the default)
  classes   grouped-query, ViT-like, long context, head dim 256, and the grid's
            2x16x8192x128 non-causal row (the 700 TFLOP/s target): our flash
            and cudnn, PyTorch's SDPA (files bench_shapes.*)
  decode    batch 64, 32 query heads over 8 K/V heads, 4096 keys, head dim 128,
            1, 4 and 16 queries, bottom-right causal, contiguous and paged
            (pages of 64 and 16) caches (files bench_decode.*); PyTorch has no
            paged SDPA, so its columns on paged rows are its contiguous times
  all       the three (files bench_all.*)
  backward  with --pass backward only: issue 21's set, the grid's rows and
            grouped-query (2 x 32 query heads over 8 K/V heads, 4k, head dim
            128, causal), non-causal head dim 64 (2x16x8192), head dim 96 causal
            (2x24x4096), head dim 256 causal (2x16x4096) and fp16 causal head
            dim 128 (4x16x2048; every other row is bf16): our flash and cudnn,
            PyTorch's SDPA as it dispatches by itself and with its flash and
            cuDNN forced (files bench_backward.*, as the grid's backward); the
            summary judges flash <= 1.00x cudnn on each row (met or missed with
            the ratio; no figure, with the reason, where either refused) and
            counts the rows
A backend that refuses a row (a PyTorch backend that cannot take a shape, our
efficient on a paged cache) gets its one-line reason under the table; the run
goes on.

With --pass backward, the same for the backward alone: ours through
`attnprof compare --pass backward` (the forward's saved tensors in place), and
PyTorch's autograd through torch.autograd.grad on a graph built once, timed the
same way (backward FLOPs are 2.5x the forward's). Files: <stem>_backward.* (the
grid's: bench_backward.*). Decode rows are forward only. The summary of a
backward run judges issue 21's target (flash <= 1.00x cudnn) instead of issue
12's forward ones.

--smoke runs the same code on the CPU at shrunk shapes (seconds; the plumbing,
not the figures); --dry-run prints the rows and our commands and runs nothing.

  python3 bench/bench_vs_torch.py --attnprof build/gpu/attnprof --out OUTDIR [--shapes grid|classes|decode|all]
      [--pass backward] [--rows N] [--smoke | --dry-run]
  python3 bench/bench_vs_torch.py --attnprof build/gpu/attnprof --out OUTDIR --shapes backward --pass backward
"""
import argparse
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time

import torch

import torch_timing
from bench_tables import FINDINGS_KEPT, detail_table, did_not_run, findings_list, first_line, summarize, summary_table
from torch_timing import copy_ceiling, run_torch


@dataclasses.dataclass(frozen=True)
class Row:
    """One problem: B x H (Hkv K/V heads) x S queries (Skv keys) x D, in bf16 or fp16."""

    cls: str  # grid, headline, gqa, vit, long, hd256, decode
    b: int
    h: int
    hkv: int
    sq: int
    skv: int
    d: int
    mask: str  # none, causal (top-left, PyTorch's is_causal), causal-bottom-right
    kv_cache: str = "contiguous"
    page_size: int = 0
    dtype: str = "bf16"  # or fp16: attnprof's --dtype, and PyTorch's inputs

    @property
    def paged(self):
        return self.kv_cache == "paged"

    def shape(self):
        heads = f"{self.h}/{self.hkv}" if self.hkv != self.h else f"{self.h}"
        seqs = f"{self.sq}/{self.skv}" if self.skv != self.sq else f"{self.sq}"
        return f"{self.b}x{heads}x{seqs}x{self.d}"

    def cache(self):
        return f"paged {self.page_size}" if self.paged else "contiguous"

    def label(self):
        """Class, shape, mask, cache, and the dtype where it is not bf16: how the logs name the row."""
        return f"{self.cls} {self.shape()} {self.mask} {self.cache()}" + (
            f" {self.dtype}" if self.dtype != "bf16" else "")

    def slug(self):
        return "_".join(str(x) for x in (self.b, self.h, self.hkv, self.sq, self.skv, self.d, self.mask)) + (
            f"_paged{self.page_size}" if self.paged else "") + (f"_{self.dtype}" if self.dtype != "bf16" else "")

    def contiguous(self):
        """The same problem on a contiguous cache: what PyTorch times for a paged row."""
        return dataclasses.replace(self, kv_cache="contiguous", page_size=0)

    def same_problem(self):
        """What two rows of different classes share when they are one problem."""
        return (self.b, self.h, self.hkv, self.sq, self.skv, self.d, self.mask, self.kv_cache, self.page_size,
                self.dtype)

    def visible_pairs(self):
        """Query-key pairs the mask keeps, as attnprof's Problem::visible_pairs counts them."""
        if self.mask == "none":
            return self.sq * self.skv
        offset = self.skv - self.sq if self.mask == "causal-bottom-right" else 0  # query i sees keys <= i + offset
        return sum(max(0, min(i + offset, self.skv - 1) + 1) for i in range(self.sq))

    def flops(self, pass_="forward"):
        return 4.0 * self.b * self.h * self.visible_pairs() * self.d * (2.5 if pass_ == "backward" else 1.0)

    def kv_bytes(self):
        """K and V read once: Hkv * Skv * D * 2 tensors * 2 bytes (bf16 or fp16) * batch."""
        return self.hkv * self.skv * self.d * 2 * 2 * self.b


GRID = [Row("grid", b, h, h, s, s, d, "causal" if causal else "none") for b, h, s, d, causal in [
    (8, 16, 1024, 64, True),
    (4, 16, 4096, 64, True),
    (2, 16, 8192, 128, True),
    (2, 16, 8192, 128, False),
    (1, 16, 16384, 128, True),
]]
# Issue 12's shape classes. Batch 16 puts grouped-query at about 4 ms
# (0.14 TFLOP per sequence, at 550-700 TFLOP/s).
CLASSES = [
    Row("headline", 2, 16, 16, 8192, 8192, 128, "none"),  # the grid's row with the 700 TFLOP/s target
    Row("gqa", 16, 32, 8, 4096, 4096, 128, "causal"),
    Row("vit", 16, 16, 16, 2048, 2048, 64, "none"),
    Row("long", 1, 16, 16, 32768, 32768, 128, "causal"),
    Row("hd256", 2, 16, 16, 4096, 4096, 256, "causal"),
    Row("hd256", 2, 16, 16, 4096, 4096, 256, "none"),
]
DECODE = [Row("decode", 64, 32, 8, sq, 4096, 128, "causal-bottom-right", cache, page)
          for sq in (1, 4, 16) for cache, page in (("contiguous", 0), ("paged", 64), ("paged", 16))]
# Issue 21's backward rows: the grid, and the classes its target names
# (flash backward <= 1.00x our cudnn's on each).
BACKWARD = GRID + [
    Row("gqa", 2, 32, 8, 4096, 4096, 128, "causal"),
    Row("hd64", 2, 16, 16, 8192, 8192, 64, "none"),
    Row("hd96", 2, 24, 24, 4096, 4096, 96, "causal"),
    Row("hd256", 2, 16, 16, 4096, 4096, 256, "causal"),
    Row("fp16", 4, 16, 16, 2048, 2048, 128, "causal", dtype="fp16"),
]
SHAPES = {"grid": GRID, "classes": CLASSES, "decode": DECODE, "all": GRID + CLASSES + DECODE, "backward": BACKWARD}
# --shapes backward writes bench_backward.*, the files the grid's backward
# wrote before it (the JSON's meta says which set ran).
STEMS = {"grid": "bench", "classes": "bench_shapes", "decode": "bench_decode", "all": "bench_all", "backward": "bench"}

# Our backend -> PyTorch's counterpart.
PAIRS = [
    ("naive", "naive"),
    ("naive_inplace", "naive_inplace"),
    ("math", "sdpa_math"),
    ("efficient", "sdpa_efficient"),
    ("flash", "sdpa_flash"),
    ("cudnn", "sdpa_cudnn"),
]
# Outside the grid only the fused backends race: ours against cuDNN, and
# PyTorch's SDPA as it dispatches by itself ("sdpa") and with each fused
# backend forced (the math one would not fit at 32k).
FUSED_OURS = ("flash", "cudnn")
FUSED_TORCH = ("sdpa", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn")
# --shapes backward: ours against cuDNN, and PyTorch's dispatch with its flash
# and cuDNN forced (the efficient, math and naive backwards would not fit ten
# rows in about 5 minutes).
BACKWARD_TORCH = ("sdpa", "sdpa_flash", "sdpa_cudnn")


def check_rows(pass_):
    """Query rows checked against float64: the backward's dK and dV rows need
    every query's contribution, so 256 rows cost 60-180 s a row at 8-16k on
    the H200 machine's CPU (2026-12-01 23:10 run); 32 keep it to seconds."""
    return "32" if pass_ == "backward" else "256"


def ours_cmd(attnprof, row, backends, path, pass_):
    cmd = [attnprof, "compare", "--device", torch_timing.DEVICE, "--batch", str(row.b), "--heads", str(row.h),
           "--kv-heads", str(row.hkv), "--seq", str(row.sq), "--kv-seq", str(row.skv), "--head-dim", str(row.d),
           "--dtype", row.dtype, "--mask", row.mask, "--warmup", "3", "--active", "10", "--check-rows",
           check_rows(pass_), "--trace-dir", "/tmp/bench-traces", "--json", path, "--quiet", "--pass", pass_,
           "--backends", ",".join(backends)]
    if row.paged:
        cmd += ["--kv-cache", "paged", "--page-size", str(row.page_size)]
    return cmd


def ours(attnprof, row, backends, pass_="forward", timeout_s=300):
    """Our backends' records from `attnprof compare --json`; a backend that did
    not run carries its one-line reason in "reason" (eligible false, or failed)."""
    path = os.path.join("/tmp", f"ours_{pass_}_{row.slug()}.json")
    if os.path.exists(path):
        os.remove(path)
    try:
        proc = subprocess.run(ours_cmd(attnprof, row, backends, path, pass_), capture_output=True, text=True,
                              timeout=timeout_s)
        rc, tail = proc.returncode, (proc.stderr.strip() or proc.stdout.strip())
    except subprocess.TimeoutExpired:
        rc, tail = None, f"attnprof compare ran past {timeout_s} s"
    if rc not in (0, 3) or not os.path.exists(path):
        print(tail[-2000:], file=sys.stderr)
        why = first_line(tail.splitlines()[-1] if tail else f"attnprof compare exited {rc}")
        return {b: {"backend": b, "eligible": False, "failed": True, "reason": why} for b in backends}
    with open(path) as f:
        return {r["backend"]: r for r in json.load(f)["results"]}


def shrink(row):
    """--smoke: the row at a size the CPU runs in a moment, same kind of problem."""
    h, hkv = (8, 2) if row.hkv != row.h else (2, 2)
    sq, skv = (row.sq, 256) if row.sq != row.skv else (64, 64)
    return dataclasses.replace(row, b=1, h=h, hkv=hkv, sq=sq, skv=skv)


def plan(row, shapes="grid"):
    """(our backend, PyTorch's counterpart) pairs for the row, and every PyTorch variant it times."""
    fused = [p for p in PAIRS if p[0] in FUSED_OURS]
    if shapes == "backward":  # the grid's rows too
        return fused, list(BACKWARD_TORCH)
    if row.cls == "grid":
        return PAIRS, [p[1] for p in PAIRS] + ["sdpa"]
    return fused, list(FUSED_TORCH)


def rows_for(args):
    rows, seen = [], set()
    for row in SHAPES[args.shapes]:
        if row.same_problem() in seen:  # --shapes all: the grid's row stands for the headline
            continue
        seen.add(row.same_problem())
        rows.append(shrink(row) if args.smoke else row)
    rows = rows[: args.rows] if args.rows else rows
    if args.pass_ == "backward":
        rows = [r for r in rows if r.cls != "decode"]
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attnprof", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", choices=tuple(SHAPES), default="grid")
    ap.add_argument("--rows", type=int, default=0, help="first N rows only")
    ap.add_argument("--pass", dest="pass_", choices=("forward", "backward"), default="forward")
    ap.add_argument("--smoke", action="store_true", help="on the CPU at shrunk shapes: the plumbing, not the figures")
    ap.add_argument("--dry-run", action="store_true", help="print the rows and our commands; run nothing")
    args = ap.parse_args()
    if args.pass_ == "backward" and args.shapes == "decode":
        ap.error("decode rows are forward only: --pass backward takes --shapes grid, classes, all or backward")
    if args.pass_ == "forward" and args.shapes == "backward":
        ap.error("--shapes backward is issue 21's backward set: it runs with --pass backward only")
    torch_timing.DEVICE = device = "cpu" if args.smoke else "cuda"
    rows = rows_for(args)
    stem = STEMS[args.shapes] + ("_backward" if args.pass_ == "backward" else "")
    if args.dry_run:
        for row in rows:
            pairs, torch_names = plan(row, args.shapes)
            backends = [p[0] for p in pairs]
            print(f"{row.label()}: flops {row.flops(args.pass_):.3e}, "
                  f"K/V {row.kv_bytes() / 2**20:.1f} MiB, torch {','.join(torch_names)}"
                  + (" (on the contiguous cache)" if row.paged else ""))
            print("  " + shlex.join(ours_cmd(args.attnprof, row, backends, f"/tmp/ours_{row.slug()}.json", args.pass_)))
        print(f"files: {os.path.join(args.out, stem)}.json, .md")
        return
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_vs_torch: no CUDA device (--smoke runs the plumbing on the CPU)")
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    ceiling = copy_ceiling(gib=1.0 if device == "cuda" else 0.0625)
    print(f"[bench] copy ceiling {ceiling['bytes_per_s'] / 1e12:.2f} TB/s (read + write)", file=sys.stderr, flush=True)
    meta = {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "gpu": torch.cuda.get_device_name(0) if device == "cuda" else "cpu (--smoke)",
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "shapes": args.shapes, "pass": args.pass_,
            "copy_ceiling": ceiling}
    results, summary, torch_done = [], [], {}

    def write():  # after every row too: partial results survive a time-out
        table = summary_table(summary, ceiling, args.pass_) + findings_list(results)
        with open(os.path.join(args.out, stem + ".json"), "w") as f:
            json.dump({"meta": meta, "results": results, "summary": summary}, f, indent=1)
        with open(os.path.join(args.out, stem + ".md"), "w") as f:
            f.write(f"{meta}\n\n{detail_table(results)}\n\n{table}\n")
        return table

    for row in rows:
        print(f"[bench] {row.label()}", file=sys.stderr, flush=True)
        row_t0 = time.perf_counter()
        pairs, torch_names = plan(row, args.shapes)
        mine = ours(args.attnprof, row, [p[0] for p in pairs], args.pass_)
        # PyTorch's times on a paged row are its times on the contiguous cache,
        # measured once.
        key = row.contiguous()
        if key not in torch_done:
            torch_done[key] = run_torch(key, torch_names, args.pass_)
        runs = torch_done[key]
        fl = row.flops(args.pass_)
        for our_name, torch_name in pairs:
            t, m = runs.get(torch_name, {}), mine.get(our_name, {})
            o_gpu, t_gpu = m.get("device_time_us"), t.get("gpu_us")
            results.append({
                "class": row.cls, "shape": row.shape(), "dtype": row.dtype, "causal": row.mask != "none",
                "mask": row.mask,
                "kv_cache": row.kv_cache, "page_size": row.page_size or None,
                "backend": our_name, "torch": torch_name, "ours_gpu_us": o_gpu, "torch_gpu_us": t_gpu,
                "ours_reason": did_not_run(m), "torch_reason": t.get("reason"),
                "ours_host_us": m.get("host_time_unprofiled_us"), "torch_host_us": t.get("host_us"),
                "ours_host_p10_us": m.get("host_time_unprofiled_p10_us"),
                "ours_host_p90_us": m.get("host_time_unprofiled_p90_us"),
                "ours_host_profiled_us": m.get("host_time_us"), "torch_host_profiled_us": t.get("host_profiled_us"),
                "ours_tflops": fl / o_gpu / 1e6 if o_gpu else None,
                "torch_tflops": fl / t_gpu / 1e6 if t_gpu else None,
                "ratio": o_gpu / t_gpu if o_gpu and t_gpu else None,
                "ours_rel_error": m.get("rel_error"), "ours_accepted": m.get("accepted"),
                "ours_kernels": m.get("kernels_per_forward"),
                "ours_forward_gpu_us": m.get("forward_device_time_us"),
                "ours_gbs": m.get("gbs"), "ours_copy_ceiling_pct": m.get("copy_ceiling_pct"),
                # What the profiler says of the run's limits and of a split-KV decode, in its words.
                "ours_findings": {f["rule"]: f["text"] for f in m.get("findings") or []
                                  if f.get("rule") in FINDINGS_KEPT},
            })
        summary.append(summarize(row, mine, runs, fl, ceiling["bytes_per_s"], args.pass_))
        write()
        # What each row costs, so that a phase's time-out can be sized.
        print(f"[bench]   {time.perf_counter() - row_t0:.0f} s", file=sys.stderr, flush=True)
    print(detail_table(results) + "\n\n" + write())


if __name__ == "__main__":
    main()
