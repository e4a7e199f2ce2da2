#!/usr/bin/env python3
"""A serving engine's decode step (one paged-attention call per layer) replayed from a CUDA graph against the
same step called eagerly: issue 56's target (the graph at least 1.3x faster than the eager step).

Per layer its own paged KV cache, one shared block table and seq_lens (as vLLM and SGLang share them across
layers), and one attnprof.plan made once per layer. Three ways to run the step, each timed with CUDA events over
--steps steps after a warm-up, median of --rounds rounds:
  eager attention()  attnprof.attention(q, k_pages, v_pages, block_table=, seq_lens=, out=) per layer
  eager plan.run     plan.run(q, k_pages, v_pages, out, block_table=, seq_lens=) per layer (planned once)
  graph replay       the plan.run step captured once in torch.cuda.graph, replayed
Before timing, the replay is checked against the eager call (bit for bit) after the block table and the
lengths are rewritten in place, as a serving step does. Prints a markdown table and the target's verdict.

  PYTHONPATH=build/gpu/python python3 bench/graph_decode.py            (scripts/gpu.sh's graph_decode phase)
  ... --layers 32 --batch 1,16 --kv 512,2048 --heads 32 --kv-heads 8 --head-dim 128 --page 16
"""
import argparse
import statistics
import sys

import torch

import attnprof


def ints(text):
    return [int(x) for x in text.split(",")]


def make_step(a, batch, kv):
    """The layers' tensors and plans for one decode step of `batch` sequences of up to `kv` keys."""
    pages_per_seq = -(-kv // a.page)
    num_pages = batch * pages_per_seq
    dev, dt = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    table = torch.randperm(num_pages, device=dev, generator=g).view(batch, pages_per_seq).to(torch.int32)
    # Unequal lengths, the longest the cache's capacity.
    seq_lens = torch.randint(kv // 2, kv + 1, (batch,), device=dev, generator=g, dtype=torch.int32)
    seq_lens[0] = kv
    layers = []
    for _ in range(a.layers):
        q = torch.randn(batch, a.heads, 1, a.head_dim, device=dev, dtype=dt, generator=g)
        k = torch.randn(num_pages, a.kv_heads, a.page, a.head_dim, device=dev, dtype=dt, generator=g)
        v = torch.randn(num_pages, a.kv_heads, a.page, a.head_dim, device=dev, dtype=dt, generator=g)
        plan = attnprof.plan(q, k, v, backend=a.backend, mask="causal_bottom_right", block_table=table,
                             seq_lens=seq_lens)
        layers.append((q, k, v, torch.empty_like(q), plan))
    return table, seq_lens, layers


def time_us(fn, steps, rounds):
    """Median over rounds of the mean step time in microseconds (CUDA events around `steps` steps)."""
    per_round = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(steps):
            fn()
        end.record()
        end.synchronize()
        per_round.append(start.elapsed_time(end) * 1e3 / steps)
    return statistics.median(per_round)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--batch", type=ints, default=[1, 16], help="sequences per step, comma-separated")
    p.add_argument("--kv", type=ints, default=[512, 2048], help="the longest sequence's keys, comma-separated")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--page", type=int, default=16)
    p.add_argument("--backend", default="flash")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("graph_decode: error: needs a CUDA GPU (this bench times CUDA graph replays)")
    print(f"# decode step of {a.layers} layers: {a.backend}, {a.heads}/{a.kv_heads} heads, d{a.head_dim}, "
          f"page {a.page}, bf16; {torch.cuda.get_device_name()}, torch {torch.__version__}\n")
    print("| batch | keys | eager attention() us | eager plan.run us | graph replay us | graph vs attention() "
          "| graph vs plan.run | target 1.3x |")
    print("|---|---|---|---|---|---|---|---|")
    failed = False
    for batch in a.batch:
        for kv in a.kv:
            table, seq_lens, layers = make_step(a, batch, kv)

            def eager_attention():
                for q, k, v, o, _ in layers:
                    attnprof.attention(q, k, v, backend=a.backend, mask="causal_bottom_right", block_table=table,
                                       seq_lens=seq_lens, out=o)

            def eager_plan():
                for q, k, v, o, plan in layers:
                    plan.run(q, k, v, o, block_table=table, seq_lens=seq_lens)

            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up off the default stream, as torch.cuda.graph asks
                for _ in range(3):
                    eager_plan()
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                eager_plan()
            # The serving contract, checked before anything is timed: the replay follows a rewritten table and
            # lengths, bit for bit with the eager call.
            table.copy_(table.roll(1, dims=0))
            seq_lens.copy_(seq_lens.flip(0))
            graph.replay()
            replayed = [o.clone() for *_, o, _ in layers]
            eager_attention()
            torch.cuda.synchronize()
            for got, (*_, o, _) in zip(replayed, layers):
                if not torch.equal(got, o):
                    sys.exit(f"graph_decode: error: the replay differs from the eager call (batch {batch}, keys {kv})")
            t_attention = time_us(eager_attention, a.steps, a.rounds)
            t_plan = time_us(eager_plan, a.steps, a.rounds)
            t_graph = time_us(graph.replay, a.steps, a.rounds)
            ok = t_attention / t_graph >= 1.3
            failed |= not ok
            print(f"| {batch} | {kv} | {t_attention:.1f} | {t_plan:.1f} | {t_graph:.1f} | "
                  f"{t_attention / t_graph:.2f}x | {t_plan / t_graph:.2f}x | {'met' if ok else 'MISSED'} |")
            del graph, layers
            torch.cuda.empty_cache()
    print("\nThe target compares the graph with the eager step as a serving engine without graphs calls it "
          "(attention() per layer); plan.run is the planned eager step.")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
