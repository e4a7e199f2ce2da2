"""PyTorch's side of bench/bench_vs_torch.py: its counterpart of each of our
backends as a function of (q, k, v), timed the way attnprof times ours (GPU
time per call from torch.profiler's kernel records, host time per call with
and without the profiler), its backward through autograd, and the copy
ceiling. A backend that cannot take a row raises Refused with the one-line
reason. DEVICE is "cuda", or "cpu" under the bench's --smoke.
"""
import math
import statistics
import sys
import time
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from bench_tables import first_line

SDPA = {
    "sdpa_math": SDPBackend.MATH,
    "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
    "sdpa_flash": SDPBackend.FLASH_ATTENTION,
    "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
}
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
DEVICE = "cuda"  # "cpu" under --smoke


class Refused(Exception):
    """A PyTorch backend that cannot take a row; the message is the one-line reason."""


def torch_attention(name, row):
    """PyTorch's counterpart of one of our backends, as a function of (q, k, v).

    Bottom-right causal with fewer queries than keys: one query sees every key
    (no mask); more go through torch.nn.attention.bias.causal_lower_right,
    which PyTorch routes to its flash or efficient kernel, or materialises."""
    scale = 1.0 / math.sqrt(row.d)
    gqa = {"enable_gqa": True} if row.hkv != row.h else {}
    if name == "sdpa" or name in SDPA:
        mask, causal = None, row.mask != "none"
        if row.mask == "causal-bottom-right" and row.sq != row.skv:
            causal = False
            if row.sq > 1:
                from torch.nn.attention.bias import causal_lower_right

                mask = causal_lower_right(row.sq, row.skv)

        def call(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, **gqa)

        if name == "sdpa":
            return call
        backend = SDPA[name]

        def run(q, k, v):
            with sdpa_kernel(backend):
                return call(q, k, v)

        return run
    if gqa:
        raise Refused("hand-written naive attention here takes as many K/V heads as query heads")
    offset = row.skv - row.sq if row.mask == "causal-bottom-right" else 0
    mask = None
    if row.mask != "none":
        mask = torch.ones(row.sq, row.skv, dtype=torch.bool, device=DEVICE).triu(1 + offset)

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


def torch_fn(name, row, q, k, v, pass_="forward"):
    fn = torch_attention(name, row)
    if pass_ == "backward":
        return backward_fn(fn, q, k, v)
    return lambda: fn(q, k, v)


def synchronize():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def host_us(fn, iters, back_to_back):
    """Median host time of one call. back_to_back: calls are made one after the
    other while the GPU works (as attnprof's --unprofiled-calls makes ours);
    otherwise each starts from an idle stream (as the profiled steps do)."""
    host = []
    synchronize()
    warmup = max(2, iters // 4) if back_to_back else 0  # untimed, as attnprof does
    for i in range(warmup + iters):
        t0 = time.perf_counter()
        fn()
        if i >= warmup:
            host.append((time.perf_counter() - t0) * 1e6)
        if not back_to_back:
            synchronize()
    synchronize()
    return statistics.median(host)


def sdpa_kind(kernels):
    """Which SDPA backend ran, from the names of the kernels it launched."""
    names = " ".join(kernels).lower()
    for kind, marks in (("cudnn", ("cudnn",)), ("flash", ("flash",)), ("efficient", ("fmha", "efficient", "cutlass")),
                        ("math", ("gemm", "softmax"))):
        if any(m in names for m in marks):
            return kind
    return "?" if kernels else None


def refusal(e, caught):
    """The one-line reason a PyTorch backend refused: its exception, and the
    first reason PyTorch warned of (sdpa_kernel's "No available kernel" says
    only that; the warnings before it say why)."""
    why = [first_line(w.message) for w in caught]
    why = [w for w in why if w and "not used because" not in w and "runtime disabled" not in w]
    return "; ".join([first_line(e)] + why[:1])


def time_torch(make, iters=10, unprofiled_iters=32):
    """make() gives the call to time. GPU time per call from torch.profiler's
    kernel records, host time per call under that profiler, and host time per
    call with no profiler, calls back to back (as attnprof's --unprofiled-calls
    measures ours); the names of the kernels that ran. A backend that refuses
    (or runs out of memory) raises Refused with the reason."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fn = make()
            for _ in range(3):
                fn()
            synchronize()
        except Refused:
            raise
        except Exception as e:  # noqa: BLE001 - a refusal or an OOM is a line in the table, not the end of the run
            raise Refused(refusal(e, caught)) from None
    if DEVICE != "cuda":  # --smoke: wall time is the device time
        t = host_us(fn, iters, back_to_back=False)
        return {"gpu_us": t, "host_profiled_us": None, "host_us": t, "kernels": []}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            host_profiled = host_us(fn, iters, back_to_back=False)
    events = [e for e in prof.key_averages() if e.self_device_time_total > 0]
    gpu_us = sum(e.self_device_time_total for e in events) / iters
    return {"gpu_us": gpu_us, "host_profiled_us": host_profiled, "host_us": host_us(fn, unprofiled_iters, True),
            "kernels": sorted({e.key for e in events})}


def backward_fn(fn, q, k, v):
    """The backward alone: the forward's graph is built once, then each call
    runs autograd's backward through it (retain_graph keeps it for the next)."""
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    with torch.enable_grad():
        out = fn(q, k, v)
    dout = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)


def copy_ceiling(gib=1.0, reps=10):
    """Bytes read plus written per second by a large device-to-device copy, the
    best of several: what a memory-bound kernel can hope for."""
    n = int(gib * 2**30)
    src = torch.ones(n, dtype=torch.uint8, device=DEVICE)
    dst = torch.empty_like(src)
    best = float("inf")
    for i in range(reps + 2):
        if DEVICE == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            seconds = time.perf_counter() - t0
        if i >= 2:  # two untimed first
            best = min(best, seconds)
    del src, dst
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return {"bytes_per_s": 2 * n / best, "copied_bytes": n, "best_s": best, "reps": reps, "device": DEVICE}


def torch_inputs(row):
    dtype = TORCH_DTYPES[row.dtype]
    q = torch.randn(row.b, row.h, row.sq, row.d, device=DEVICE, dtype=dtype)
    k, v = (torch.randn(row.b, row.hkv, row.skv, row.d, device=DEVICE, dtype=dtype) for _ in range(2))
    return q, k, v


def run_torch(row, names, pass_):
    """Every PyTorch variant of the row: its times, or the reason it refused."""
    q, k, v = torch_inputs(row)
    runs = {}
    for name in names:
        try:
            t = time_torch(lambda: torch_fn(name, row, q, k, v, pass_))
            t["kind"] = sdpa_kind(t["kernels"]) if name.startswith("sdpa") else None
        except Refused as e:
            t = {"reason": str(e)}
            print(f"[bench] torch {name} on {row.label()}: {e}", file=sys.stderr)
        runs[name] = t
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    del q, k, v
    return runs

