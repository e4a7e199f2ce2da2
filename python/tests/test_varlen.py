"""Packed (variable-length) batches from Python (issue 22 item 2): attention(q, k, v, cu_seqlens_q=...,
cu_seqlens_k=..., max_seqlen_q=..., max_seqlen_k=...) as flash_attn_varlen_func takes them, against per-sequence
dense calls and float64, forward and autograd backward on the CPU; compare/profile/explain(seq_lens=); bad
input refused in one line with nothing allocated."""

import numpy as np
import pytest
import torch

import attnprof
from attnprof import _core

torch.manual_seed(22)


def cu(lens):
    return torch.tensor([0] + list(np.cumsum(lens)), dtype=torch.int32)


def packed(q_lens, kv_lens, heads=4, kv_heads=2, dim=32, dtype=torch.float32, requires_grad=False):
    q = torch.randn(sum(q_lens), heads, dim, dtype=dtype, requires_grad=requires_grad)
    k = torch.randn(sum(kv_lens), kv_heads, dim, dtype=dtype, requires_grad=requires_grad)
    v = torch.randn(sum(kv_lens), kv_heads, dim, dtype=dtype, requires_grad=requires_grad)
    return q, k, v


def per_sequence(q_lens, kv_lens, q, k, v, mask, window=None, masked_rows=False):
    """float64 per sequence, as [1, H, S, D] dense problems, packed back: what a packed call must equal
    (with masked_rows=True also which packed query rows see no key)."""
    outs, masked = [], []
    cq, ck = cu(q_lens).tolist(), cu(kv_lens).tolist()
    group = q.shape[1] // k.shape[1]
    for b in range(len(q_lens)):
        qs = q[cq[b]:cq[b + 1]].double().transpose(0, 1)
        ks = k[ck[b]:ck[b + 1]].double().transpose(0, 1).repeat_interleave(group, 0)
        vs = v[ck[b]:ck[b + 1]].double().transpose(0, 1).repeat_interleave(group, 0)
        s = qs @ ks.transpose(-1, -2) / qs.shape[-1] ** 0.5
        i = torch.arange(qs.shape[1])[:, None]
        j = torch.arange(ks.shape[1])[None, :]
        off = ks.shape[1] - qs.shape[1]
        if mask == "causal":
            s = s.masked_fill(j > i, float("-inf"))
        elif mask == "causal_bottom_right":
            s = s.masked_fill(j > i + off, float("-inf"))
        elif mask == "sliding_window":
            s = s.masked_fill((j > i + off) | (j <= i + off - window), float("-inf"))
        masked.append(torch.isinf(s).all(-1).transpose(0, 1))  # all() of no keys is True
        p = torch.softmax(s, -1).nan_to_num(0.0)  # rows with no key: zeros, as flash writes them
        outs.append((p @ vs).transpose(0, 1))
    out = torch.cat(outs, 0)
    return (out, torch.cat(masked, 0)) if masked_rows else out


LENGTHS = [([5, 0, 70, 1], [5, 0, 70, 1]), ([33, 64, 9], [50, 64, 9]), ([130], [120])]


@pytest.mark.parametrize("backend", ["flash", "naive", "naive_inplace", "math"])
@pytest.mark.parametrize("mask", ["causal", "causal_bottom_right", "none"])
@pytest.mark.parametrize("lens", LENGTHS)
def test_forward_matches_per_sequence_float64(backend, mask, lens):
    q_lens, kv_lens = lens
    q, k, v = packed(q_lens, kv_lens)
    out = attnprof.attention(q, k, v, backend=backend, mask=mask, cu_seqlens_q=cu(q_lens), cu_seqlens_k=cu(kv_lens),
                             max_seqlen_q=max(q_lens), max_seqlen_k=max(kv_lens))
    assert out.shape == q.shape
    want, masked = per_sequence(q_lens, kv_lens, q, k, v, mask, masked_rows=True)
    if backend.startswith("naive"):
        # The textbook softmax's NaN on a row that sees no key (documented), and only there.
        assert torch.equal(torch.isnan(out).any(-1), masked)
        out = out.nan_to_num(0.0)
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=1e-4)


