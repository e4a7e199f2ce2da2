#!/usr/bin/env python3
"""PyTorch's flash, efficient and cuDNN SDPA timed the way scripts/fused_dev_main.cu
times ours: bf16 [B,H,S,D] random inputs, several input sets rotated past the
L2, 3 warmup calls per set, then the median of 30 cudaEvent pairs around
single calls. Run by `scripts/fused_dev.sh torch` on the GPU machine."""
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [(8, 16, 1024, 64, True), (4, 16, 4096, 64, True), (2, 16, 8192, 128, True),
          (2, 16, 8192, 128, False), (1, 16, 16384, 128, True), (4, 16, 4096, 96, True), (2, 16, 4096, 192, True),
          (2, 16, 4096, 256, True), (2, 16, 4096, 256, False)]


def median_ms(fn, sets, reps=30):
    for i in range(3 * len(sets)):
        fn(*sets[i % len(sets)])
    torch.cuda.synchronize()
    times = []
    for r in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(*sets[r % len(sets)])
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main():
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for b, h, s, d, causal in SHAPES:
        n = b * h * s * d
        nsets = 4 if n * 2 * 4 < (200 << 20) else 2
        sets = [[torch.empty(b, h, s, d, device="cuda", dtype=torch.bfloat16).uniform_(-2, 2) for _ in range(3)]
                for _ in range(nsets)]
        pairs = s * (s + 1) / 2 if causal else s * s
        flops = 4.0 * b * h * pairs * d
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                              ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            def fn(q, k, v):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            try:
                ms = median_ms(fn, sets)
            except RuntimeError as e:  # a backend that does not take the shape
                print(f"{b}x{h}x{s}x{d} torch {name}: {str(e).splitlines()[0]}", flush=True)
                continue
            print(f"{b}x{h}x{s}x{d} {'causal' if causal else 'none':6} torch {name:9} {ms:8.3f} ms "
                  f"{flops / ms * 1e-9:7.1f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
