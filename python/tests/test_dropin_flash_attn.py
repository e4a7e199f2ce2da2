"""flash_attn_func, flash_attn_varlen_func and flash_attn_with_kvcache (issue 56 item 4) against flash_attn's
documented semantics computed by hand in float64 (test_dropin.py's band_reference): the bottom-right diagonal,
windows, the soft cap, each packed sequence, a cache's lengths, left padding and a paged table; grouped-query
heads, the log-sum-exp, gradients, and each refusal in one line naming the argument. Every comparison runs on the
CPU and, where there is one, on a CUDA GPU (the cuda cases are skipped with the reason otherwise)."""

import pytest

torch = pytest.importorskip("torch")

import attnprof  # noqa: E402
from test_dropin import (band_reference, bshd, close, cumulative, dense_reference, device,  # noqa: E402,F401
                         dtype_of, one_line_error, randn)



# ---- flash_attn_func

# (Sq, Sk, causal, window_size, softcap, softmax_scale, backend): backend flash where a row sees no key (the
# textbook composites auto may pick give NaN there, flash zeros as flash_attn does).
FUNC_CASES = {
    "square": (32, 32, False, (-1, -1), 0.0, None, "auto"),
    "causal_bottom_right_short_q": (7, 29, True, (-1, -1), 0.0, None, "auto"),
    "causal_bottom_right_long_q": (29, 7, True, (-1, -1), 0.0, None, "flash"),
    "window_causal": (12, 40, True, (5, -1), 0.0, None, "auto"),
    "window_causal_right_ignored": (12, 40, True, (5, 3), 0.0, None, "auto"),
    "window_left_zero": (12, 40, False, (0, 0), 0.0, None, "auto"),
    "window_no_causal": (12, 40, False, (5, 0), 0.0, None, "auto"),
    "right_zero_is_causal": (12, 40, False, (-1, 0), 0.0, None, "auto"),
    "window_wider_than_keys": (40, 40, True, (100, -1), 0.0, None, "auto"),
    "right_past_keys_is_unbounded": (12, 40, False, (-1, 100), 0.0, None, "auto"),
    "one_query_right_moot": (1, 30, False, (4, 3), 0.0, None, "auto"),
    "softcap_and_scale": (20, 24, True, (-1, -1), 5.0, 0.2, "auto"),
}


@pytest.mark.parametrize("case", FUNC_CASES)
def test_flash_attn_func_matches_documented_band(case, device):
    sq, sk, causal, window, softcap, scale, backend = FUNC_CASES[case]
    q, k, v = bshd(2, sq, sk, 4, 2, 32, device)
    out = attnprof.flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, window_size=window, softcap=softcap,
                                   backend=backend)
    assert out.shape == q.shape and out.dtype == q.dtype
    want, _ = dense_reference(q, k, v, causal=causal, window=window, scale=scale, softcap=softcap)
    close(out, want, device)


def test_flash_attn_func_sliding_window_counts_like_flash_attn(device):
    """flash_attn's (w, 0) sees w + 1 keys (the diagonal's and w before it); attnprof's window counts the
    diagonal's key among its w: each w is checked against the band by hand, and against attnprof's own window."""
    q, k, v = bshd(1, 16, 16, 2, 2, 32, device)
    for w in (0, 1, 2, 7):
        out = attnprof.flash_attn_func(q, k, v, causal=True, window_size=(w, 0), backend="flash")
        close(out, dense_reference(q, k, v, causal=True, window=(w, 0))[0], device)
        direct = attnprof.attention(q, k, v, mask="sliding_window", window=w + 1, layout="bshd", backend="flash")
        assert torch.equal(out, direct)


def test_flash_attn_func_lse(device):
    q, k, v = bshd(2, 29, 7, 4, 2, 32, device)  # rows 0 .. 21 see no key
    out, lse, probs = attnprof.flash_attn_func(q, k, v, causal=True, return_attn_probs=True, backend="flash")
    want, want_lse = dense_reference(q, k, v, causal=True)
    assert probs is None
    assert lse.shape == (2, 4, 29) and lse.dtype == torch.float32 and not lse.requires_grad
    close(out, want, device)
    assert torch.isneginf(lse[:, :, :22]).all()
    torch.testing.assert_close(lse[:, :, 22:].cpu().double(), want_lse[:, :, 22:], atol=1e-4 if device == "cpu"
                               else 2e-2, rtol=1e-4)


