"""The call cache (src/bindings/call.cpp, issue 22 item 6): a repeated call with arrays of the same layouts and the
same arguments reuses the problem and the plan, and makes only views of the new pointers. Every field of the key
gives a fresh entry and the right answer; bad input after a cached good call is still refused in the library's
words, and nothing refused is cached; a hit reads the arrays it is given, never the ones it was cached with."""

import gc

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attnprof
from attnprof import _core

from test_errors import CASES, arrays

torch.manual_seed(0)

SHAPE = (2, 4, 24, 16)


def qkv(shape=SHAPE, kv_shape=None, dtype=torch.float32):
    kv_shape = kv_shape or shape
    return (torch.randn(shape, dtype=dtype), torch.randn(kv_shape, dtype=dtype), torch.randn(kv_shape, dtype=dtype))


def sdpa(q, k, v, **kw):
    q, k, v = (x.double() for x in (q, k, v))
    mask = kw.get("attn_mask")
    if mask is not None and mask.is_floating_point():
        kw["attn_mask"] = mask.double()
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=k.shape[1] != q.shape[1], **kw)


def capped(q, k, v, cap):
    q, k, v = q.double(), k.double(), v.double()
    s = torch.tanh(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 / cap) * cap
    s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).tril().logical_not(), float("-inf"))
    return torch.softmax(s, -1) @ v


def window_mask(s, skv, w):
    i, j = torch.arange(s)[:, None], torch.arange(skv)[None, :]
    off = skv - s
    return (j <= i + off) & (j > i + off - w)


def variants():
    """Each changes one field of the key from the base call; (name, make) with make() -> (args, kwargs, want)."""
    base = {"backend": "flash"}

    def call(q, k, v, want, **kw):
        return (q, k, v), {**base, **kw}, want

    def base_call(**kw):
        q, k, v = qkv()
        return call(q, k, v, sdpa(q, k, v, is_causal=True), **kw)

    def dtype():
        q, k, v = qkv(dtype=torch.bfloat16)
        return call(q, k, v, sdpa(q, k, v, is_causal=True))

    def seq():
        q, k, v = qkv((2, 4, 40, 16))
        return call(q, k, v, sdpa(q, k, v, is_causal=True))

    def kv_seq():
        q, k, v = qkv(SHAPE, (2, 4, 40, 16))
        return call(q, k, v, sdpa(q, k, v, attn_mask=torch.ones(24, 40, dtype=torch.bool).tril()))

    def gqa():
        q, k, v = qkv(SHAPE, (2, 2, 24, 16))
        return call(q, k, v, sdpa(q, k, v, is_causal=True))

    def head_dim():
        q, k, v = qkv((2, 4, 24, 32))
        return call(q, k, v, sdpa(q, k, v, is_causal=True))

    def batch():
        q, k, v = qkv((3, 4, 24, 16))
        return call(q, k, v, sdpa(q, k, v, is_causal=True))

    def strides_of_q():
        q, k, v = qkv()
        q = torch.randn(2, 24, 4, 16).transpose(1, 2)  # [B, H, S, D] view of a [B, S, H, D] buffer
        return call(q, k, v, sdpa(q, k, v, is_causal=True))

    def strides_of_kv():
        q, _, _ = qkv()
        k, v = (torch.randn(2, 4, 48, 16)[:, :, ::2] for _ in range(2))  # every other row of a longer buffer
        return call(q, k, v, sdpa(q, k, v, is_causal=True))

    def strides_of_out():
        q, k, v = qkv()
        out = torch.empty(2, 24, 4, 16).transpose(1, 2)
        return call(q, k, v, sdpa(q, k, v, is_causal=True), out=out)

    def layout():
        q, k, v = (x.transpose(1, 2).contiguous() for x in qkv())  # [B, S, H, D] buffers
        want = sdpa(*(x.transpose(1, 2) for x in (q, k, v)), is_causal=True).transpose(1, 2)
        return call(q, k, v, want, layout="bshd")

    def backend():
        return base_call(backend="naive")

    def mask_none():
        q, k, v = qkv()
        return call(q, k, v, sdpa(q, k, v), mask="none")

    def mask_bottom_right():
        q, k, v = qkv(SHAPE, (2, 4, 40, 16))
        return call(q, k, v, sdpa(q, k, v, attn_mask=torch.ones(24, 40, dtype=torch.bool).tril(16)),
                    mask="causal_bottom_right")

    def window(w):
        def make():
            q, k, v = qkv()
            return call(q, k, v, sdpa(q, k, v, attn_mask=window_mask(24, 24, w)), mask="sliding_window", window=w)

        return make

    def scale():
        q, k, v = qkv()
        return call(q, k, v, sdpa(q, k, v, is_causal=True, scale=0.3), scale=0.3)

    def softcap():
        q, k, v = qkv()
        return call(q, k, v, capped(q, k, v, 2.0), softcap=2.0)

    def bool_mask(shape):
        def make():
            q, k, v = qkv()
            m = torch.rand(shape) > 0.4
            m[..., 0] = True
            return call(q, k, v, sdpa(q, k, v, attn_mask=m), attn_mask=m)

        return make

    def float_mask():
        q, k, v = qkv()
        m = torch.randn(24, 24)
        return call(q, k, v, sdpa(q, k, v, attn_mask=m), attn_mask=m)

    def threads():
        return base_call(threads=1)

    return {
        "base": base_call, "dtype": dtype, "batch": batch, "seq": seq, "kv_seq": kv_seq,
        "kv heads (GQA)": gqa, "head_dim": head_dim, "strides of q": strides_of_q, "strides of k and v": strides_of_kv,
        "strides of out": strides_of_out, "layout": layout, "backend": backend, "mask none": mask_none,
        "mask causal_bottom_right": mask_bottom_right, "window 5": window(5), "window 9": window(9),
        "scale": scale, "softcap": softcap, "bool attn_mask [S, Skv]": bool_mask((24, 24)),
        "bool attn_mask [B, 1, S, Skv]": bool_mask((2, 1, 24, 24)), "float attn_mask": float_mask,
        "threads": threads,
    }


