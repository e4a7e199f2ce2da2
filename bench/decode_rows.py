"""Flash's decode kernel at many packed rows a KV head (queries x group):
the 16-row tile (four warps on the keys of each tile) against the 64-row one
(a warp each 16 rows, every key; K and V read once for 64 rows), forced
through ATTNPROF_DECODE_ROWS (read once a process: flash_decode_launch.cu's
decode_rows), beside flash's default and our cudnn, CUPTI kernel time per
forward through `attnprof compare` (each row one process). Prints one line a
row and tile, then the table with K and V's read rate; writes the records as
JSON.

With --splits N,M,..., the same at few rows a KV head (one query, the batch of
a serving step: graph_decode.py's rows), forcing the split-KV count through
ATTNPROF_DECODE_SPLITS instead of the tile.

  python3 bench/decode_rows.py --attnprof build/gpu/attnprof --out OUTDIR [--rows N] [--splits 8,16,32]
      [--split-rows check]
"""
import argparse
import json
import os
import sys

from compare_records import compare_records

# (batch, heads, kv heads, queries, keys, head dim, page size (0: contiguous)):
# bench_vs_torch.py's decode rows at 16 queries, and the rows around the
# 48-row threshold and below it.
ROWS = [
    (64, 32, 8, 16, 4096, 128, 0),
    (64, 32, 8, 16, 4096, 128, 16),
    (64, 32, 8, 12, 4096, 128, 0),
    (64, 32, 8, 8, 4096, 128, 0),
    (8, 32, 8, 16, 8192, 128, 16),
    (64, 16, 2, 16, 2048, 64, 0),
    (16, 16, 4, 16, 4096, 256, 0),
]
# One query a sequence, 32/8 heads at head dim 128, pages of 16: a decode
# step's layer at batch 1 and 16 (graph_decode.py), and a long context.
SPLIT_ROWS = [
    (1, 32, 8, 1, 512, 128, 16),
    (1, 32, 8, 1, 2048, 128, 16),
    (1, 32, 8, 1, 8192, 128, 16),
    (1, 32, 8, 1, 32768, 128, 16),
    (16, 32, 8, 1, 2048, 128, 16),
    (4, 32, 8, 1, 8192, 128, 0),
]
# Rows the split rule (decode_splits, fused_params.h) was not fitted on, for --split-rows check: other batches,
# lengths that are no power of two, grouped and multi-query heads, head dims 64 and 256, a contiguous cache, and a
# batch of more CTAs than SMs but fewer than their slots (24 x 8 KV heads).
CHECK_ROWS = [
    (2, 32, 8, 1, 4096, 128, 16),
    (8, 32, 8, 1, 1000, 128, 16),
    (1, 64, 8, 1, 16384, 128, 16),
    (4, 8, 1, 1, 8192, 128, 0),
    (1, 32, 8, 1, 8192, 64, 16),
    (1, 16, 4, 1, 4096, 256, 0),
    (24, 32, 8, 1, 2048, 128, 16),
    (3, 28, 4, 1, 3000, 128, 16),
]


def compare(attnprof, row, forced, env_var):
    b, h, hkv, sq, skv, d, page = row
    args = ["--device", "cuda", "--backends", "flash" if forced else "flash,cudnn", "--batch", str(b), "--heads",
            str(h), "--kv-heads", str(hkv), "--seq", str(sq), "--kv-seq", str(skv), "--head-dim", str(d), "--mask",
            "causal-bottom-right", "--warmup", "3", "--active", "10", "--check-rows", "256", "--trace-dir",
            "/tmp/decode-traces"]
    if page:
        args += ["--kv-cache", "paged", "--page-size", str(page)]
    recs = compare_records(attnprof, args, f"/tmp/decode_rows_{b}_{h}_{hkv}_{sq}_{skv}_{d}_{page}_{forced or 'auto'}.json",
                           env_var, forced)
    if "error" in recs:
        return recs
    return {name: {"us": r.get("device_time_us"), "accepted": r.get("accepted"), "rel_error": r.get("rel_error"),
                   "kernels": r.get("kernels_per_forward")} for name, r in recs.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attnprof", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=0, help="first N rows only")
    ap.add_argument("--splits", default="", help="split counts to force at one query (instead of the tiles)")
    ap.add_argument("--split-rows", choices=["fitted", "check"], default="fitted",
                    help="with --splits: the rows the split rule was fitted on, or rows it was not (CHECK_ROWS)")
    args = ap.parse_args()
    if args.splits:
        shapes = SPLIT_ROWS if args.split_rows == "fitted" else CHECK_ROWS
        env_var, choices = "ATTNPROF_DECODE_SPLITS", [int(x) for x in args.splits.split(",")]
    else:
        shapes, env_var, choices = ROWS, "ATTNPROF_DECODE_ROWS", [16, 64]
    results = []
    for row in shapes[: args.rows or None]:
        for forced in [0, *choices]:
            r = compare(args.attnprof, row, forced, env_var)
            b, h, hkv, sq, skv, d, page = row
            r.update(shape=f"{b}x{h}/{hkv}x{sq}/{skv}x{d} {'paged ' + str(page) if page else 'contiguous'}",
                     tile=forced or "auto", kv_bytes=2 * b * hkv * skv * d * 2)
            results.append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
    name = ("decode_splits.json" if args.split_rows == "fitted" else "decode_splits_check.json") if args.splits \
        else "decode_rows.json"
    with open(os.path.join(args.out, name), "w") as f:
        json.dump(results, f, indent=1)
    print(f"{'shape':36} {'split' if args.splits else 'tile':>5} {'flash us':>9} {'cudnn us':>9} {'ratio':>6} {'K/V TB/s':>9} ok")
    for r in results:
        if "error" in r:
            print(f"{r['shape']:36} {r['tile']:>5} error: {r['error'][:80]}")
            continue
        f, c = r.get("flash", {}), r.get("cudnn", {})
        fus, cus = f.get("us"), c.get("us")
        ratio = f"{fus / cus:6.2f}" if fus and cus else f"{'':6}"
        tbs = r["kv_bytes"] / fus / 1e6 if fus else 0
        print(f"{r['shape']:36} {r['tile']:>5} {fus or 0:9.1f} {cus or 0:9.1f} {ratio} {tbs:9.2f} "
              f"{f.get('accepted')}/{f.get('kernels')}")


if __name__ == "__main__":
    main()
