#!/usr/bin/env python3
"""Host time of a repeated attnprof.attention() call, two builds against each other, interleaved.

On a shared machine a build timed after another meets other load; here the builds' processes take turns,
`--rounds` times each, and each figure is the least of its rounds' medians (the round least disturbed). Per
build, backend and shape, the median host time (us) of `--calls` back-to-back calls of:
  attention   attnprof.attention(q, k, v, backend=B, mask="causal", out=o, threads=1) on torch tensors
              (the torch extension's fast path where it is built), a call-cache hit after the first
  dlpack      the same through the DLPack path (_torch._use_fast(False))
  cpp         the same prepared call's forward in a C++ loop (_core._time_forward)

    python3 bench/call_cache_ab.py --before /work/main/build/cpu/python --after build/cpu/python

(CPU only: the host time of small problems, one thread.) With --child it is one build's process.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SHAPES = [(1, 1, 16, 16), (1, 2, 64, 32)]
BACKENDS = ("flash", "naive", "math")


def child(calls):
    import torch

    import attnprof
    from attnprof import _core, _torch

    torch.set_num_threads(1)
    clock = time.perf_counter
    out = {}
    for shape in SHAPES:
        q, k, v = (torch.randn(shape) for _ in range(3))
        o = torch.empty_like(q)
        for backend in BACKENDS:
            def call():
                return attnprof.attention(q, k, v, backend=backend, mask="causal", out=o, threads=1)

            def median(fn):
                for _ in range(calls // 4):
                    fn()
                samples = []
                for _ in range(calls):
                    t0 = clock()
                    fn()
                    samples.append((clock() - t0) * 1e6)
                return statistics.median(samples)

            fast = _torch._fast is not None
            row = {"attention": median(call)}
            _torch._use_fast(False)
            try:
                row["dlpack"] = median(call)
            finally:
                _torch._use_fast(fast)
            row["cpp"] = statistics.median(_core._time_forward(q, k, v, o, backend=backend, mask="causal",
                                                               threads=1, calls=calls))
            out[f"{'x'.join(map(str, shape))} {backend}"] = row
    print(json.dumps(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", help="the first build's python directory (PYTHONPATH)")
    ap.add_argument("--after", help="the second build's python directory")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.calls)
    best = {"before": {}, "after": {}}
    for _ in range(a.rounds):
        for tag, path in (("before", a.before), ("after", a.after)):
            env = dict(os.environ, PYTHONPATH=path, OMP_WAIT_POLICY="PASSIVE")
            got = json.loads(subprocess.run([sys.executable, __file__, "--child", "--calls", str(a.calls)], env=env,
                                            capture_output=True, text=True, check=True).stdout)
            for key, row in got.items():
                mine = best[tag].setdefault(key, dict(row))
                for what, us in row.items():
                    mine[what] = min(mine[what], us)
    print(f"least of {a.rounds} medians of {a.calls} calls, the builds' processes interleaved\n")
    print("| shape, backend | attention() before us | after us | DLPack path before us | after us | "
          "C++ forward before us | after us |")
    print("|---|---|---|---|---|---|---|")
    for key in best["before"]:
        b, f = best["before"][key], best["after"][key]
        print(f"| {key} | {b['attention']:.2f} | {f['attention']:.2f} | {b['dlpack']:.2f} | {f['dlpack']:.2f} | "
              f"{b['cpp']:.2f} | {f['cpp']:.2f} |")


if __name__ == "__main__":
    main()