def test_flash_attn_func_gradients(device):
    q, k, v = bshd(2, 20, 28, 4, 2, 32, device)
    for x in (q, k, v):
        x.requires_grad_(True)
    out = attnprof.flash_attn_func(q, k, v, causal=True, window_size=(6, 0))
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(4)).to(out)
    got = torch.autograd.grad(out, (q, k, v), dout)
    ref = [x.detach().cpu().double().requires_grad_() for x in (q, k, v)]
    want = torch.autograd.grad(dense_reference(*ref, causal=True, window=(6, 0))[0], ref, dout.cpu().double())
    for g, w in zip(got, want):
        close(g, w, device)


def test_flash_attn_func_refusals(device):
    q, k, v = bshd(1, 8, 8, 2, 2, 32, device)
    fa = attnprof.flash_attn_func
    one_line_error(lambda: fa(q, k, v, dropout_p=0.1), "flash_attn_func", "dropout_p")
    one_line_error(lambda: fa(q, k, v, alibi_slopes=torch.ones(2, device=device)), "alibi_slopes")
    one_line_error(lambda: fa(q, k, v, window_size=(2, 2)), "window_size=(2, 2)", "bidirectional")
    one_line_error(lambda: fa(q, k, v, window_size=(-1, 3)), "window_size=(-1, 3)", "right window")
    one_line_error(lambda: fa(q, k, v, window_size=(3, -1)), "window_size=(3, -1)", "no right bound")
    one_line_error(lambda: fa(q, k, v, softcap=-1.0), "softcap")
    with pytest.raises(attnprof.ArgumentTypeError, match="window_size"):
        fa(q, k, v, window_size=5)
    with pytest.raises(attnprof.ArgumentTypeError, match="causal"):
        fa(q, k, v, causal=None)


# ---- flash_attn_varlen_func


def varlen_reference(q, k, v, q_lens, k_lens, **band):
    """band_reference on each packed sequence: (out [total_q, H, D], lse [H, total_q])."""
    outs, lses, cq, ck = [], [], 0, 0
    for sq, sk in zip(q_lens, k_lens):
        o, l = band_reference(q[cq:cq + sq], k[ck:ck + sk], v[ck:ck + sk], **band)
        outs.append(o)
        lses.append(l)
        cq, ck = cq + sq, ck + sk
    return torch.cat(outs), torch.cat(lses, 1)


VARLEN_CASES = {"default": dict(), "causal": dict(causal=True), "window": dict(causal=True, window=(4, 0)),
                "softcap": dict(softcap=3.0)}


@pytest.mark.parametrize("case", VARLEN_CASES)
def test_flash_attn_varlen_func_matches_per_sequence(case, device):
    band = VARLEN_CASES[case]
    q_lens, k_lens = [5, 0, 17, 1, 9], [9, 0, 17, 30, 3]  # the last sequence's first 6 queries see no key if causal
    g = torch.Generator().manual_seed(7)
    # Head dim 64: flash's soft cap on a GPU is its sm90 kernels', built for 64 and up.
    q = randn(sum(q_lens), 4, 64, device=device, generator=g)
    k, v = (randn(sum(k_lens), 2, 64, device=device, generator=g) for _ in range(2))
    kw = dict(causal=band.get("causal", False), window_size=band.get("window", (-1, -1)),
              softcap=band.get("softcap", 0.0))
    args = (q, k, v, cumulative(q_lens, device), cumulative(k_lens, device), max(q_lens), max(k_lens))
    out = attnprof.flash_attn_varlen_func(*args, **kw, backend="flash")
    want, want_lse = varlen_reference(q, k, v, q_lens, k_lens, **band)
    assert out.shape == q.shape
    close(out, want, device)
    out2, lse, probs = attnprof.flash_attn_varlen_func(*args, **kw, return_attn_probs=True, backend="flash")
    assert probs is None and lse.shape == (4, sum(q_lens)) and lse.dtype == torch.float32
    close(out2, want, device)
    seen = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse).cpu(), seen)
    torch.testing.assert_close(lse.cpu().double()[seen], want_lse[seen], atol=1e-4 if device == "cpu" else 2e-2,
                               rtol=1e-4)


def test_flash_attn_varlen_func_gradients(device):
    q_lens, k_lens = [6, 11, 3], [9, 11, 14]
    g = torch.Generator().manual_seed(8)
    q = randn(sum(q_lens), 4, 32, device=device, generator=g).requires_grad_()
    k, v = (randn(sum(k_lens), 2, 32, device=device, generator=g).requires_grad_() for _ in range(2))
    out = attnprof.flash_attn_varlen_func(q, k, v, cumulative(q_lens, device), cumulative(k_lens, device),
                                          max(q_lens), max(k_lens), causal=True, window_size=(5, 0))
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(6)).to(out)
    got = torch.autograd.grad(out, (q, k, v), dout)
    ref = [x.detach().cpu().double().requires_grad_() for x in (q, k, v)]
    want = torch.autograd.grad(varlen_reference(*ref, q_lens, k_lens, causal=True, window=(5, 0))[0], ref,
                               dout.cpu().double())
    for got_one, want_one in zip(got, want):
        close(got_one, want_one, device)


