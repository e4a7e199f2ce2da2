#!/usr/bin/env python3
"""Issue 24's targets on one GPU, in one run, through `attnprof compare`:

  the FP8 (e4m3) forward grid: flash FP8 against cudnn FP8 (target: at most
  1.00x its time on every row) and against flash in bf16 (the throughput
  FP8 gains), with each backend's error against float64 on the same real
  inputs in FP8 and in bf16 (the error FP8 adds), and the descales used;
  2x16x8192x128 non-causal holds the 1000 TFLOP/s target.

Each row is one `attnprof compare` process per dtype (warmup 3, 10 profiled
calls, median device time per call from CUPTI; the FP8 rows' time includes
every kernel of a forward: flash's V^T pre-pass, cudnn's O conversion). A
backend that refuses a row gives its one-line reason. Writes
<out>/fp8_bench.{json,md} and prints the table.

  python3 bench/fp8_bench.py --attnprof build/attnprof --out runs/x
  python3 bench/fp8_bench.py --from-json runs/x/fp8_bench.json --out runs/x   # the table again
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_tables import run_compare  # noqa: E402

# (batch, heads, kv_heads, seq, head_dim, mask)
GRID = [
    (2, 16, 16, 8192, 128, "none"),
    (2, 16, 16, 8192, 128, "causal"),
    (4, 16, 16, 4096, 128, "none"),
    (4, 16, 16, 4096, 128, "causal"),
    (8, 16, 16, 2048, 128, "causal"),
    (16, 16, 16, 1024, 128, "none"),
    (2, 32, 8, 4096, 128, "causal"),  # grouped-query
]
TARGET_TFLOPS = 1000.0  # at the first row


def compare(attnprof, row, dtype, backends, out):
    b, h, hkv, s, d, mask = row
    tag = f"{b}x{h}x{hkv}x{s}x{d}_{mask}_{dtype}"
    path = os.path.join(out, f"fp8_{tag}.json")
    cmd = [attnprof, "compare", "--device", "cuda", "--dtype", dtype, "--batch", str(b), "--heads", str(h),
           "--kv-heads", str(hkv), "--seq", str(s), "--head-dim", str(d), "--mask", mask, "--warmup", "3",
           "--active", "10", "--check-rows", "32", "--quiet", "--json", path, "--backends", ",".join(backends),
           "--trace-dir", "/tmp/fp8-bench-traces"]
    return run_compare(cmd, path, backends)


def fmt(x, spec=".1f"):
    return "-" if x is None else format(x, spec)


def measure(attnprof, out):
    """Every row of the grid: flash and cudnn in FP8, flash in bf16 (one compare process each)."""
    rows = []
    for row in GRID:
        fp8 = compare(attnprof, row, "fp8", ["flash", "cudnn"], out)
        bf16 = compare(attnprof, row, "bf16", ["flash"], out)
        b, h, hkv, s, d, mask = row
        rows.append({"shape": f"{b}x{h}x{s}x{d}" + (f" ({hkv} KV heads)" if hkv != h else ""), "mask": mask,
                     "flash_fp8": fp8.get("flash", {}), "cudnn_fp8": fp8.get("cudnn", {}),
                     "flash_bf16": bf16.get("flash", {})})
    return rows


def ratio(a, b):
    return a["device_time_us"] / b["device_time_us"] if a.get("device_time_us") and b.get("device_time_us") else None


def render(rows):
    """The table and the targets' verdicts from measure()'s rows."""
    def cell(r, key="tflops", spec=".1f"):
        if r.get("device_time_us"):
            return fmt(r.get(key), spec)
        return "refused: " + r["reason"][:60] if r.get("reason") else "-"

    head = ("| shape | mask | flash fp8 TFLOP/s | cudnn fp8 TFLOP/s | flash / cudnn (<= 1.00) | flash bf16 TFLOP/s |"
            " fp8 / bf16 time | flash fp8 error | flash bf16 error | cudnn fp8 error | descales q, k, v |")
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for r in rows:
        f, c, fb = r["flash_fp8"], r["cudnn_fp8"], r["flash_bf16"]
        quant = (f.get("fp8") or {}).get("tensors") or []
        descales = ", ".join(f"{t.get('descale', 0):.3g}" for t in quant) or "-"
        lines.append(f"| {r['shape']} | {r['mask']} | {cell(f)} | {cell(c)} | {fmt(ratio(f, c), '.3f')} | {cell(fb)} |"
                     f" {fmt(ratio(f, fb), '.3f')} | {cell(f, 'rel_error', '.2e')} | {cell(fb, 'rel_error', '.2e')} |"
                     f" {cell(c, 'rel_error', '.2e')} | {descales} |")
    first = rows[0]["flash_fp8"].get("tflops") if rows else None
    ratios = [x for x in (ratio(r["flash_fp8"], r["cudnn_fp8"]) for r in rows) if x is not None]
    lines.append("")
    lines.append(f"- flash FP8 at 2x16x8192x128 non-causal: {fmt(first)} TFLOP/s against the {TARGET_TFLOPS:.0f} "
                 f"target: {'met' if first and first >= TARGET_TFLOPS else 'missed'}")
    if ratios:
        lines.append(f"- flash FP8 / cudnn FP8 time: {min(ratios):.3f}-{max(ratios):.3f} over {len(ratios)} rows; "
                     f"at most 1.00 on {sum(x <= 1.0 for x in ratios)} of them: "
                     f"{'met' if all(x <= 1.0 for x in ratios) else 'missed'}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attnprof", help="the attnprof binary (to measure)")
    ap.add_argument("--out", required=True, help="folder for the JSON files and the table")
    ap.add_argument("--from-json", help="render an earlier run's fp8_bench.json instead of measuring")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.from_json:
        with open(args.from_json) as fh:
            rows = json.load(fh)
    elif args.attnprof:
        rows = measure(args.attnprof, args.out)
        with open(os.path.join(args.out, "fp8_bench.json"), "w") as fh:
            json.dump(rows, fh, indent=1)
    else:
        ap.error("give --attnprof (measure) or --from-json (render)")
    table = render(rows)
    with open(os.path.join(args.out, "fp8_bench.md"), "w") as fh:
        fh.write(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
