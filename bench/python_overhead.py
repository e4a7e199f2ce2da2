#!/usr/bin/env python3
"""Host time per call of attnprof.attention from Python against the C++ call, piece by piece.

Times, back to back with no profiler attached (as attnprof's --unprofiled-calls
does), the median host time of:
  python: attnprof.attention(q, k, v, backend=B, mask="causal", out=o) on torch tensors
  C++:    the same prepared call's backend forward in a C++ loop (_core._time_forward, in
          this process, on these very tensors); on CUDA also `attnprof profile --backend B
          --unprofiled-calls` when --attnprof gives the command
  torch:  torch.nn.functional.scaled_dot_product_attention (for scale)
  plan:   plan.run(q, k, v, o) of attnprof.plan(q, k, v, backend=B, mask="causal") (made once), and
          the C++ Plan::run of the same plan in a C++ loop (plan._plan._time_runs)
so the difference is what the Python layer adds, through attnprof._torch_call (the torch
extension's fast path, where it is built) and through the DLPack path (_torch._use_fast(False)).
Checks that the output is the one passed in (no copy) and matches PyTorch's. Then, for each
backend at the first shape, where the DLPack path's added time goes (the pieces' medians, each
timed alone):
  the DLPack exports, the stream lookup, torch.compiler.is_compiling(), nanobind's
  argument conversion, the call's preparation (views, problem, plan; a cache hit after
  the first call), the backend call and its return, and the Python front end (the rest),
  each with the call cache off (every call prepared afresh, as before it) and on.

  CPU (the host-side overhead on the smallest shapes, one thread):
    PYTHONPATH=build/cpu/python python3 bench/python_overhead.py --device cpu
  CUDA (the H200; scripts/gpu.sh's python phase runs it):
    PYTHONPATH=build/gpu/python python3 bench/python_overhead.py --device cuda --attnprof build/gpu/attnprof
"""
import argparse
import platform
import re
import statistics
import subprocess
import time

import torch

import attnprof
from attnprof import _core, _torch