VARIANTS = variants()


def run(args, kwargs):
    return attnprof.attention(*args, **kwargs)


def test_every_key_field_gives_a_fresh_entry_and_the_right_answer():
    _core._clear_cache()
    for name, make in VARIANTS.items():
        args, kwargs, want = make()
        before = _core._cache_entries()
        got = run(args, kwargs)
        assert _core._cache_entries() == before + 1, f"{name}: no fresh entry"
        torch.testing.assert_close(got.double(), want, atol=2e-2 if got.dtype == torch.bfloat16 else 2e-5,
                                   rtol=2e-2 if got.dtype == torch.bfloat16 else 1e-4, msg=name)
        # The same call again is a hit: no new entry, the same answer.
        again = run(args, kwargs)
        assert _core._cache_entries() == before + 1, f"{name}: a repeated call made another entry"
        torch.testing.assert_close(again, got, atol=0, rtol=0, msg=name)


def test_a_hit_takes_the_plan_of_its_key_not_of_the_last_call():
    # Alternating two keys of one shape: each call runs the backend it names.
    q, k, v = (x.detach().numpy() for x in qkv())
    for _ in range(3):
        for backend in ("flash", "naive", "math"):
            out = np.empty_like(q)
            assert _core.attention(q, k, v, out, backend=backend, mask="causal") == backend


