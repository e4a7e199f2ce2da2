#!/usr/bin/env python3
"""Records the torch.profiler traces analyze's tests read (tests/fixtures/torch/).

Each variant of attention runs at a small shape under torch.profiler with a
wait/warmup/active schedule, record_shapes=True, and is exported gzipped with
export_chrome_trace: the traces people already have, made the way they make
them. On a GPU: naive (out-of-place masked_fill), naive_inplace (masked_fill_),
SDPA's math, efficient, flash and cuDNN backends, and one training step
(flash forward and backward). On the CPU (--device cpu): naive and math.

  python3 scripts/record_torch_fixtures.py --out tests/fixtures/torch [--device cpu]
"""
import argparse
import math
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile, schedule


def naive(q, k, v, mask, inplace):
    attn = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
    if inplace:
        attn.masked_fill_(~mask, float("-inf"))
    else:
        attn = attn.masked_fill(~mask, float("-inf"))
    return torch.softmax(attn, dim=-1) @ v


def sdpa(backend):
    def run(q, k, v, mask):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return run


def train_step(q, k, v, mask):
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.backward(torch.ones_like(out))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    dev = a.device
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    b, h, s, d = (2, 4, 256, 64) if dev == "cuda" else (1, 2, 128, 32)
    variants = {"naive": lambda q, k, v, m: naive(q, k, v, m, False),
                "naive_inplace": lambda q, k, v, m: naive(q, k, v, m, True),
                "math": sdpa(SDPBackend.MATH)}
    if dev == "cuda":
        variants.update({"efficient": sdpa(SDPBackend.EFFICIENT_ATTENTION), "flash": sdpa(SDPBackend.FLASH_ATTENTION),
                         "cudnn": sdpa(SDPBackend.CUDNN_ATTENTION), "train": train_step})
        variants.pop("naive_inplace")  # 7 files at most come back from the GPU machine with the note
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
    mask = torch.ones(s, s, dtype=torch.bool, device=dev).tril()
    for name, fn in variants.items():
        grad = name == "train"
        q, k, v = (torch.randn(b, h, s, d, device=dev, dtype=dtype, requires_grad=grad) for _ in range(3))
        path = os.path.join(a.out, f"{dev}_{name}.pt.trace.json.gz")
        # As the TensorBoard handler does: the trace is exported when the
        # schedule's active steps end.
        with profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=2), record_shapes=True,
                     profile_memory=True,
                     on_trace_ready=lambda p, path=path: p.export_chrome_trace(path)) as prof:
            for _ in range(3):
                if grad:
                    fn(q, k, v, mask)
                else:
                    with torch.no_grad():
                        fn(q, k, v, mask)
                if dev == "cuda":
                    torch.cuda.synchronize()
                prof.step()
        print(f"{path}: {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