def test_packed_call_equals_dense_calls_per_sequence():
    """The packed call is the per-sequence dense calls of attnprof itself, bit for bit on flash."""
    q_lens, kv_lens = [40, 1, 129], [60, 1, 129]
    q, k, v = packed(q_lens, kv_lens, dtype=torch.bfloat16)
    out = attnprof.attention(q, k, v, backend="flash", mask="causal_bottom_right", cu_seqlens_q=cu(q_lens),
                             cu_seqlens_k=cu(kv_lens))
    cq, ck = cu(q_lens).tolist(), cu(kv_lens).tolist()
    for b in range(3):
        dense = attnprof.attention(q[cq[b]:cq[b + 1]].unsqueeze(0), k[ck[b]:ck[b + 1]].unsqueeze(0),
                                   v[ck[b]:ck[b + 1]].unsqueeze(0), backend="flash", mask="causal_bottom_right",
                                   layout="bshd")
        assert torch.equal(out[cq[b]:cq[b + 1]], dense[0]), f"sequence {b}"


def test_window_and_gqa_per_sequence():
    q_lens, kv_lens = [20, 90, 3], [20, 100, 3]
    q, k, v = packed(q_lens, kv_lens, heads=6, kv_heads=2)
    out = attnprof.attention(q, k, v, backend="flash", mask="sliding_window", window=16, cu_seqlens_q=cu(q_lens),
                             cu_seqlens_k=cu(kv_lens))
    want = per_sequence(q_lens, kv_lens, q, k, v, "sliding_window", window=16)
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("mask", ["causal", "causal_bottom_right"])
def test_autograd_backward_matches_float64(mask):
    q_lens, kv_lens = [17, 0, 80, 1], [30, 4, 80, 1]
    if mask == "causal_bottom_right":
        kv_lens = [17, 4, 90, 3]
    q, k, v = packed(q_lens, kv_lens, requires_grad=True)
    out = attnprof.attention(q, k, v, backend="flash", mask=mask, cu_seqlens_q=cu(q_lens), cu_seqlens_k=cu(kv_lens),
                             max_seqlen_q=max(q_lens), max_seqlen_k=max(kv_lens))
    dout = torch.randn(out.shape, dtype=torch.float64)
    grads = torch.autograd.grad(out, (q, k, v), dout.float())
    ref = per_sequence(q_lens, kv_lens, q, k, v, mask)
    want = torch.autograd.grad(ref, (q, k, v), dout)
    for name, g, w in zip("qkv", grads, want):
        torch.testing.assert_close(g.double(), w.double(), atol=1e-4, rtol=1e-3, msg=f"d{name}")
    # Keys of a sequence without queries (sequence 1) get no gradient.
    first, end = cu(kv_lens).tolist()[1:3]
    assert end - first == 4 and torch.count_nonzero(grads[1][first:end]) == 0
    assert torch.count_nonzero(grads[2][first:end]) == 0


def test_numpy_takes_it_too():
    q_lens = [7, 0, 40]
    q, k, v = packed(q_lens, q_lens)
    c = cu(q_lens).numpy()
    out = attnprof.attention(q.numpy(), k.numpy(), v.numpy(), backend="math", cu_seqlens_q=c, cu_seqlens_k=c)
    np.testing.assert_allclose(out, per_sequence(q_lens, q_lens, q, k, v, "causal").numpy(), atol=2e-5, rtol=1e-4)


def bad(**kw):
    q_lens = kw.pop("q_lens", [3, 5])
    args = dict(q=torch.randn(8, 2, 16), k=torch.randn(8, 2, 16), v=torch.randn(8, 2, 16), cu_seqlens_q=cu(q_lens),
                cu_seqlens_k=cu([3, 5]), backend="flash")
    args.update(kw)
    before = _core.allocated_bytes("cpu")
    with pytest.raises(attnprof.Error) as e:
        attnprof.attention(args.pop("q"), args.pop("k"), args.pop("v"), **args)
    assert "\n" not in str(e.value)
    assert _core.allocated_bytes("cpu") == before, "a refused call left memory allocated"
    return str(e.value)