def test_no_stale_pointers_different_tensors_of_one_shape():
    first = qkv()
    out_first = attnprof.attention(*first, backend="flash")
    for _ in range(3):
        q, k, v = qkv()  # new buffers, the same layouts: a hit
        out = torch.empty_like(q)
        sentinel = out_first.clone()
        assert attnprof.attention(q, k, v, backend="flash", out=out) is out
        torch.testing.assert_close(out.double(), sdpa(q, k, v, is_causal=True), atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(out_first, sentinel, atol=0, rtol=0)  # the cached call's out is left alone
    # Only one of q, k, v or out new: each is read (or written) where it now is.
    q, k, v = first
    for i in range(3):
        args = list(first)
        args[i] = torch.randn(SHAPE)
        torch.testing.assert_close(attnprof.attention(*args, backend="flash").double(),
                                   sdpa(*args, is_causal=True), atol=2e-5, rtol=1e-4)


def test_no_stale_pointers_after_the_cached_tensors_are_freed():
    q, k, v = qkv()
    attnprof.attention(q, k, v, backend="flash")
    del q, k, v
    gc.collect()
    for _ in range(3):  # the allocator may hand the same addresses back, or others: either is read right
        q, k, v = qkv()
        torch.testing.assert_close(attnprof.attention(q, k, v, backend="flash").double(),
                                   sdpa(q, k, v, is_causal=True), atol=2e-5, rtol=1e-4)


def test_no_stale_pointers_with_numpy_and_masks():
    rng = np.random.default_rng(1)
    for _ in range(3):
        q, k, v = (rng.standard_normal(SHAPE).astype(np.float32) for _ in range(3))
        m = rng.random((24, 24)) > 0.3
        m[:, 0] = True
        got = attnprof.attention(q, k, v, backend="flash", attn_mask=m)
        want = sdpa(*(torch.from_numpy(x) for x in (q, k, v)), attn_mask=torch.from_numpy(m))
        torch.testing.assert_close(torch.from_numpy(got).double(), want, atol=2e-5, rtol=1e-4)


def test_no_stale_pointers_through_autograd():
    # The training forward and its backward go through the cache (pass train): each step's gradients are its own.
    for _ in range(3):
        q, k, v = (x.requires_grad_() for x in qkv())
        out = attnprof.attention(q, k, v, backend="flash")
        dout = torch.randn_like(out)
        got = torch.autograd.grad(out, (q, k, v), dout)
        q2, k2, v2 = (x.detach().double().requires_grad_() for x in (q, k, v))
        want = torch.autograd.grad(sdpa(q2, k2, v2, is_causal=True), (q2, k2, v2), dout.double())
        for g, w, name in zip(got, want, ("dq", "dk", "dv")):
            torch.testing.assert_close(g.double(), w, atol=1e-4, rtol=1e-4, msg=name)


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_after_a_cached_good_call_is_still_refused(case):
    make, kwargs, message = CASES[case]
    q, k, v = make()
    # Each case is arrays() with one thing changed: that good call is cached first, and hit.
    good = arrays()
    attnprof.attention(*good)
    attnprof.attention(*good)
    entries = _core._cache_entries()
    for _ in range(2):  # refused the first time and the second: nothing refused is cached
        with pytest.raises(attnprof.Error, match=message):
            attnprof.attention(q, k, v, **kwargs)
    assert _core._cache_entries() == entries


def test_near_misses_of_a_cached_layout_are_refused():
    # Cached: q, k, v and out [1, 2, 16, 32] float32, contiguous.
    q, k, v = arrays()
    out = np.empty_like(q)
    attnprof.attention(q, k, v, out=out)
    attnprof.attention(q, k, v, out=out)
    entries = _core._cache_entries()
    buf = np.empty((16, 32), np.float32)
    bad = {
        # The same shapes, other strides:
        "out a broadcast view": ({"out": np.lib.stride_tricks.as_strided(buf, q.shape, (0, 0, 128, 4))},
                                 r"broadcast view"),
        "out overlapping itself": ({"out": np.lib.stride_tricks.as_strided(np.zeros(2048, np.float32), q.shape,
                                                                           (4, 4, 4, 4))}, r"overlaps itself"),
        "q with a strided head_dim": ({"q": np.ones((1, 2, 16, 64), np.float32)[..., ::2]}, r"strided head_dim"),
        "k with negative strides": ({"k": np.ones((1, 2, 16, 32), np.float32)[:, :, ::-1]}, r"negative stride"),
        # The same shapes, another dtype:
        "v float16": ({"v": v.astype(np.float16)}, r"q is fp32 but v is fp16"),
        "out float16": ({"out": out.astype(np.float16)}, r"q is fp32 but out is fp16"),
        # The same arrays, a bad argument:
        "an unknown backend": ({"backend": "fastest"}, r"unknown backend 'fastest'"),
        "a GPU backend": ({"backend": "cudnn"}, r"cudnn"),
        "window without its mask": ({"window": 4}, r"window applies only to mask=sliding-window"),
        "scale NaN": ({"scale": float("nan")}, r"finite"),
        "softcap 0": ({"softcap": 0.0}, r"softcap"),
        "threads past 4096": ({"threads": 5000}, r"threads must be from 0"),
        "a mask of the wrong shape": ({"attn_mask": np.ones((1, 2, 15, 16), bool)}, r"does not broadcast"),
    }
    for name, (change, message) in bad.items():
        call = {"q": q, "k": k, "v": v, "out": out, **change}
        with pytest.raises(attnprof.Error, match=message):
            attnprof.attention(call.pop("q"), call.pop("k"), call.pop("v"), **call)
        assert _core._cache_entries() == entries, f"{name} was cached"
    # The good call still runs, right, from its entry.
    got = attnprof.attention(q, k, v, out=out)
    assert got is out and _core._cache_entries() == entries
    want = sdpa(*(torch.from_numpy(x) for x in (q, k, v)), is_causal=True)
    torch.testing.assert_close(torch.from_numpy(out).double(), want, atol=2e-5, rtol=1e-4)


def test_paged_calls_are_not_cached():
    # A paged call reads its block table and lengths, which no layout says: each call prepares afresh.
    q = torch.randn(2, 2, 1, 16)
    k_cache, v_cache = torch.randn(8, 2, 4, 16), torch.randn(8, 2, 4, 16)
    table = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]], dtype=torch.int32)
    entries = _core._cache_entries()
    for lens, bad in (([16, 16], False), ([16, 17], True), ([9, 9], False)):
        seq_lens = torch.tensor(lens, dtype=torch.int32)
        if bad:
            with pytest.raises(attnprof.Error, match=r"seq_lens\[1\] = 17 is outside 0 .. 16"):
                attnprof.attention(q, k_cache, v_cache, block_table=table, seq_lens=seq_lens, backend="flash",
                                   mask="none")
            continue
        got = attnprof.attention(q, k_cache, v_cache, block_table=table, seq_lens=seq_lens, backend="flash",
                                 mask="none")
        n = lens[0]
        for b in range(2):
            keys = k_cache[table[b].long()].transpose(0, 1).reshape(2, 16, 16)[:, :n]
            values = v_cache[table[b].long()].transpose(0, 1).reshape(2, 16, 16)[:, :n]
            torch.testing.assert_close(got[b].double(), sdpa(q[b], keys, values), atol=2e-5, rtol=1e-4)
    assert _core._cache_entries() == entries


