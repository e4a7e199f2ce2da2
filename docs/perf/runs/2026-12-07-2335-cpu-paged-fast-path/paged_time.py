import time, torch, attnprof
from attnprof import _torch as T
b, hq, hk, d, page, kv = 1, 1, 1, 64, 16, 16
table = torch.arange(1, dtype=torch.int32).view(1, 1); seq_lens = torch.full((1,), kv, dtype=torch.int32)
q = torch.randn(b, hq, 1, d); k = torch.randn(1, hk, page, d); v = torch.randn_like(k); out = torch.empty_like(q)
f = lambda: attnprof.attention(q, k, v, backend="flash", mask="causal_bottom_right", block_table=table, seq_lens=seq_lens, out=out)
p = attnprof.plan(q, k, v, backend="flash", mask="causal_bottom_right", block_table=table, seq_lens=seq_lens)
g = lambda: p.run(q, k, v, out, block_table=table, seq_lens=seq_lens)
def t(fn, n=5000):
    for _ in range(200): fn()
    best = 1e9
    for r in range(7):
        s = time.perf_counter()
        for _ in range(n): fn()
        best = min(best, (time.perf_counter() - s) / n * 1e6)
    return best
for on in (True, False, True, False):
    T._use_fast(on)
    print("fast" if on else "dlpack", "attention %.1f us  plan.run %.1f us" % (t(f), t(g)))