def test_bad_cumulative_lengths_are_refused_in_one_line():
    assert "decreases at entry 2" in bad(cu_seqlens_q=torch.tensor([0, 5, 3, 8], dtype=torch.int32))
    assert "cumulative lengths start at 0" in bad(cu_seqlens_q=torch.tensor([1, 3, 8], dtype=torch.int32))
    assert "overruns the packed tensor's 8 rows" in bad(cu_seqlens_k=torch.tensor([0, 3, 9], dtype=torch.int32))
    assert "ends at 6 but the packed tensor has 8 rows" in bad(cu_seqlens_q=torch.tensor([0, 3, 6], dtype=torch.int32))
    assert "must be int32" in bad(cu_seqlens_q=torch.tensor([0, 3, 8], dtype=torch.int64))
    assert "must be int32" in bad(cu_seqlens_q=torch.tensor([0.0, 3.0, 8.0]))
    assert "cu_seqlens_q has 4 entries but cu_seqlens_k has 3" in bad(
        cu_seqlens_q=torch.tensor([0, 3, 5, 8], dtype=torch.int32))
    assert "max_seqlen_q is 4, smaller than sequence 1's length 5" in bad(max_seqlen_q=4)
    assert "max_seqlen_k is 2, smaller than sequence 0's length 3" in bad(max_seqlen_k=2)
    assert "needs both" in bad(cu_seqlens_k=None)
    assert "3-d" in bad(q=torch.randn(1, 8, 2, 16))
    assert "1-d" in bad(cu_seqlens_q=torch.tensor([[0, 3, 8]], dtype=torch.int32))


def test_explain_lists_the_cpu_backends_taking_it():
    e = attnprof.explain(seq_lens=[3, 5], heads=2, head_dim=16, device="cpu")
    assert e.eligible() == ["naive", "naive_inplace", "math", "flash"]
    for r in e.results:
        if r.eligible:
            assert "packed" in r.reason, r.reason
    assert e.problem.seq_lens == [3, 5]


def test_compare_reports_the_padded_batchs_flops():
    rep = attnprof.compare(seq_lens=[64, 8, 128], heads=2, head_dim=32, backends=["flash", "math"], trace_dir=None,
                           schedule=(0, 0, 1, 1), threads=1)
    assert rep.accepted
    assert rep.problem.seq_lens == [64, 8, 128]
    assert rep.problem.batch == 3 and rep.problem.seq == 128
    text = str(rep)
    assert "packed batch of 3 sequences" in text
    found = [f for r in rep.results for f in r.findings if f.rule == "packed-batch"]
    assert found, "no packed-batch finding"
    # Causal: (64*65/2 + 8*9/2 + 128*129/2) pairs of 3 * 128*129/2 padded.
    pct = 100 * (64 * 65 / 2 + 8 * 9 / 2 + 128 * 129 / 2) / (3 * 128 * 129 / 2)
    assert f"{pct:.0f}% of the padded batch's FLOPs" in found[0].text
    assert found[0].figures["padded_flops"] > found[0].figures["flops"]
    for r in rep.results:
        assert r.rel_error < 1e-2, r.backend


def test_problem_keywords_are_checked():
    with pytest.raises(attnprof.Error, match="seq_lens has 2 lengths but batch is 3"):
        attnprof.explain(seq_lens=[3, 5], batch=3)
    with pytest.raises(attnprof.Error, match="seq_lens"):
        attnprof.explain(seq_lens=[3, -1])
    with pytest.raises(attnprof.Error, match="seq_lens is empty"):
        attnprof.explain(seq_lens=[])
    with pytest.raises(attnprof.Error, match="kv_seq_lens needs seq_lens"):
        attnprof.explain(kv_seq_lens=[3])
