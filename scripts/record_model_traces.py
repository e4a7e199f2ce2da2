#!/usr/bin/env python3
"""Records torch.profiler traces of a real model for analyze's tests (tests/fixtures/models/).

A transformers LlamaForCausalLM built from a LlamaConfig with random weights
(nothing downloaded) runs one forward (no grad) and one training step (loss,
backward, optimizer step) under torch.profiler with record_shapes=True and
profile_memory=True, once per attention implementation:

  sdpa          transformers' SDPA path, SDPA choosing its backend (the CPU's flash, a GPU's pick)
  sdpa_math     the same under sdpa_kernel(SDPBackend.MATH): SDPA's math decomposition
  sdpa_flash, sdpa_efficient, sdpa_cudnn   (GPU only) SDPA held to one backend
  eager         attn_implementation="eager": transformers' own matmul/softmax decomposition
  attnprof      attnprof.attention (backend flash), registered through transformers' AttentionInterface

Each trace is exported gzipped as <device>_<impl>_<forward|train>.pt.trace.json.gz with
a schedule of one warm-up step and one recorded step; model_traces.json beside them
holds the config, batch and sequence the tests count FLOPs from.

  python3 scripts/record_model_traces.py --out tests/fixtures/models --device cpu
  python3 scripts/record_model_traces.py --out traces/models --device cuda --size llama   (scripts/gpu.sh)
"""
from __future__ import annotations

import argparse
import json
import os

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile, schedule

# (config fields, batch, seq) per size: "tiny" keeps a CPU trace well under 1 MB gzipped;
# "llama" is Llama-shaped (GQA 16/8 heads of 128, 4 layers) for a GPU.
SIZES = {
    "tiny": (dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=64), 1, 32),
    "llama": (dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=4,
                   num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096), 2, 2048),
}


def attnprof_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention signature over attnprof.attention: q [B, H, S, D], k and v [B, Hkv, S, D]."""
    import attnprof

    if attention_mask is not None:
        raise ValueError("the attnprof fixture runs causal attention without a padding mask")
    out = attnprof.attention(query, key, value, backend="flash", mask="causal", scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def model_for(impl: str, size: str, device: str, dtype):
    from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM

    fields, _, _ = SIZES[size]
    name = {"eager": "eager", "attnprof": "attnprof"}.get(impl, "sdpa")
    if name == "attnprof":
        AttentionInterface.register("attnprof", attnprof_attention)
    config = LlamaConfig(**fields, attn_implementation=name)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(device=device, dtype=dtype)


def sdpa_context(impl: str):
    backend = {"sdpa_math": SDPBackend.MATH, "sdpa_flash": SDPBackend.FLASH_ATTENTION,
               "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}.get(impl)
    return sdpa_kernel(backend) if backend is not None else torch.autograd.profiler.record_function("model")


def record(impl: str, mode: str, size: str, device: str, out_dir: str) -> str:
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = model_for(impl, size, device, dtype)
    _, batch, seq = SIZES[size]
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), device=device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3) if mode == "train" else None
    model.train(mode == "train")

    def step():
        with sdpa_context(impl):
            if mode == "train":
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            else:
                with torch.no_grad():
                    model(input_ids=ids)
        if device == "cuda":
            torch.cuda.synchronize()

    path = os.path.join(out_dir, f"{device}_{impl}_{mode}.pt.trace.json.gz")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=1), record_shapes=True,
                 profile_memory=True, on_trace_ready=lambda p: p.export_chrome_trace(path)) as prof:
        for _ in range(2):
            step()
            prof.step()
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--size", default=None, choices=sorted(SIZES), help="default: tiny on the CPU, llama on a GPU")
    ap.add_argument("--impls", default=None, help="comma-separated subset of the implementations")
    a = ap.parse_args()
    size = a.size or ("tiny" if a.device == "cpu" else "llama")
    impls = ["sdpa", "sdpa_math", "eager", "attnprof"]
    if a.device == "cuda":
        impls[1:1] = ["sdpa_flash", "sdpa_efficient", "sdpa_cudnn"]
    if a.impls:
        impls = [i for i in a.impls.split(",") if i]
    os.makedirs(a.out, exist_ok=True)
    fields, batch, seq = SIZES[size]
    meta = {"size": size, "device": a.device, "batch": batch, "seq": seq, "config": fields,
            "dtype": "bf16" if a.device == "cuda" else "fp32", "torch": torch.__version__, "traces": {}}
    try:
        import transformers

        meta["transformers"] = transformers.__version__
    except ImportError:
        raise SystemExit("record_model_traces: transformers is not installed (scripts/setup.sh installs it)")
    for impl in impls:
        for mode in ("forward", "train"):
            try:
                path = record(impl, mode, size, a.device, a.out)
            except Exception as e:  # one backend this device cannot run (cuDNN's): say so, record the rest
                print(f"{impl} {mode}: not recorded: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                continue
            meta["traces"][f"{impl}_{mode}"] = os.path.basename(path)
            print(f"{path}: {os.path.getsize(path)} bytes")
    with open(os.path.join(a.out, "model_traces.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
