#!/usr/bin/env python3
"""Training steps of a Llama-shaped decoder with attention from attnprof against PyTorch's SDPA.

Two copies of one decoder stack (RMSNorm, rotary embeddings, grouped-query
attention, SwiGLU MLP; the same weights: the second loads the first's state
dict) train on the same batches, one with attention from attnprof.attention
(--backend, flash by default; autograd through attnprof's own backward), the
other with torch.nn.functional.scaled_dot_product_attention and whatever
backend PyTorch picks. The model is transformers' LlamaForCausalLM built from a
LlamaConfig with random weights, attnprof registered in transformers' attention
registry (attn_implementation="attnprof"), where transformers is importable;
else (or with --model own) a small model of our own in this file with the same
structure. The SDPA side of the transformers model is transformers' own "sdpa".

Reported per side:
  step time     median (p10, p90) of --steps training steps (forward, backward,
                AdamW step, zero_grad) after --warmup ones, CUDA-synchronised
                wall time; the two sides alternate step by step
  ratio         attnprof's median step time over SDPA's
  attention     share of one more step, profiled with torch.profiler: on CUDA
                the GPU time (kernels, memcpy, memset) launched from inside the
                attention ops (attnprof::attention and ::attention_backward;
                aten::scaled_dot_product_attention and aten::_scaled_dot_product_*,
                backward included), matched through the Chrome trace's External
                id, over all the GPU time of the step; on the CPU the time in the
                outermost attention ops over the step's span
And across sides, before any optimizer step: the relative difference of the
first batch's losses, and over all parameters' gradients flattened into one
vector, their cosine similarity, max |g_attnprof - g_sdpa| / max |g_sdpa| and
the relative L2 error (with the parameter of the lowest cosine).

The batch has no padding: the causal mask only. An attention_mask that is not
None and not plain causal is refused (padded batches are another issue's work).

  PYTHONPATH=build/gpu/python python3 bench/train_step.py --out OUTDIR
  PYTHONPATH=build/cpu/python python3 bench/train_step.py --device cpu   # tiny config, seconds

Prints a table on stdout (progress on stderr) and writes train_step.json and
train_step.md under --out.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import inspect
import json
import math
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_model import DecoderLM  # noqa: E402  (our own Llama-shaped model, for --model own)
from train_attention import Refused, attention_op, make_attnprof_attention, sdpa_attention  # noqa: E402

# The GPU run's shape (a Llama-like 4-layer slice), and a tiny one for the CPU.
GPU_DEFAULTS = dict(layers=4, hidden=2048, heads=16, kv_heads=4, head_dim=128, intermediate=5632, vocab=32000,
                    seq=2048, batch=4, dtype="bf16", steps=10, warmup=3)
CPU_DEFAULTS = dict(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=256, seq=64,
                    batch=2, dtype="fp32", steps=3, warmup=1)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}



def progress(msg: str) -> None:
    print(f"[train_step {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- The two sides.

class Side:
    def __init__(self, name: str, attention: str, model: torch.nn.Module, loss_fn, counter=None):
        self.name, self.attention, self.model, self.loss_fn, self.counter = name, attention, model, loss_fn, counter
        self.times: list[float] = []
        self.losses: list[torch.Tensor] = []
        self.opt = None
        self.share: dict = {}
        self.last_ms = float("nan")


def _transformers():
    try:
        import transformers
    except ImportError:
        return None
    return transformers


def build_transformers(a, dtype, device, attnprof_fn):
    """(attnprof model, SDPA model, notes): LlamaForCausalLM twice, the second with the first's weights."""
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    notes = {"transformers": transformers.__version__}
    interface = getattr(transformers, "AttentionInterface", None)
    if interface is None:
        raise Refused(f"transformers {transformers.__version__} has no AttentionInterface (attention registry): "
                      "use --model own, or transformers >= 4.48")
    interface.register("attnprof", attnprof_fn)
    # The mask transformers builds for an implementation it does not know is
    # None whatever the batch: give attnprof the mask SDPA gets (None for an
    # unpadded causal batch, a 4-D mask for a padded one, which is refused).
    try:
        from transformers import masking_utils

        masks = masking_utils.ALL_MASK_ATTENTION_FUNCTIONS
        masks.register("attnprof", masks["sdpa"])
        notes["mask_function"] = "sdpa's (registered in AttentionMaskInterface)"
    except (ImportError, AttributeError, KeyError) as e:
        notes["mask_function"] = f"none registered ({type(e).__name__}: {e}): attnprof receives the mask as given"
    _check_sdpa_contract(notes)
    cfg = dict(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate, num_hidden_layers=a.layers,
               num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, head_dim=a.head_dim,
               max_position_embeddings=max(a.seq, 2048), attention_dropout=0.0, tie_word_embeddings=False,
               use_cache=False)
    models = []
    for impl in ("attnprof", "sdpa"):
        torch.manual_seed(a.seed)
        with torch.device(device):
            try:
                m = LlamaForCausalLM._from_config(LlamaConfig(**cfg), attn_implementation=impl)
            except (AttributeError, TypeError):  # no _from_config, or one without attn_implementation
                m = LlamaForCausalLM(LlamaConfig(**cfg, attn_implementation=impl))
        m = m.to(device=device, dtype=dtype)
        got = m.config._attn_implementation
        if got != impl:
            raise Refused(f"transformers built the model with attn_implementation={got!r}, not {impl!r}")
        models.append(m)
    models[1].load_state_dict(models[0].state_dict())
    return models[0], models[1], notes


