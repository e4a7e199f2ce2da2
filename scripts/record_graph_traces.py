#!/usr/bin/env python3
"""Records torch.profiler traces of CUDA-graph workloads for analyze's tests (tests/fixtures/graphs/).

Run on a GPU (CUDA 12 or later: Kineto writes "graph id" and "graph node id" only there), no network, no
weights (models from a config, random weights), with the profiler on during capture and replays:

  generate_sdpa       transformers' LlamaForCausalLM.generate() on a static cache, its forward under
  generate_attnprof   torch.compile(mode="reduce-overhead") (CUDA graphs through Inductor's cudagraph trees),
                      attn_implementation "sdpa" and "attnprof" (attnprof.integrations.transformers)
  decode_sdpa         a decode loop of a small decoder captured by hand with torch.cuda.graph and replayed,
  decode_plan         its attention SDPA's, or an attnprof.plan's run (no torch op wraps a plan's run)

Each trace is written gzipped as <name>.pt.trace.json.gz under --out, with graph_traces.json beside them
(the sizes, the replays the script made, whether the capture made it into the trace, the versions), which
tests/cpu/graph_fixtures_test.cpp reads. A trace whose capture failed under the profiler is recorded with the
capture outside it (capture_in_trace false) and says so.

  python3 scripts/record_graph_traces.py --out /tmp/graph_traces        (scripts/gpu.sh graph_traces)
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile, schedule

# Small sizes: a trace well under 2 MB gzipped.
LLAMA = dict(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=64, max_position_embeddings=256)
PROMPT, NEW_TOKENS = 16, 12
# The hand-captured decoder: layers, heads, head dim, cache length, batch, replays.
DECODE = dict(layers=4, heads=8, head_dim=128, cache=2048, batch=2, hidden=512, replays=8)


def export(prof, path):
    prof.export_chrome_trace(path)  # gzipped by torch for a .gz path


def record_generate(impl: str, out_dir: str) -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM

    name = impl
    if impl == "attnprof":
        import attnprof.integrations.transformers as apt

        name = apt.register(backend="flash")
    torch.manual_seed(0)
    config = LlamaConfig(**LLAMA, attn_implementation=name)
    model = LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()
    ids = torch.randint(0, LLAMA["vocab_size"], (1, PROMPT), device="cuda")
    kw = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, cache_implementation="static")
    try:
        # generate() compiles its decoding forward itself on a static cache: held to reduce-overhead, full graph.
        from transformers import CompileConfig

        kw["compile_config"] = CompileConfig(fullgraph=True, mode="reduce-overhead")
    except ImportError:  # a transformers without it: the forward compiled by hand
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    # Compiled afresh and profiled from the first call, so that the cudagraph trees' captures are in the trace.
    # (Resetting the trees after a warm-up generate() left the compiled code replaying graphs the reset had
    # freed: "Running CUDAGraph after shutdown", H100, PyTorch 2.11.)
    torch._dynamo.reset()
    path = os.path.join(out_dir, f"generate_{impl}.pt.trace.json.gz")
    with torch.no_grad():
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
            model.generate(ids, **kw)
            torch.cuda.synchronize()
        export(prof, path)
    return {"file": os.path.basename(path), "layers": LLAMA["num_hidden_layers"], "replays": None,
            "capture_in_trace": True, "attention": impl, "config": LLAMA, "prompt": PROMPT,
            "new_tokens": NEW_TOKENS}


class Decoder:
    """A decoder's decode step on static buffers: per layer QKV, the new key and value written into a full
    cache at a position held in a tensor, attention of the one query over the cache, the output product."""

    def __init__(self, impl: str):
        d = DECODE
        self.impl = impl
        g = torch.Generator(device="cuda").manual_seed(0)
        hd = d["heads"] * d["head_dim"]
        self.x = torch.randn(d["batch"], 1, d["hidden"], device="cuda", dtype=torch.bfloat16, generator=g)
        self.pos = torch.zeros(1, dtype=torch.long, device="cuda")
        self.w = [[torch.randn(d["hidden"], n, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
                   for n in (hd, hd, hd)] + [torch.randn(hd, d["hidden"], device="cuda", dtype=torch.bfloat16,
                                                         generator=g) * 0.02] for _ in range(d["layers"])]
        shape = (d["batch"], d["heads"], d["cache"], d["head_dim"])
        self.k = [torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(d["layers"])]
        self.v = [torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(d["layers"])]
        self.q = torch.empty(d["batch"], d["heads"], 1, d["head_dim"], device="cuda", dtype=torch.bfloat16)
        self.o = torch.empty_like(self.q)
        self.plans = None
        if impl == "plan":
            import attnprof

            self.plans = [attnprof.plan(self.q, k, v, backend="flash", mask="none") for k, v in zip(self.k, self.v)]

    def step(self):
        d = DECODE
        x = self.x
        for layer in range(d["layers"]):
            wq, wk, wv, wo = self.w[layer]
            b = x.shape[0]
            self.q.copy_((x @ wq).view(b, 1, d["heads"], d["head_dim"]).transpose(1, 2))
            k_new = (x @ wk).view(b, 1, d["heads"], d["head_dim"]).transpose(1, 2)
            v_new = (x @ wv).view(b, 1, d["heads"], d["head_dim"]).transpose(1, 2)
            self.k[layer].index_copy_(2, self.pos, k_new)
            self.v[layer].index_copy_(2, self.pos, v_new)
            if self.plans is not None:
                self.plans[layer].run(self.q, self.k[layer], self.v[layer], self.o)
            else:
                self.o.copy_(torch.nn.functional.scaled_dot_product_attention(self.q, self.k[layer], self.v[layer]))
            x = x + (self.o.transpose(1, 2).reshape(b, 1, -1) @ wo)
        self.x.copy_(x)
        self.pos.add_(1)


def record_decode(impl: str, out_dir: str) -> dict:
    dec = Decoder(impl)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):  # warm-up off the default stream, as torch.cuda.graph asks
        for _ in range(2):
            dec.step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    replays = DECODE["replays"]
    path = os.path.join(out_dir, f"decode_{impl}.pt.trace.json.gz")
    graph = torch.cuda.CUDAGraph()
    in_trace = True
    # ProfilerStep#0 holds the capture, each later step one replay.
    sched = schedule(wait=0, warmup=0, active=replays + 1, repeat=1)  # one cycle: one export
    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True, schedule=sched,
                   on_trace_ready=lambda p: export(p, path))
    prof.start()
    try:
        with torch.no_grad(), torch.cuda.graph(graph):
            dec.step()
    except RuntimeError as e:  # a CUPTI or driver that refuses capture under the profiler: capture outside it
        print(f"decode_{impl}: capture under the profiler failed ({str(e).splitlines()[0]}): captured outside it")
        prof.stop()
        in_trace = False
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph):
            dec.step()
        prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True, schedule=sched,
                       on_trace_ready=lambda p: export(p, path))
        prof.start()
    torch.cuda.synchronize()
    prof.step()
    for _ in range(replays):
        graph.replay()
        torch.cuda.synchronize()
        prof.step()
    prof.stop()
    return {"file": os.path.basename(path), "layers": DECODE["layers"], "replays": replays,
            "capture_in_trace": in_trace, "attention": "attnprof" if impl == "plan" else "sdpa", "decoder": DECODE}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default=None, help="comma-separated subset: generate_sdpa, generate_attnprof, "
                                                 "decode_sdpa, decode_plan")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("record_graph_traces: needs a CUDA GPU")
    os.makedirs(a.out, exist_ok=True)
    meta = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(),
            "traces": {}}
    try:
        import transformers

        meta["transformers"] = transformers.__version__
    except ImportError:
        transformers = None
    jobs = {"decode_sdpa": lambda: record_decode("sdpa", a.out), "decode_plan": lambda: record_decode("plan", a.out),
            "generate_sdpa": lambda: record_generate("sdpa", a.out),
            "generate_attnprof": lambda: record_generate("attnprof", a.out)}
    for name, job in jobs.items():
        if a.only and name not in a.only.split(","):
            continue
        if name.startswith("generate") and transformers is None:
            print(f"{name}: not recorded: transformers is not installed")
            continue
        try:
            meta["traces"][name] = job()
        except Exception as e:  # one workload this stack cannot run: say so, record the rest
            print(f"{name}: not recorded: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            continue
        path = os.path.join(a.out, meta["traces"][name]["file"])
        print(f"{path}: {os.path.getsize(path)} bytes", flush=True)
        write_meta(meta, a.out)  # after each trace: a run cut short keeps what it recorded
    write_meta(meta, a.out)


def write_meta(meta: dict, out_dir: str):
    tmp = os.path.join(out_dir, "graph_traces.json.tmp")
    with open(tmp, "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    os.replace(tmp, os.path.join(out_dir, "graph_traces.json"))


if __name__ == "__main__":
    main()
