#!/usr/bin/env python3
"""Host time per call of attnprof.attention from Python against the C++ call.

Times, back to back with no profiler attached (as attnprof's
--unprofiled-calls does), the median host time of:
  python: attnprof.attention(q, k, v, backend=B, out=o) on torch CUDA tensors
  torch:  torch.nn.functional.scaled_dot_product_attention (for scale)
and reads the C++ call's median from `attnprof profile --backend B` at the same
shape, so the difference is what the Python layer adds. Also checks that the
output is the one passed in (no copy) and matches PyTorch's.

  PYTHONPATH=build/gpu/python python3 bench/python_overhead.py --attnprof build/gpu/attnprof
"""
import argparse
import re
import statistics
import subprocess
import time

import torch

import attnprof


def median_us(fn, calls=200, warmup=50):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    samples.sort()
    return statistics.median(samples), samples[len(samples) // 10], samples[(9 * len(samples)) // 10]


def cpp_us(exe, backend, b, h, s, d):
    out = subprocess.run([exe, "profile", "--backend", backend, "--device", "cuda", "--batch", str(b), "--heads",
                          str(h), "--seq", str(s), "--head-dim", str(d), "--warmup", "2", "--active", "3",
                          "--unprofiled-calls", "200", "--check-rows", "64", "--trace-dir", "/tmp/pyoverhead",
                          "--quiet"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"\(([0-9.]+) us with no profiler attached, p10-p90 ([0-9.]+)-([0-9.]+)\)", out)
    return float(m.group(1)), float(m.group(2)), float(m.group(3))


def breakdown(q, k, v, o, backend):
    """Where the Python call's host time goes, piece by piece (medians, us)."""
    from attnprof import _core, _torch

    dl = torch.utils.dlpack.to_dlpack
    rows = [
        ("attnprof.attention(out=o), whole call", lambda: attnprof.attention(q, k, v, backend=backend, mask="causal", out=o)),
        ("4 x torch.utils.dlpack.to_dlpack", lambda: (dl(q), dl(k), dl(v), dl(o))),
        ("_stream_of(q)", lambda: _torch._stream_of(q)),
        ("torch.compiler.is_compiling()", lambda: torch.compiler.is_compiling()),
        ("_core.attention on fresh capsules (capsules included)",
         lambda: _core.attention(dl(q), dl(k), dl(v), dl(o), backend, "causal", None, None,
                                 _torch._stream_of(q), 0, False)),
        ("q.data_ptr(), q.shape, q.stride() for 4 tensors (what a DLPack-free call would read)",
         lambda: [(x.data_ptr(), x.shape, x.stride()) for x in (q, k, v, o)]),
    ]
    print("\n| piece | median us |\n|---|---|")
    for name, fn in rows:
        if fn is not None:
            print(f"| {name} | {median_us(fn)[0]:.2f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attnprof", required=True)
    a = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print("| shape | backend | C++ call us (p10-p90) | Python call us (p10-p90) | added us | torch SDPA us | no copy | max diff vs torch |")
    print("|---|---|---|---|---|---|---|---|")
    for (b, h, s, d) in [(8, 16, 1024, 64), (2, 16, 8192, 128)]:
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        o = torch.empty_like(q)
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        for backend in ("flash", "cudnn", "efficient"):
            got = attnprof.attention(q, k, v, backend=backend, mask="causal", out=o)
            no_copy = got.data_ptr() == o.data_ptr()
            diff = (got.float() - ref.float()).abs().max().item()
            py = median_us(lambda: attnprof.attention(q, k, v, backend=backend, mask="causal", out=o))
            cpp = cpp_us(a.attnprof, backend, b, h, s, d)
            sdpa = median_us(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
            print(f"| {b}x{h}x{s}x{d} | {backend} | {cpp[0]:.1f} ({cpp[1]:.1f}-{cpp[2]:.1f}) | "
                  f"{py[0]:.1f} ({py[1]:.1f}-{py[2]:.1f}) | {py[0] - cpp[0]:+.1f} | {sdpa[0]:.1f} | {no_copy} | {diff:.2e} |",
                  flush=True)
            if (b, backend) == (8, "flash"):
                breakdown(q, k, v, o, backend)


if __name__ == "__main__":
    main()