def test_the_cache_is_bounded():
    _core._clear_cache()
    for s in range(1, 530):  # past its 512 entries: emptied, never grown without end
        q = torch.randn(1, 1, s, 8)
        attnprof.attention(q, q, q, backend="naive", mask="none")
    assert 0 < _core._cache_entries() <= 512


def stats():
    return _core._cache_stats()


def test_a_second_identical_call_hits_the_cache_and_runs_its_plan():
    # attention() as a thin front over a cached plan: the first call makes the entry and its plan (a miss), a
    # repeated one (new arrays, one layout) is a hit that resolves no backend and runs the plan it holds.
    _core._clear_cache()
    q, k, v = qkv()
    first = attnprof.attention(q, k, v, backend="flash")
    s = stats()
    assert (s["entries"], s["plans"], s["misses"], s["hits"]) == (1, 1, 1, 0), s
    assert s["workspace_bytes"] > 0, "CPU flash's plan holds its scratch"
    resolutions = _core._backend_resolutions()
    for i in range(3):
        q2, k2, v2 = qkv()
        got = attnprof.attention(q2, k2, v2, backend="flash")
        torch.testing.assert_close(got.double(), sdpa(q2, k2, v2, is_causal=True), atol=2e-5, rtol=1e-4)
        assert stats()["hits"] == i + 1
    assert _core._backend_resolutions() == resolutions, "a hit resolved a backend"
    s = stats()
    assert (s["entries"], s["misses"]) == (1, 1), s
    torch.testing.assert_close(attnprof.attention(q, k, v, backend="flash"), first, atol=0, rtol=0)
    # A training forward is cached without a plan (plans run forwards).
    x = [t.requires_grad_() for t in qkv()]
    attnprof.attention(*x, backend="flash").sum().backward()
    assert stats()["plans"] == 1