def test_flash_attn_varlen_func_refusals(device):
    q = torch.zeros(4, 2, 32, device=device, dtype=dtype_of(device))
    cu = cumulative([4], device)
    fv = attnprof.flash_attn_varlen_func
    one_line_error(lambda: fv(q, q, q, cu, cu, 4, 4, dropout_p=0.5), "flash_attn_varlen_func", "dropout_p")
    one_line_error(lambda: fv(q, q, q, cu, cu, 4, 4, alibi_slopes=torch.ones(2)), "alibi_slopes")
    table = torch.zeros(1, 1, dtype=torch.int32, device=device)
    one_line_error(lambda: fv(q, q, q, cu, cu, 4, 4, block_table=table), "block_table")
    one_line_error(lambda: fv(q, q, q, cu, cu, 4, 4, window_size=(1, 1)), "window_size")


# ---- flash_attn_with_kvcache


def kvcache_reference(q, k_cache, v_cache, begins, ends, **band):
    """Sequence b reads cache rows begins[b] .. ends[b] - 1 with the band at its own bottom right: (out, lse)."""
    outs, lses = zip(*(band_reference(q[b], k_cache[b, begins[b]:ends[b]], v_cache[b, begins[b]:ends[b]], **band)
                       for b in range(q.shape[0])))
    return torch.stack(outs), torch.stack(lses)


KVCACHE_CASES = {
    "decode_default": (1, dict()),
    "decode_causal": (1, dict(causal=True)),
    "decode_window": (1, dict(causal=True, window=(6, 0))),
    "chunk_causal": (4, dict(causal=True)),  # sequence 2 has 3 keys: its first query sees none
    "chunk_window": (4, dict(window=(5, 0))),
}


@pytest.mark.parametrize("case", KVCACHE_CASES)
def test_flash_attn_with_kvcache_matches_documented_cache(case, device):
    sq, band = KVCACHE_CASES[case]
    kw = dict(causal=band.get("causal", False), window_size=band.get("window", (-1, -1)))
    q, k_cache, v_cache = bshd(3, sq, 40, 4, 2, 32, device, seed=11)
    lens = [40, 13, 3]
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    out = attnprof.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, num_splits=3, **kw,
                                           backend="flash")
    want, want_lse = kvcache_reference(q, k_cache, v_cache, [0, 0, 0], lens, **band)
    assert out.shape == q.shape
    close(out, want, device)
    # cache_leftpad: sequence b's keys start at leftpad[b].
    pads = [0, 5, 1]
    leftpad = torch.tensor(pads, dtype=torch.int32, device=device)
    out = attnprof.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, cache_leftpad=leftpad, **kw,
                                           backend="flash")
    close(out, kvcache_reference(q, k_cache, v_cache, pads, lens, **band)[0], device)
    # An int length is every sequence's; None is the whole cache.
    out = attnprof.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=21, **kw, backend="flash")
    close(out, kvcache_reference(q, k_cache, v_cache, [0] * 3, [21] * 3, **band)[0], device)
    out = attnprof.flash_attn_with_kvcache(q, k_cache, v_cache, **kw, backend="flash")
    close(out, kvcache_reference(q, k_cache, v_cache, [0] * 3, [40] * 3, **band)[0], device)
    # The log-sum-exp, [B, H, Sq] as flash_attn's softmax_lse.
    out, lse = attnprof.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, **kw,
                                                return_softmax_lse=True, backend="flash")
    close(out, want, device)
    assert lse.shape == (3, 4, sq) and lse.dtype == torch.float32
    seen = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse).cpu(), seen)
    torch.testing.assert_close(lse.cpu().double()[seen], want_lse[seen], atol=1e-4 if device == "cpu" else 2e-2,
                               rtol=1e-4)


def paged(k_cache, v_cache, page, seed=3):
    """flash_attn's paged cache [num_blocks, page, Hkv, D] holding the dense caches' rows on shuffled blocks (two
    spare), and the block table: a wrong table reads another sequence's keys."""
    batch, s_cache = k_cache.shape[:2]
    per_seq = s_cache // page
    blocks = batch * per_seq + 2
    order = torch.randperm(blocks, generator=torch.Generator().manual_seed(seed))[:batch * per_seq]
    table = order.view(batch, per_seq).to(torch.int32)
    kp = torch.zeros(blocks, page, *k_cache.shape[2:], dtype=k_cache.dtype, device=k_cache.device)
    vp = torch.zeros_like(kp)
    kp[order.to(k_cache.device)] = k_cache.reshape(batch * per_seq, page, *k_cache.shape[2:])
    vp[order.to(k_cache.device)] = v_cache.reshape(batch * per_seq, page, *v_cache.shape[2:])
    return kp, vp, table.to(k_cache.device)


