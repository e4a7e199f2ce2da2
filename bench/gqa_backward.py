"""Issue 52's grouped- and multi-query backward rows: flash against our cudnn
backend, CUPTI kernel time per backward, through `attnprof compare --pass
backward` (each row one process, so both backends run on the same warm GPU),
once with flash's default group split and once per forced split
(ATTNPROF_BWD_GROUP_SPLIT, read once a process: fused_kernels.h's
flash_sm90_bwd_group_split), so that the policy is measured against its
alternatives in the same run. Prints one line a row and split, then the
table; writes the records as JSON.

  python3 bench/gqa_backward.py --attnprof build/gpu/attnprof --out OUTDIR [--splits 1,2,4,8,16] [--rows N]
"""
import argparse
import json
import os
import sys

from compare_records import compare_records

# (label, batch, heads, kv heads, seq, head dim, mask): issue 52's rows and
# the model-shaped ones of issue 50 (Llama-like 16/4, Qwen2-like 28/4).
ROWS = [
    ("mqa d96", 2, 16, 1, 4096, 96, "causal"),
    ("gqa 32/8", 8, 32, 8, 1024, 128, "causal"),
    ("long gqa 16/4", 1, 16, 4, 16384, 128, "causal"),
    ("llama 16/4", 4, 16, 4, 2048, 128, "causal"),
    ("qwen2 28/4", 4, 28, 4, 2048, 128, "causal"),
    ("mqa d128 none", 4, 16, 1, 2048, 128, "none"),
    ("gqa d64 8/1", 8, 8, 1, 1024, 64, "causal"),
    # Rows whose split the L2-reading rule changed without a run behind it (2026-12-07), and an unmasked
    # one it keeps whole (docs/perf/backward.md).
    ("gqa 32/8 4k", 2, 32, 8, 4096, 128, "causal"),
    ("gqa 32/8 8k", 1, 32, 8, 8192, 128, "causal"),
    ("gqa 32/8 none", 8, 32, 8, 1024, 128, "none"),
]


def compare(attnprof, row, split):
    label, b, h, hkv, s, d, mask = row
    args = ["--device", "cuda", "--pass", "backward", "--backends", "flash,cudnn", "--batch", str(b), "--heads",
            str(h), "--kv-heads", str(hkv), "--seq", str(s), "--head-dim", str(d), "--mask", mask, "--warmup", "3",
            "--active", "10", "--check-rows", "32", "--trace-dir", "/tmp/gqa-traces"]
    recs = compare_records(attnprof, args, f"/tmp/gqa_bwd_{b}_{h}_{hkv}_{s}_{d}_{mask}_{split or 'auto'}.json",
                           "ATTNPROF_BWD_GROUP_SPLIT", split)
    if "error" in recs:
        return recs
    out = {}
    for name in ("flash", "cudnn"):
        r = recs.get(name, {})
        out[name] = {"us": r.get("device_time_us"), "tflops": r.get("tflops"), "accepted": r.get("accepted"),
                     "rel_error": r.get("rel_error"), "kernels": r.get("kernels_per_forward")}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attnprof", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--splits", default="1", help="forced splits to time beside the default (comma-separated)")
    ap.add_argument("--rows", type=int, default=0, help="first N rows only")
    args = ap.parse_args()
    splits = [0] + [int(x) for x in args.splits.split(",") if x]
    results = []
    for row in ROWS[: args.rows or None]:
        for split in splits:
            if split and row[2] % (row[3] * split) != 0:
                continue  # not a divisor of the group
            r = compare(args.attnprof, row, split)
            r.update(row=row[0], shape=f"{row[1]}x{row[2]}/{row[3]}x{row[4]}x{row[5]} {row[6]}",
                     split=split or "auto")
            results.append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
    with open(os.path.join(args.out, "gqa_backward.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(f"{'row':16} {'shape':32} {'split':>5} {'flash us':>9} {'cudnn us':>9} {'ratio':>6} {'TFLOP/s':>8} ok")
    for r in results:
        if "error" in r:
            print(f"{r['row']:16} {r['shape']:32} {r['split']:>5} error: {r['error'][:80]}")
            continue
        f, c = r["flash"], r["cudnn"]
        ratio = f["us"] / c["us"] if f["us"] and c["us"] else float("nan")
        print(f"{r['row']:16} {r['shape']:32} {r['split']:>5} {f['us'] or 0:9.1f} {c['us'] or 0:9.1f} {ratio:6.2f} "
              f"{f['tflops'] or 0:8.1f} {f['accepted']}/{f['kernels']}")


if __name__ == "__main__":
    main()