def test_padded_calls_are_cached_and_read_each_calls_rows():
    # Rows (q_rows, kv_rows) are read by the backend on every run: one entry, each call's own values.
    _core._clear_cache()
    q, k, v = qkv((2, 4, 24, 16), (2, 4, 40, 16))
    kv_rows = torch.tensor([[0, 40], [9, 40]], dtype=torch.int32)
    for rows in ([[0, 40], [9, 40]], [[0, 12], [30, 40]], [[5, 6], [0, 40]]):
        kv_rows.copy_(torch.tensor(rows, dtype=torch.int32))
        got = attnprof.attention(q, k, v, backend="flash", mask="none", kv_rows=kv_rows)
        for b, (lo, hi) in enumerate(rows):
            torch.testing.assert_close(got[b].double(), sdpa(q[b], k[b, :, lo:hi], v[b, :, lo:hi]), atol=2e-5,
                                       rtol=1e-4, msg=str(rows))
    s = stats()
    assert (s["entries"], s["misses"], s["hits"]) == (1, 1, 2), s
    # Key ends alone ([B, 1]) are another layout: another entry, the same answer.
    ends = torch.tensor([[40], [17]], dtype=torch.int32)
    got = attnprof.attention(q, k, v, backend="flash", mask="none", kv_rows=ends)
    torch.testing.assert_close(got[1].double(), sdpa(q[1], k[1, :, :17], v[1, :, :17]), atol=2e-5, rtol=1e-4)
    assert stats()["entries"] == 2


def test_least_recently_used_entries_go_first():
    _core._clear_cache()
    keep = qkv((1, 1, 3, 8))
    attnprof.attention(*keep, backend="naive", mask="none")
    limit = stats()["max_entries"]
    for s in range(4, limit + 40):
        q = torch.randn(1, 1, s, 8)
        attnprof.attention(q, q, q, backend="naive", mask="none")
        attnprof.attention(*keep, backend="naive", mask="none")  # used again each time: never the oldest
    s = stats()
    assert s["entries"] == limit and s["evictions"] == s["misses"] - limit, s
    hits = s["hits"]
    attnprof.attention(*keep, backend="naive", mask="none")
    assert stats()["hits"] == hits + 1, "the entry used most recently was evicted"
    q = torch.randn(1, 1, 4, 8)  # the first of the loop's shapes: evicted long ago
    attnprof.attention(q, q, q, backend="naive", mask="none")
    assert stats()["misses"] == s["misses"] + 1


def test_threads_calling_one_cached_call_at_once_get_their_own_answers():
    # The GIL is released on the CPU while a call runs: the plan's scratch serves one run at a time, and a call
    # that finds it busy runs without it, never sharing it.
    import threading

    _core._clear_cache()
    inputs = [qkv((2, 4, 64, 16)) for _ in range(6)]
    wants = [sdpa(*x, is_causal=True) for x in inputs]
    errors = []

    def work(i):
        try:
            for _ in range(8):
                got = attnprof.attention(*inputs[i], backend="flash", threads=2)
                torch.testing.assert_close(got.double(), wants[i], atol=2e-5, rtol=1e-4)
        except Exception as e:  # noqa: BLE001 - reported below, per thread
            errors.append(f"thread {i}: {e}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert stats()["entries"] == 1


def test_packed_calls_are_cached_by_their_lengths_on_the_cpu():
    # A packed call's problem is its lengths (on the CPU read from host memory, as prepare reads them): the same
    # lengths hit, other lengths (in a buffer of the same shape, rewritten in place) make their own entry.
    _core._clear_cache()
    heads, dim = 2, 16
    for lens, new_entry in (([5, 11, 8], True), ([5, 11, 8], False), ([12, 4, 8], True), ([5, 11, 8], False)):
        total = sum(lens)
        q, k, v = (torch.randn(total, heads, dim) for _ in range(3))
        cu = torch.tensor([0] + list(np.cumsum(lens)), dtype=torch.int32)
        before = stats()
        got = attnprof.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, backend="flash")
        after = stats()
        assert after["misses"] - before["misses"] == int(new_entry), (lens, before, after)
        assert after["hits"] - before["hits"] == int(not new_entry), (lens, before, after)
        start = 0
        for n in lens:
            s = slice(start, start + n)
            want = sdpa(*(x[s].transpose(0, 1) for x in (q, k, v)), is_causal=True).transpose(0, 1)
            torch.testing.assert_close(got[s].double(), want, atol=2e-5, rtol=1e-4, msg=str(lens))
            start += n
    assert stats()["entries"] == 2