def spread(us):
    us = sorted(us)
    return statistics.median(us), us[len(us) // 10], us[(9 * len(us)) // 10]


def median_us(fn, device, calls, rounds):
    """The least of `rounds` medians of `calls` back-to-back calls (us; and that round's p10, p90): the
    round least disturbed by the machine's other work. On CUDA, calls stay well under the launch
    queue's depth, so that a call's time is its host time, not a wait for the device."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    best = None
    clock = time.perf_counter
    for _ in range(rounds):
        for _ in range(max(calls // 4, 10)):
            fn()
        sync()
        samples = []
        for _ in range(calls):
            t0 = clock()
            fn()
            samples.append((clock() - t0) * 1e6)
        sync()
        got = spread(samples)
        if best is None or got[0] < best[0]:
            best = got
    return best


def cpp_us(q, k, v, o, backend, threads, calls, rounds):
    """The C++ call, timed as median_us times the Python call: the least median of `rounds`."""
    return min((spread(_core._time_forward(q, k, v, o, backend=backend, mask="causal", stream=_torch._stream_of(q),
                                           threads=threads, calls=calls)) for _ in range(rounds)),
               key=lambda r: r[0])


def cli_us(exe, backend, b, h, s, d):
    """The C++ call as `attnprof profile` times it (its own tensors, CUDA only)."""
    out = subprocess.run([exe, "profile", "--backend", backend, "--device", "cuda", "--batch", str(b), "--heads",
                          str(h), "--seq", str(s), "--head-dim", str(d), "--warmup", "2", "--active", "3",
                          "--unprofiled-calls", "200", "--check-rows", "64", "--trace-dir", "/tmp/pyoverhead",
                          "--quiet"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"\(([0-9.]+) us with no profiler attached, p10-p90 ([0-9.]+)-([0-9.]+)\)", out)
    return float(m.group(1)), float(m.group(2)), float(m.group(3))


def breakdown(q, k, v, o, backend, threads, device, calls, rounds):
    """Where the Python call's host time goes, piece by piece (medians, us), with the call cache off (every
    call prepared afresh, as before it) and on."""
    dl = torch.utils.dlpack.to_dlpack
    stream = _torch._stream_of(q)

    def until(stage):
        return lambda: _core._attention_until(stage, dl(q), dl(k), dl(v), dl(o), backend=backend, mask="causal",
                                              stream=stream, threads=threads)

    def t(fn):
        return median_us(fn, device, calls, rounds)[0]

    def pieces():
        whole = t(lambda: attnprof.attention(q, k, v, backend=backend, mask="causal", out=o, threads=threads))
        cpp = cpp_us(q, k, v, o, backend, threads, calls, rounds)[0]
        exports = t(lambda: (dl(q), dl(k), dl(v), dl(o)))
        stream_us = t(lambda: _torch._stream_of(q))
        stage = [t(until(i)) for i in range(3)]
        prepare = min(spread(_core._time_prepare(q, k, v, o, backend=backend, mask="causal", stream=stream,
                                                 threads=threads, calls=calls))[0]
                      for _ in range(rounds))
        return [
            whole, cpp, whole - cpp, exports, stream_us, t(torch.compiler.is_compiling), stage[0] - exports,
            stage[1] - stage[0], prepare, stage[2] - stage[1], whole - stage[2] - stream_us, t(lambda: None),
        ]

    names = [
        "attnprof.attention(q, k, v, backend=B, mask='causal', out=o), whole call",
        "the C++ call (_core._time_forward: the backend's forward alone)",
        "**added by the Python call**",
        "4 x torch.utils.dlpack.to_dlpack",
        "_stream_of(q) (the current stream)",
        "torch.compiler.is_compiling()",
        "nanobind's argument conversion (stage 0 on fresh capsules, less the exports)",
        "the call's preparation: views, problem, plan (stage 1 - stage 0)",
        "the same preparation timed in C++ (_core._time_prepare)",
        "the backend's call and the return (stage 2 - stage 1)",
        "the Python front end (whole - stage 2 on fresh capsules - stream lookup)",
        "the timer's own floor (an empty lambda; in every row above but the C++ ones)",
    ]
    fast = _torch._fast is not None
    _torch._use_fast(False)
    _core._use_cache(False)
    try:
        off = pieces()
    finally:
        _core._use_cache(True)
    try:
        on = pieces()
    finally:
        _torch._use_fast(fast)
    print(f"\nWhere the DLPack path's time goes: {backend}, {'x'.join(map(str, q.shape))} "
          f"{str(q.dtype).replace('torch.', '')} on {device}\n\n"
          "| piece | cache off: every call prepared, us | cache on, us |\n|---|---|---|")
    for name, a, b in zip(names, off, on):
        print(f"| {name} | {a:.2f} | {b:.2f} |", flush=True)
    if fast:
        whole = t(lambda: attnprof.attention(q, k, v, backend=backend, mask="causal", out=o, threads=threads))
        print(f"| the whole call through {_torch.fast_path} (cache on) | | {whole:.2f} |")
        print(f"| **added by it** (against the C++ call above) | | **{whole - on[1]:.2f}** |", flush=True)


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.machine()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--attnprof", help="the attnprof command (CUDA: also the CLI's own timing of the C++ call)")
    ap.add_argument("--calls", type=int, help="timed calls per median (CPU 2000, CUDA 200: under the launch queue)")
    ap.add_argument("--rounds", type=int, default=5, help="medians taken, the least reported")
    a = ap.parse_args()
    a.calls = a.calls or (200 if a.device == "cuda" else 2000)
    if a.device == "cuda":
        where = torch.cuda.get_device_name()
        shapes = [(8, 16, 1024, 64), (2, 16, 8192, 128)]
        backends = ("flash", "cudnn", "efficient")
        dtype, threads = torch.bfloat16, 0
    else:
        where = f"{cpu_model()}, one thread"
        shapes = [(1, 1, 16, 16), (1, 2, 64, 32)]
        backends = ("flash", "naive", "math")
        dtype, threads = torch.float32, 1
        torch.set_num_threads(1)
    print(f"torch {torch.__version__}, Python {platform.python_version()}, {where}; each time the least of "
          f"{a.rounds} medians of {a.calls} calls; torch tensors take {_torch.fast_path}")
    cli = a.device == "cuda" and a.attnprof
    fast = _torch._fast is not None
    print("| shape | backend | C++ call us (p10-p90) | Python call us (p10-p90) | added us | DLPack path us | "
          "added us |" + (" CLI's C++ call us |" if cli else "") + " plan.run us (p10-p90) | added us | "
          "C++ Plan::run us | torch SDPA us | no copy | max diff vs torch |")
    print("|---|---|---|---|---|---|---|" + ("---|" if cli else "") + "---|---|---|---|---|---|")
    first = []
    for (b, h, s, d) in shapes:
        q, k, v = (torch.randn(b, h, s, d, device=a.device, dtype=dtype) for _ in range(3))
        o = torch.empty_like(q)
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        for backend in backends:
            got = attnprof.attention(q, k, v, backend=backend, mask="causal", out=o, threads=threads)
            no_copy = got.data_ptr() == o.data_ptr()
            diff = (got.float() - ref.float()).abs().max().item()
            def call():
                return attnprof.attention(q, k, v, backend=backend, mask="causal", out=o, threads=threads)

            py = median_us(call, a.device, a.calls, a.rounds)
            _torch._use_fast(False)
            try:
                dl = median_us(call, a.device, a.calls, a.rounds)
            finally:
                _torch._use_fast(fast)
            cpp = cpp_us(q, k, v, o, backend, threads, a.calls, a.rounds)
            # The same call planned once: the run checks the arrays against the plan and launches.
            plan = attnprof.plan(q, k, v, backend=backend, mask="causal", threads=threads)
            planned = plan.run(q, k, v, o)
            assert planned.data_ptr() == o.data_ptr() and torch.equal(planned, got), backend
            run = median_us(lambda: plan.run(q, k, v, o), a.device, a.calls, a.rounds)
            cpp_run = min((spread(plan._plan._time_runs(q, k, v, o, _torch._stream_of(q), a.calls))
                           for _ in range(a.rounds)), key=lambda r: r[0])
            sdpa = median_us(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
                             a.device, a.calls, a.rounds)
            row = (f"| {b}x{h}x{s}x{d} | {backend} | {cpp[0]:.1f} ({cpp[1]:.1f}-{cpp[2]:.1f}) | "
                   f"{py[0]:.1f} ({py[1]:.1f}-{py[2]:.1f}) | {py[0] - cpp[0]:+.1f} | {dl[0]:.1f} | "
                   f"{dl[0] - cpp[0]:+.1f} |")
            if cli:
                row += f" {cli_us(a.attnprof, backend, b, h, s, d)[0]:.1f} |"
            row += f" {run[0]:.1f} ({run[1]:.1f}-{run[2]:.1f}) | {run[0] - cpp_run[0]:+.1f} | {cpp_run[0]:.2f} |"
            print(row + f" {sdpa[0]:.1f} | {no_copy} | {diff:.2e} |", flush=True)
        if not first:
            first = [q, k, v, o]
    for backend in backends:
        breakdown(*first, backend, threads, a.device, a.calls, a.rounds)


if __name__ == "__main__":
    main()
