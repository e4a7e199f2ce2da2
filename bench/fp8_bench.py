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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attnprof", required=True, help="the attnprof binary")
    ap.add_argument("--out", required=True, help="folder for the JSON files and the table")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows, lines = [], []
    head = ("| shape | mask | flash fp8 TFLOP/s | cudnn fp8 TFLOP/s | flash / cudnn (<= 1.00) | flash bf16 TFLOP/s |"
            " fp8 / bf16 time | flash fp8 error | flash bf16 error | cudnn fp8 error | descales q, k, v |")
    lines += [head, "|" + " --- |" * (head.count("|") - 1)]
    def why(r):
        return r["reason"][:60] if "reason" in r else None

    for row in GRID:
        fp8 = compare(args.attnprof, row, "fp8", ["flash", "cudnn"], args.out)
        bf16 = compare(args.attnprof, row, "bf16", ["flash"], args.out)
        f, c, fb = fp8.get("flash", {}), fp8.get("cudnn", {}), bf16.get("flash", {})
        ratio = f["device_time_us"] / c["device_time_us"] if f.get("device_time_us") and c.get("device_time_us") else None
        speed = f["device_time_us"] / fb["device_time_us"] if f.get("device_time_us") and fb.get("device_time_us") else None
        quant = (f.get("fp8") or {}).get("tensors") or []
        descales = ", ".join(f"{t.get('descale', 0):.3g}" for t in quant) or "-"
        b, h, hkv, s, d, mask = row
        shape = f"{b}x{h}x{s}x{d}" + (f" ({hkv} KV heads)" if hkv != h else "")
        rec = {"shape": shape, "mask": mask, "flash_fp8": f, "cudnn_fp8": c, "flash_bf16": fb,
               "flash_over_cudnn": ratio, "fp8_over_bf16_time": speed}
        rows.append(rec)
        lines.append(
            f"| {shape} | {mask} | {fmt(f.get('tflops')) if not why(f) else why(f)} |"
            f" {fmt(c.get('tflops')) if not why(c) else why(c)} | {fmt(ratio, '.3f')} | {fmt(fb.get('tflops'))} |"
            f" {fmt(speed, '.3f')} | {fmt(f.get('rel_error'), '.2e')} | {fmt(fb.get('rel_error'), '.2e')} |"
            f" {fmt(c.get('rel_error'), '.2e')} | {descales} |")
    first = rows[0]["flash_fp8"].get("tflops")
    ratios = [r["flash_over_cudnn"] for r in rows if r["flash_over_cudnn"] is not None]
    lines.append("")
    lines.append(f"- flash FP8 at 2x16x8192x128 non-causal: {fmt(first)} TFLOP/s against the {TARGET_TFLOPS:.0f} "
                 f"target: {'met' if first and first >= TARGET_TFLOPS else 'missed'}")
    if ratios:
        lines.append(f"- flash FP8 / cudnn FP8 time: {min(ratios):.3f}-{max(ratios):.3f} over {len(ratios)} rows; "
                     f"at most 1.00 on {sum(r <= 1.0 for r in ratios)} of them: "
                     f"{'met' if all(r <= 1.0 for r in ratios) else 'missed'}")
    table = "\n".join(lines)
    with open(os.path.join(args.out, "fp8_bench.md"), "w") as fh:
        fh.write(table + "\n")
    with open(os.path.join(args.out, "fp8_bench.json"), "w") as fh:
        json.dump(rows, fh, indent=1)
    print(table)


if __name__ == "__main__":
    main()