def _check_sdpa_contract(notes) -> None:
    """The installed transformers' SDPA function has the signature our function follows."""
    try:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
    except ImportError as e:
        notes["sdpa_signature"] = f"not found ({e})"
        return
    params = list(inspect.signature(sdpa_attention_forward).parameters)
    notes["sdpa_signature"] = f"sdpa_attention_forward({', '.join(params)})"
    want = ["module", "query", "key", "value", "attention_mask"]
    if params[:5] != want or "scaling" not in params or "dropout" not in params:
        raise Refused(f"transformers' {notes['sdpa_signature']} is not the (module, query, key, value, "
                      "attention_mask, dropout=, scaling=, ...) this benchmark's attention function follows")


def check_against_transformers_sdpa(model, attnprof_fn, dtype, device, notes) -> None:
    """Our function and transformers' sdpa_attention_forward on one layer's module: same shape, close values."""
    try:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
    except ImportError:
        return
    module = model.model.layers[0].self_attn
    g = torch.Generator(device="cpu").manual_seed(1)
    b, s, h, hkv, d = 2, 64, model.config.num_attention_heads, model.config.num_key_value_heads, module.head_dim
    q, k, v = (torch.randn(shape, generator=g).to(device=device, dtype=dtype)
               for shape in ((b, h, s, d), (b, hkv, s, d), (b, hkv, s, d)))
    with torch.no_grad():
        want, _ = sdpa_attention_forward(module, q, k, v, None, dropout=0.0, scaling=module.scaling)
        got, _ = attnprof_fn(module, q, k, v, None, dropout=0.0, scaling=module.scaling)
    attnprof_fn.calls = 0
    if got.shape != want.shape:
        raise Refused(f"transformers' sdpa_attention_forward returns {tuple(want.shape)}, ours {tuple(got.shape)}")
    diff = (got.float() - want.float()).abs().max().item()
    notes["contract_max_abs_diff"] = diff
    if diff > (1e-4 if dtype == torch.float32 else 5e-2):
        raise Refused(f"attnprof's attention differs from transformers' sdpa_attention_forward by {diff:.3g}")


