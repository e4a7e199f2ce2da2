#!/usr/bin/env python3
"""Issue 22's targets on one GPU, in one run, through `attnprof compare`:

  1. a padded batch of 8 sequences with lengths spread from 10% to 100% of
     4096 (head dim 128, causal, bf16): the packed (varlen) call on flash
     against the dense padded call on flash (target: at least 1.7x faster),
     and against cudnn's packed (ragged) call (target: at most 1.00x);
  2. soft-capping (cap 30) on flash against no cap (target: at most 1.10x),
     forward and backward, head dims 64 and 128.

Each row is one `attnprof compare` process (warmup 3, 10 profiled calls,
median device time per call from CUPTI); forward and backward (the backward
alone, after a forward_train) are separate rows. A backend that refuses a row
gives its one-line reason. Writes <out>/sequences_bench.{json,md} and prints
the table.

  python3 bench/sequences_bench.py --attnprof build/attnprof --out runs/x
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_tables import run_compare  # noqa: E402

HEADS = 16
LENS = [round(4096 * (0.1 + 0.9 * i / 7)) for i in range(8)]  # 410 .. 4096


def compare(attnprof, args, backends, pass_, tag, out):
    path = os.path.join(out, f"seq_{tag}_{pass_}.json")
    cmd = [attnprof, "compare", "--device", "cuda", "--dtype", "bf16", "--warmup", "3", "--active", "10",
           "--check-rows", "32", "--quiet", "--json", path, "--pass", pass_, "--backends", ",".join(backends),
           "--trace-dir", "/tmp/seq-bench-traces"] + args
    return run_compare(cmd, path, backends)


def us(rec):
    """The median device time per call, or None when the backend did not run (its "reason" says why)."""
    return (rec or {}).get("device_time_us") or None


def fmt(x, digits=1):
    return "-" if x is None else f"{x:.{digits}f}"


def verdict(ratio, ok):
    return "-" if ratio is None else ("met" if ok(ratio) else "MISSED")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attnprof", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rows, lines = [], []
    lens = ",".join(map(str, LENS))
    shape = ["--heads", str(HEADS), "--head-dim", "128", "--mask", "causal"]
    lines.append(f"Packed batch: 8 sequences of {lens} keys (causal, head dim 128, {HEADS} heads, bf16)")
    lines.append("")
    lines.append("| pass | flash packed us | flash padded us | padded / packed (>= 1.7) | cudnn packed us | "
                 "flash / cudnn packed (<= 1.00) | flash packed rel err |")
    lines.append("| --- | --- | --- | --- | --- | --- | --- |")
    for pass_ in ("forward", "backward"):
        packed = compare(a.attnprof, shape + ["--seq-lens", lens], ["flash", "cudnn"], pass_, "packed", a.out)
        dense = compare(a.attnprof, shape + ["--batch", "8", "--seq", "4096"], ["flash"], pass_, "padded", a.out)
        fp, fd, cp = us(packed.get("flash")), us(dense.get("flash")), us(packed.get("cudnn"))
        speedup = fd / fp if fp and fd else None
        vs_cudnn = fp / cp if fp and cp else None
        rows.append({"row": "packed", "pass": pass_, "flash_packed_us": fp, "flash_padded_us": fd, "cudnn_packed_us": cp,
                     "padded_over_packed": speedup, "flash_over_cudnn": vs_cudnn,
                     "reasons": {f"{k}:{b}": r.get("reason") for k, d in (("packed", packed), ("padded", dense))
                                 for b, r in d.items() if us(r) is None}})
        lines.append(f"| {pass_} | {fmt(fp)} | {fmt(fd)} | {fmt(speedup, 2)} "
                     f"({verdict(speedup, lambda r: r >= 1.7)}) | {fmt(cp)} | {fmt(vs_cudnn, 3)} "
                     f"({verdict(vs_cudnn, lambda r: r <= 1.0)}) | {fmt((packed.get('flash') or {}).get('rel_error'), 5)} |")
    lines.append("")
    lines.append("Soft cap 30 on flash (2 x 16 x 4096, bf16)")
    lines.append("")
    lines.append("| row | pass | no cap us | cap us | cap / no cap (<= 1.10) | capped rel err |")
    lines.append("| --- | --- | --- | --- | --- | --- |")
    for d, mask in ((128, "causal"), (128, "none"), (64, "causal")):
        base = ["--batch", "2", "--heads", "16", "--seq", "4096", "--head-dim", str(d), "--mask", mask]
        for pass_ in ("forward", "backward"):
            plain = compare(a.attnprof, base, ["flash"], pass_, f"plain_d{d}_{mask}", a.out).get("flash")
            capped = compare(a.attnprof, base + ["--softcap", "30"], ["flash"], pass_, f"cap_d{d}_{mask}",
                             a.out).get("flash")
            u, c = us(plain), us(capped)
            ratio = c / u if u and c else None
            rows.append({"row": f"softcap d{d} {mask}", "pass": pass_, "plain_us": u, "capped_us": c, "ratio": ratio,
                         "reason": (capped or {}).get("reason") if c is None else None})
            lines.append(f"| d{d} {mask} | {pass_} | {fmt(u)} | {fmt(c)} | {fmt(ratio, 3)} "
                         f"({verdict(ratio, lambda r: r <= 1.10)}) | {fmt((capped or {}).get('rel_error'), 5)} |")
    for r in rows:
        for k, why in (r.get("reasons") or {}).items():
            if why:
                lines.append(f"- {r['row']} {r['pass']} {k} did not run: {why}")
        if r.get("reason"):
            lines.append(f"- {r['row']} {r['pass']} did not run: {r['reason']}")
    with open(os.path.join(a.out, "sequences_bench.json"), "w") as f:
        json.dump(rows, f, indent=1)
    with open(os.path.join(a.out, "sequences_bench.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