@pytest.mark.parametrize("case", KVCACHE_CASES)
def test_flash_attn_with_kvcache_paged_table(case, device):
    sq, band = KVCACHE_CASES[case]
    kw = dict(causal=band.get("causal", False), window_size=band.get("window", (-1, -1)))
    q, k_cache, v_cache = bshd(3, sq, 48, 4, 2, 64, device, seed=12)  # a GPU's paged decode: head dim 64, 128, 256
    kp, vp, table = paged(k_cache, v_cache, page=16)
    lens = [48, 20, 3]
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    out = attnprof.flash_attn_with_kvcache(q, kp, vp, cache_seqlens=seqlens, block_table=table, **kw,
                                           backend="flash")
    assert out.shape == q.shape
    close(out, kvcache_reference(q, k_cache, v_cache, [0] * 3, lens, **band)[0], device)
    # No cache_seqlens: each sequence's whole table.
    out = attnprof.flash_attn_with_kvcache(q, kp, vp, block_table=table, **kw, backend="flash")
    close(out, kvcache_reference(q, k_cache, v_cache, [0] * 3, [48] * 3, **band)[0], device)


def test_flash_attn_with_kvcache_refusals(device):
    q, k_cache, v_cache = bshd(2, 1, 16, 2, 2, 32, device)
    kp, vp, table = paged(k_cache, v_cache, page=8)
    lens = torch.tensor([16, 4], dtype=torch.int32, device=device)
    kv = attnprof.flash_attn_with_kvcache
    fn = "flash_attn_with_kvcache"
    one_line_error(lambda: kv(q, k_cache, v_cache, k=k_cache[:, :1], v=v_cache[:, :1]), fn, "k=", "append")
    one_line_error(lambda: kv(q, k_cache, v_cache, v=v_cache[:, :1]), "v=")
    one_line_error(lambda: kv(q, k_cache, v_cache, rotary_cos=torch.ones(16, 16)), "rotary_cos")
    one_line_error(lambda: kv(q, k_cache, v_cache, rotary_sin=torch.ones(16, 16)), "rotary_sin")
    one_line_error(lambda: kv(q, k_cache, v_cache, cache_batch_idx=lens), "cache_batch_idx")
    one_line_error(lambda: kv(q, k_cache, v_cache, alibi_slopes=torch.ones(2)), "alibi_slopes")
    one_line_error(lambda: kv(q, kp, vp, block_table=table, cache_leftpad=lens * 0), "cache_leftpad", "block_table")
    one_line_error(lambda: kv(q, kp, vp, block_table=table, return_softmax_lse=True), "return_softmax_lse",
                   "C++ paged path")
    one_line_error(lambda: kv(q, k_cache, v_cache, cache_seqlens=lens.long()), "cache_seqlens", "int32")
    one_line_error(lambda: kv(q, k_cache, v_cache, cache_seqlens=lens[:1]), "cache_seqlens", "[2]")
    # A length past the cache, a begin past its end: on the CPU the library's refusal, named by the caller's
    # argument; on a GPU the lengths are read by the kernels only (no host read in the default path), which clamp
    # them: the call runs.
    bad = [(lambda: kv(q, k_cache, v_cache, cache_seqlens=17), ("cache_seqlens", "kv_rows[0] = (0, 17)")),
           (lambda: kv(q, k_cache, v_cache, cache_seqlens=lens, cache_leftpad=lens + 1), ("cache_leftpad",)),
           (lambda: kv(q, kp, vp, block_table=table, cache_seqlens=lens + 9), ("cache_seqlens", "seq_lens"))]
    for call, words in bad:
        if device == "cpu":
            one_line_error(call, *words)
        else:
            assert torch.isfinite(call()).all()
    # With one query the diagonal is each sequence's last key, so a right window reaches nothing: two queries.
    q2 = torch.cat((q, q), 1)
    one_line_error(lambda: kv(q2, k_cache, v_cache, window_size=(2, 2)), "window_size=(2, 2)", "bidirectional")
    with pytest.raises(attnprof.ArgumentTypeError, match="num_splits"):
        kv(q, k_cache, v_cache, num_splits=1.5)