def build_sides(a, dtype, device):
    attnprof_fn = make_attnprof_attention(a.backend)
    use_tf = a.model == "transformers" or (a.model == "auto" and _transformers() is not None)
    if a.model == "transformers" and _transformers() is None:
        raise Refused("--model transformers but transformers is not importable (pip install transformers), "
                      "or use --model own")
    if use_tf:
        m_ours, m_sdpa, notes = build_transformers(a, dtype, device, attnprof_fn)
        check_against_transformers_sdpa(m_ours, attnprof_fn, dtype, device, notes)
        notes["model"] = f"transformers LlamaForCausalLM (transformers {notes['transformers']})"

        def loss_fn(m, ids):
            return m(input_ids=ids, labels=ids, use_cache=False).loss
    else:
        torch.manual_seed(a.seed)
        m_ours = DecoderLM(a, attnprof_fn).to(device=device, dtype=dtype)
        m_sdpa = copy.deepcopy(m_ours)
        for layer in m_sdpa.layers:
            layer.self_attn.attn_fn = sdpa_attention
        m_sdpa.load_state_dict(m_ours.state_dict())  # the deep copy has them already; said for the reader
        notes = {"model": "own Llama-shaped DecoderLM (bench/llama_model.py)"}

        def loss_fn(m, ids):
            return m(ids)
    for m in (m_ours, m_sdpa):
        m.train()
    return (Side("attnprof", f"attnprof.attention backend={a.backend}", m_ours, loss_fn, attnprof_fn),
            Side("sdpa", "torch SDPA (backend PyTorch picks)", m_sdpa, loss_fn)), notes


# ---- Measurements.

def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_step(side: Side, ids) -> torch.Tensor:
    loss = side.loss_fn(side.model, ids)
    loss.backward()
    side.opt.step()
    side.opt.zero_grad(set_to_none=True)
    return loss.detach()


def agreement(sides, ids) -> dict:
    """Loss and gradients of one forward and backward on the same weights and batch, before any optimizer step."""
    losses, grads = [], []
    for side in sides:
        side.model.zero_grad(set_to_none=True)
        loss = side.loss_fn(side.model, ids)
        loss.backward()
        losses.append(loss.item())
        grads.append({n: p.grad for n, p in side.model.named_parameters() if p.grad is not None})
    ours, ref = grads
    missing = sorted(set(ref) ^ set(ours))
    if missing:
        raise Refused(f"the two models' gradients differ in their parameters: {missing[:4]}")
    dot = na = nb = diff2 = 0.0
    max_diff = max_ref = 0.0
    worst = (2.0, "")
    for name in ref:
        a, b = ours[name].double(), ref[name].double()
        d_ab, d_aa, d_bb = (a * b).sum().item(), (a * a).sum().item(), (b * b).sum().item()
        dot, na, nb = dot + d_ab, na + d_aa, nb + d_bb
        diff2 += ((a - b) ** 2).sum().item()
        max_diff, max_ref = max(max_diff, (a - b).abs().max().item()), max(max_ref, b.abs().max().item())
        cos = d_ab / math.sqrt(d_aa * d_bb) if d_aa > 0 and d_bb > 0 else float(d_aa == d_bb)
        worst = min(worst, (cos, name))
    for side in sides:
        side.model.zero_grad(set_to_none=True)
    return {
        "loss_attnprof": losses[0], "loss_sdpa": losses[1],
        "loss_rel_diff": abs(losses[0] - losses[1]) / max(abs(losses[1]), 1e-30),
        "grad_cosine": dot / math.sqrt(na * nb) if na > 0 and nb > 0 else float("nan"),
        "grad_max_rel_err": max_diff / max_ref if max_ref > 0 else float("nan"),
        "grad_rel_l2": math.sqrt(diff2 / nb) if nb > 0 else float("nan"),
        "grad_elements": sum(g.numel() for g in ref.values()),
        "worst_param": {"name": worst[1], "cosine": worst[0]},
    }


