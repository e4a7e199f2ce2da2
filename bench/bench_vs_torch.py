#!/usr/bin/env python3
"""attnprof's CUDA backends next to PyTorch's, on DESIGN.md's grid.

One run on the GPU machine: for every grid row, `attnprof compare --json` times
our backends (GPU time = kernel time per forward read from CUPTI records; host
time = CPU time of one forward call, with no profiler attached and under CUPTI),
and torch.profiler times PyTorch's the same way (SDPA math, efficient, flash,
cudnn, and hand-written naive and in-place naive). Prints one table (GPU time,
TFLOP/s, host us per call, ratio ours/PyTorch) and writes it as JSON and Markdown.

With --pass backward, the same for the backward alone: ours through
`attnprof compare --pass backward` (the forward's saved tensors in place), and
PyTorch's autograd through torch.autograd.grad on a graph built once, timed the
same way (backward FLOPs are 2.5x the forward's). Files: bench_backward.*.

  python3 bench/bench_vs_torch.py --attnprof build/gpu/attnprof --out OUTDIR [--pass backward]
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

GRID = [  # (batch, heads, seq, head_dim, causal)
    (8, 16, 1024, 64, True),
    (4, 16, 4096, 64, True),
    (2, 16, 8192, 128, True),
    (2, 16, 8192, 128, False),
    (1, 16, 16384, 128, True),
]
# Our backend -> PyTorch's counterpart.
PAIRS = [
    ("naive", "naive"),
    ("naive_inplace", "naive_inplace"),
    ("math", "sdpa_math"),
    ("efficient", "sdpa_efficient"),
    ("flash", "sdpa_flash"),
    ("cudnn", "sdpa_cudnn"),
]
SDPA = {
    "sdpa_math": SDPBackend.MATH,
    "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
    "sdpa_flash": SDPBackend.FLASH_ATTENTION,
    "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
}


def torch_attention(name, s, head_dim, causal, device):
    """PyTorch's counterpart of one of our backends, as a function of (q, k, v)."""
    scale = 1.0 / math.sqrt(head_dim)
    if name in SDPA:
        backend = SDPA[name]

        def run(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        return run
    mask = torch.ones(s, s, dtype=torch.bool, device=device).triu(1) if causal else None

    def naive(q, k, v):
        attn = (q @ k.transpose(-2, -1)) * scale
        if mask is not None:
            attn = attn.masked_fill(mask, float("-inf"))
        return attn.softmax(dim=-1) @ v

    def naive_inplace(q, k, v):
        attn = (q @ k.transpose(-2, -1)) * scale
        if mask is not None:
            attn.masked_fill_(mask, float("-inf"))
        return attn.softmax(dim=-1) @ v

    return naive if name == "naive" else naive_inplace


def torch_fn(name, q, k, v, causal, pass_="forward"):
    fn = torch_attention(name, q.shape[-2], q.shape[-1], causal, q.device)
    if pass_ == "backward":
        return backward_fn(fn, q, k, v)
    return lambda: fn(q, k, v)


def host_us(fn, iters, back_to_back):
    """Median host time of one call. back_to_back: calls are made one after the
    other while the GPU works (as attnprof's --unprofiled-calls makes ours);
    otherwise each starts from an idle stream (as the profiled steps do)."""
    host = []
    torch.cuda.synchronize()
    warmup = max(2, iters // 4) if back_to_back else 0  # untimed, as attnprof does
    for i in range(warmup + iters):
        t0 = time.perf_counter()
        fn()
        if i >= warmup:
            host.append((time.perf_counter() - t0) * 1e6)
        if not back_to_back:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return statistics.median(host)


def time_torch(fn, iters=10, unprofiled_iters=32):
    """GPU time per call from torch.profiler's kernel records, host time per
    call under that profiler, and host time per call with no profiler, calls
    back to back (as attnprof's --unprofiled-calls measures ours)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        host_profiled = host_us(fn, iters, back_to_back=False)
    gpu_us = sum(e.self_device_time_total for e in prof.key_averages() if e.self_device_time_total > 0) / iters
    return gpu_us, host_profiled, host_us(fn, unprofiled_iters, back_to_back=True)


def backward_fn(fn, q, k, v):
    """The backward alone: the forward's graph is built once, then each call
    runs autograd's backward through it (retain_graph keeps it for the next)."""
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    with torch.enable_grad():
        out = fn(q, k, v)
    dout = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)


def flops(b, h, s, d, causal, pass_="forward"):
    pairs = s * (s + 1) / 2 if causal else s * s
    return 4.0 * b * h * pairs * d * (2.5 if pass_ == "backward" else 1.0)


def ours(attnprof, row, outdir, pass_="forward"):
    b, h, s, d, causal = row
    path = os.path.join("/tmp", f"ours_{pass_}_{b}_{h}_{s}_{d}_{'causal' if causal else 'none'}.json")
    cmd = [attnprof, "compare", "--device", "cuda", "--batch", str(b), "--heads", str(h), "--seq", str(s),
           "--head-dim", str(d), "--dtype", "bf16", "--mask", "causal" if causal else "none", "--warmup", "3",
           "--active", "10", "--check-rows", "256", "--trace-dir", "/tmp/bench-traces", "--json", path,
           "--quiet", "--pass", pass_, "--backends", ",".join(p[0] for p in PAIRS)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode not in (0, 3):
        print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
        return {}
    with open(path) as f:
        return {r["backend"]: r for r in json.load(f)["results"]}


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def host_cell(r):
    """Our median host us per call, with the p10-p90 spread of the calls."""
    if r["ours_host_us"] is None or r["ours_host_p10_us"] is None or r["ours_host_p90_us"] is None:
        return fmt(r["ours_host_us"], ".1f")
    return f'{r["ours_host_us"]:.1f} ({r["ours_host_p10_us"]:.1f}-{r["ours_host_p90_us"]:.1f})'


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attnprof", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=len(GRID), help="first N grid rows only")
    ap.add_argument("--pass", dest="pass_", choices=("forward", "backward"), default="forward")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    stem = "bench" if args.pass_ == "forward" else "bench_backward"
    results = []
    for row in GRID[: args.rows]:
        b, h, s, d, causal = row
        print(f"[bench] {b}x{h}x{s}x{d} {'causal' if causal else 'non-causal'}", file=sys.stderr, flush=True)
        mine = ours(args.attnprof, row, args.out, args.pass_)
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        fl = flops(b, h, s, d, causal, args.pass_)
        for our_name, torch_name in PAIRS:
            try:
                t_gpu, t_host_prof, t_host = time_torch(torch_fn(torch_name, q, k, v, causal, args.pass_))
            except RuntimeError as e:  # a PyTorch backend that cannot take this row
                t_gpu, t_host_prof, t_host = None, None, None
                print(f"[bench] {torch_name}: {str(e).splitlines()[0]}", file=sys.stderr)
            torch.cuda.empty_cache()
            m = mine.get(our_name, {})
            o_gpu = m.get("device_time_us")
            results.append({
                "shape": f"{b}x{h}x{s}x{d}", "causal": causal, "backend": our_name, "torch": torch_name,
                "ours_gpu_us": o_gpu, "torch_gpu_us": t_gpu,
                "ours_host_us": m.get("host_time_unprofiled_us"), "torch_host_us": t_host,
                "ours_host_p10_us": m.get("host_time_unprofiled_p10_us"),
                "ours_host_p90_us": m.get("host_time_unprofiled_p90_us"),
                "ours_host_profiled_us": m.get("host_time_us"), "torch_host_profiled_us": t_host_prof,
                "ours_tflops": fl / o_gpu / 1e6 if o_gpu else None,
                "torch_tflops": fl / t_gpu / 1e6 if t_gpu else None,
                "ratio": o_gpu / t_gpu if o_gpu and t_gpu else None,
                "ours_rel_error": m.get("rel_error"), "ours_accepted": m.get("accepted"),
                "ours_kernels": m.get("kernels_per_forward"),
                "ours_forward_gpu_us": m.get("forward_device_time_us"),
            })
        del q, k, v
        torch.cuda.empty_cache()
        with open(os.path.join(args.out, stem + ".json"), "w") as f:  # partial results survive a time-out
            json.dump({"results": results}, f, indent=1)
    # Host us: no profiler attached (the cost a program pays; ours with the
    # p10-p90 spread of its calls in parentheses); "profiled": the
    # same calls under CUPTI's API tracing (ours) or torch.profiler (PyTorch's).
    lines = ["| shape | mask | backend | ours ms | torch ms | ours/torch | ours TFLOP/s | torch TFLOP/s "
             "| ours host us | torch host us | ours host us, profiled | torch host us, profiled | ours kernels | ours rel err |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
            r["shape"], "causal" if r["causal"] else "none", r["backend"],
            fmt(r["ours_gpu_us"] and r["ours_gpu_us"] / 1e3, ".3f"), fmt(r["torch_gpu_us"] and r["torch_gpu_us"] / 1e3, ".3f"),
            fmt(r["ratio"], ".2f"), fmt(r["ours_tflops"], ".0f"), fmt(r["torch_tflops"], ".0f"),
            host_cell(r), fmt(r["torch_host_us"], ".1f"),
            fmt(r["ours_host_profiled_us"], ".1f"), fmt(r["torch_host_profiled_us"], ".1f"),
            fmt(r["ours_kernels"], ".0f"), fmt(r["ours_rel_error"], ".1e")))
    table = "\n".join(lines)
    meta = {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "gpu": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    with open(os.path.join(args.out, stem + ".json"), "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    with open(os.path.join(args.out, stem + ".md"), "w") as f:
        f.write(f"{meta}\n\n{table}\n")
    print(table)


if __name__ == "__main__":
    main()