def _attention_share(trace_path: str, device) -> dict:
    """Attention's share of a profiled step, read from its Chrome trace (see the module's docstring)."""
    with open(trace_path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    ext = lambda e: (e.get("args") or {}).get("External id")
    cpu_ops = [e for e in events if e.get("cat") in ("cpu_op", "user_annotation")]
    attn = [e for e in cpu_ops if e.get("cat") == "cpu_op" and attention_op(e["name"])]

    def inside(e, outer):
        return (e["pid"], e["tid"]) == (outer["pid"], outer["tid"]) and \
            outer["ts"] <= e["ts"] and e["ts"] + e["dur"] <= outer["ts"] + outer["dur"]

    outermost = [e for e in attn if not any(o is not e and inside(e, o) for o in attn)]
    names = sorted({e["name"] for e in attn})
    out = {"attention_ops": names, "attention_op_calls": len(outermost)}
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if device.type == "cuda":
        attn_ids = {ext(e) for e in cpu_ops if ext(e) is not None and any(inside(e, o) for o in outermost)}
        step_us = sum(e["dur"] for e in gpu)
        attn_us = sum(e["dur"] for e in gpu if ext(e) in attn_ids)
        unlinked_us = sum(e["dur"] for e in gpu if ext(e) in (None, 0, -1))
        out.update(counted="GPU time (kernels, memcpy, memset) launched inside the attention ops, by External id, "
                           "over all GPU time in the step",
                   attention_ms=attn_us / 1e3, step_ms=step_us / 1e3, unlinked_gpu_ms=unlinked_us / 1e3,
                   attention_kernels=sorted({e["name"][:80] for e in gpu if ext(e) in attn_ids}),
                   share=attn_us / step_us if step_us else None)
    else:
        steps = [e for e in cpu_ops if e.get("cat") == "user_annotation" and e["name"] == "train_step"]
        span = steps[0]["dur"] if steps else 0
        attn_us = sum(e["dur"] for e in outermost)
        out.update(counted="CPU time in the outermost attention ops over the step's span", attention_ms=attn_us / 1e3,
                   step_ms=span / 1e3, share=attn_us / span if span else None)
    return out


def profile_step(side: Side, ids, device, trace_dir: str) -> dict:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    with profile(activities=acts) as prof:
        with torch.profiler.record_function("train_step"):
            train_step(side, ids)
        sync(device)
    path = os.path.join(trace_dir, f"train_step_{side.name}.json")
    prof.export_chrome_trace(path)
    share = _attention_share(path, device)
    share["trace"] = path
    return share


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


# ---- The command.

def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cuda (the GPU run's shape) or cpu (a tiny config: the smoke run)")
    ap.add_argument("--backend", default="flash", help="attnprof's backend (flash, efficient, cudnn, ...)")
    ap.add_argument("--model", choices=("auto", "transformers", "own"), default="auto",
                    help="transformers' LlamaForCausalLM (auto: where importable) or our own model")
    for name, kind in (("layers", int), ("hidden", int), ("heads", int), ("kv-heads", int), ("head-dim", int),
                       ("intermediate", int), ("vocab", int), ("seq", int), ("batch", int), ("steps", int),
                       ("warmup", int)):
        ap.add_argument(f"--{name}", type=kind, default=None,
                        help=f"default {GPU_DEFAULTS[name.replace('-', '_')]} (cuda), "
                             f"{CPU_DEFAULTS[name.replace('-', '_')]} (cpu)")
    ap.add_argument("--dtype", choices=tuple(DTYPES), default=None, help="default bf16 (cuda), fp32 (cpu)")
    ap.add_argument("--lr", type=float, default=1e-4, help="AdamW's learning rate")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-profile", action="store_true", help="skip the profiled step (no attention share)")
    ap.add_argument("--trace-dir", default=None, help="keep the profiled steps' Chrome traces here (default: dropped)")
    ap.add_argument("--out", default=None, help="write train_step.json and train_step.md here")
    a = ap.parse_args(argv)
    for k, v in (GPU_DEFAULTS if a.device == "cuda" else CPU_DEFAULTS).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    for k in ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab", "seq", "batch", "steps"):
        if getattr(a, k) < 1:
            ap.error(f"--{k.replace('_', '-')} must be at least 1, got {getattr(a, k)}")
    if a.warmup < 0:
        ap.error(f"--warmup must be 0 or more, got {a.warmup}")
    if a.heads % a.kv_heads:
        ap.error(f"--heads {a.heads} must be a multiple of --kv-heads {a.kv_heads}")
    if a.head_dim % 2:
        ap.error(f"--head-dim must be even (rotary embeddings), got {a.head_dim}")
    if a.seq < 2:
        ap.error("--seq must be at least 2 (next-token loss)")
    return a


def run(a) -> dict:
    try:
        import attnprof
    except ImportError as e:
        raise Refused(f"attnprof is not importable ({e}): build the _core target and put <build>/python on "
                      "PYTHONPATH") from None
    if a.backend not in attnprof.backend_names():
        raise Refused(f"--backend {a.backend!r} is not one of attnprof's: {', '.join(attnprof.backend_names())}")
    if a.device == "cuda":
        if not torch.cuda.is_available():
            raise Refused(f"--device cuda but torch {torch.__version__} sees no CUDA device "
                          f"(built for CUDA {torch.version.cuda}); --device cpu runs the tiny smoke config")
        if not attnprof.cuda_built():
            raise Refused("--device cuda but this attnprof build has no CUDA backends (configure with -DATTNPROF_CUDA=ON)")
    device = torch.device(a.device)
    dtype = DTYPES[a.dtype]
    progress(f"building the models ({a.layers} layers, hidden {a.hidden}, {a.heads}/{a.kv_heads} heads of {a.head_dim}, "
             f"intermediate {a.intermediate}, vocab {a.vocab}; batch {a.batch} x seq {a.seq}, {a.dtype}, {a.device})")
    sides, notes = build_sides(a, dtype, device)
    progress(f"model: {notes['model']}")
    g = torch.Generator(device="cpu").manual_seed(a.seed)
    batches = [torch.randint(0, a.vocab, (a.batch, a.seq), generator=g).to(device) for _ in range(a.warmup + a.steps + 1)]

    progress("loss and gradient agreement on the first batch")
    agree = agreement(sides, batches[0])
    ours = sides[0]
    if ours.counter is not None and ours.counter.calls != a.layers:
        raise Refused(f"attnprof's attention ran {ours.counter.calls} times in one forward of {a.layers} layers: "
                      "the model did not take the registered attention")
    progress(f"loss rel diff {agree['loss_rel_diff']:.2e}, gradient cosine {agree['grad_cosine']:.6f}, "
             f"max rel err {agree['grad_max_rel_err']:.2e}")

    for side in sides:
        side.opt = torch.optim.AdamW(side.model.parameters(), lr=a.lr)
    progress(f"{a.warmup} warmup + {a.steps} measured steps per side, the sides alternating")
    for i in range(a.warmup + a.steps):
        for side in sides:
            sync(device)
            t0 = time.perf_counter()
            side.losses.append(train_step(side, batches[i]))
            sync(device)
            side.last_ms = (time.perf_counter() - t0) * 1e3
            if i >= a.warmup:
                side.times.append(side.last_ms)
        if i < a.warmup or (i + 1 - a.warmup) % max(1, a.steps // 4) == 0 or i + 1 == a.warmup + a.steps:
            progress(f"step {i + 1}/{a.warmup + a.steps}{' (warmup)' if i < a.warmup else ''}: " + ", ".join(
                f"{s.name} {s.last_ms:.1f} ms" for s in sides))

    if not a.no_profile:
        progress("one profiled step per side (torch.profiler)")
        with contextlib.ExitStack() as stack:
            trace_dir = a.trace_dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="train_step_"))
            os.makedirs(trace_dir, exist_ok=True)
            for side in sides:
                side.share = profile_step(side, batches[-1], device, trace_dir)
                if not a.trace_dir:
                    side.share.pop("trace")

    result = {
        "config": {k: getattr(a, k) for k in ("device", "backend", "layers", "hidden", "heads", "kv_heads", "head_dim",
                                              "intermediate", "vocab", "seq", "batch", "dtype", "steps", "warmup",
                                              "lr", "seed")},
        "model": notes.pop("model"), "notes": notes,
        "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "timing": "wall time per training step (forward, backward, AdamW step, zero_grad; CUDA-synchronised on a "
                  "GPU); "
                  f"median of {a.steps} after {a.warmup} warmup steps; the sides alternate step by step",
        "sides": {},
        "agreement": agree,
    }
    for side in sides:
        result["sides"][side.name] = {
            "attention": side.attention,
            "step_ms_median": statistics.median(side.times), "step_ms_p10": pct(side.times, 0.1),
            "step_ms_p90": pct(side.times, 0.9), "step_ms": side.times,
            "losses": [x.item() for x in side.losses],
            "attention_share": side.share or None,
        }
    r = result["sides"]
    result["step_time_ratio_attnprof_over_sdpa"] = r["attnprof"]["step_ms_median"] / r["sdpa"]["step_ms_median"]
    last = [r[s]["losses"][-1] for s in ("attnprof", "sdpa")]
    result["agreement"]["last_loss_rel_diff"] = abs(last[0] - last[1]) / max(abs(last[1]), 1e-30)
    return result


def table(result: dict) -> str:
    c = result["config"]
    lines = [f"## Training step: attnprof ({c['backend']}) against PyTorch's SDPA",
             "",
             f"{result['model']}; {c['layers']} layers, hidden {c['hidden']}, {c['heads']} query heads over "
             f"{c['kv_heads']} K/V heads of {c['head_dim']}, intermediate {c['intermediate']}, vocab {c['vocab']}; "
             f"batch {c['batch']} x seq {c['seq']}, {c['dtype']}, causal; {result['device_name']}, torch {result['torch']}.",
             f"Step time: {result['timing']}.",
             "",
             "| side | attention | median step ms | p10-p90 ms | attention share | attention ms / step ms (profiled) | last loss |",
             "|---|---|---|---|---|---|---|"]
    for name, s in result["sides"].items():
        sh = s["attention_share"] or {}
        share = f"{100 * sh['share']:.1f}%" if sh.get("share") is not None else "-"
        split = f"{sh['attention_ms']:.2f} / {sh['step_ms']:.2f}" if sh.get("share") is not None else "-"
        lines.append(f"| {name} | {s['attention']} | {s['step_ms_median']:.2f} | {s['step_ms_p10']:.2f}-"
                     f"{s['step_ms_p90']:.2f} | {share} | {split} | {s['losses'][-1]:.4f} |")
    g = result["agreement"]
    lines += ["",
              f"Step-time ratio attnprof/SDPA: {result['step_time_ratio_attnprof_over_sdpa']:.3f}",
              f"First batch, same weights: loss {g['loss_attnprof']:.6f} vs {g['loss_sdpa']:.6f} "
              f"(rel diff {g['loss_rel_diff']:.2e}); gradients ({g['grad_elements']} elements): cosine "
              f"{g['grad_cosine']:.6f}, max|diff|/max|g_sdpa| {g['grad_max_rel_err']:.2e}, rel L2 "
              f"{g['grad_rel_l2']:.2e}; lowest cosine {g['worst_param']['cosine']:.6f} ({g['worst_param']['name']})",
              f"Last step's loss rel diff: {g['last_loss_rel_diff']:.2e}"]
    sh = result["sides"]["attnprof"]["attention_share"]
    if sh:
        lines.append(f"Attention share: {sh['counted']}. SDPA's ops: "
                     f"{', '.join((result['sides']['sdpa']['attention_share'] or {}).get('attention_ops', [])) or '-'}")
    return "\n".join(lines)


def main(argv=None) -> dict:
    a = parse_args(argv)
    try:
        result = run(a)
    except Refused as e:
        raise SystemExit(f"train_step: error: {e}") from None
    except Exception as e:
        # attnprof's refusals (attnprof.Error: a backend that cannot train, a
        # shape it cannot take) in one line; anything else keeps its traceback.
        if type(e).__name__ == "Error" and type(e).__module__.startswith("attnprof"):
            raise SystemExit(f"train_step: error: attnprof refused: {str(e).splitlines()[0]}") from None
        raise
    text = table(result)
    print(text, flush=True)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "train_step.json"), "w") as f:
            json.dump(result, f, indent=1)
        with open(os.path.join(a.out, "train_step.md"), "w") as f:
            f.write(text + "\n")
        progress(f"wrote {a.out}/train_step.json and train_step.md")
    return result


if __name__ == "__main__":
    main()
