"""The drop-in entry points (issue 56 item 4): attnprof.scaled_dot_product_attention against torch's own, and
flash_attn_func, flash_attn_varlen_func and flash_attn_with_kvcache against flash_attn's documented semantics
computed by hand in float64 (the bottom-right diagonal, windows, each packed sequence, a cache's lengths and a
paged table); each signature's defaults (no mask for all four), grouped-query heads, the log-sum-exp, and each
refusal in one line naming the argument. Every comparison runs on the CPU and, where there is one, on a CUDA GPU
(the cuda cases are skipped with the reason otherwise, as test_gpu.py's)."""

import inspect

import pytest

torch = pytest.importorskip("torch")

import attnprof  # noqa: E402

F = torch.nn.functional

GPU = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine (run on the GPU machine)"),
    pytest.mark.skipif(not attnprof.cuda_built(), reason="this attnprof build has no CUDA backends"),
]
DEVICES = ["cpu", pytest.param("cuda", marks=GPU)]


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


def dtype_of(device):
    # The CPU checks float32 closely; flash's CUDA kernels take 16-bit inputs.
    return torch.float32 if device == "cpu" else torch.bfloat16


def close(got, want, device):
    tol = dict(atol=3e-5, rtol=1e-4) if device == "cpu" else dict(atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(got.detach().cpu().double(), want.detach().cpu().double(), **tol)


def randn(*shape, device, dtype=None, generator=None):
    return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype or dtype_of(device))


def one_line_error(call, *words):
    """The call is refused by an attnprof.Error of one line that names every word given."""
    with pytest.raises(attnprof.Error) as e:
        call()
    text = str(e.value)
    assert "\n" not in text, text
    for w in words:
        assert w in text, (w, text)
    return text


# ---- flash_attn's documented semantics, by hand


def band_reference(q, k, v, *, causal=False, window=(-1, -1), scale=None, softcap=0.0):
    """One sequence, float64, q [Sq, H, D], k and v [Sk, Hkv, D], as flash_attn's docstring defines it: the
    causal mask is aligned to the bottom right (j <= i + Sk - Sq); window (left, right) keeps keys j with
    i + Sk - Sq - left <= j <= i + Sk - Sq + right, a negative side unbounded; softcap c > 0 is tanh(s / c) * c of
    the scaled scores; query head h reads key head h // (H / Hkv). A row that sees no key is zero (its lse -inf).
    Returns (out [Sq, H, D], lse [H, Sq])."""
    q, k, v = (x.cpu().double() for x in (q, k, v))  # float64 leaves pass through: the gradient tests' reference
    sq, heads, dim = q.shape
    sk, group = k.shape[0], heads // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scale = dim ** -0.5 if scale is None else scale
    s = torch.einsum("ihd,jhd->hij", q, k) * scale
    if softcap > 0:
        s = torch.tanh(s / softcap) * softcap
    i, j = torch.arange(sq)[:, None], torch.arange(sk)[None, :]
    diagonal = i + sk - sq
    keep = torch.ones(sq, sk, dtype=torch.bool)
    if causal:
        keep &= j <= diagonal
    if window[0] >= 0:
        keep &= j >= diagonal - window[0]
    if window[1] >= 0:
        keep &= j <= diagonal + window[1]
    s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return torch.einsum("hij,jhd->ihd", p, v), lse


def dense_reference(q, k, v, **band):
    """band_reference per batch entry of [B, Sq, H, D] / [B, Sk, Hkv, D]: (out [B, Sq, H, D], lse [B, H, Sq])."""
    outs, lses = zip(*(band_reference(q[b], k[b], v[b], **band) for b in range(q.shape[0])))
    return torch.stack(outs), torch.stack(lses)


def bshd(batch, sq, sk, heads, kv_heads, dim, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (randn(batch, sq, heads, dim, device=device, generator=g),
            randn(batch, sk, kv_heads, dim, device=device, generator=g),
            randn(batch, sk, kv_heads, dim, device=device, generator=g))


def test_entry_points_are_exported_with_their_sources_signatures():
    want = {
        "scaled_dot_product_attention": [("query", inspect.Parameter.empty), ("key", inspect.Parameter.empty),
                                         ("value", inspect.Parameter.empty), ("attn_mask", None), ("dropout_p", 0.0),
                                         ("is_causal", False), ("*", None), ("scale", None), ("enable_gqa", False)],
        "flash_attn_func": [("q", inspect.Parameter.empty), ("k", inspect.Parameter.empty),
                            ("v", inspect.Parameter.empty), ("dropout_p", 0.0), ("softmax_scale", None),
                            ("causal", False), ("window_size", (-1, -1)), ("softcap", 0.0), ("alibi_slopes", None),
                            ("deterministic", False), ("return_attn_probs", False)],
        "flash_attn_varlen_func": [("q", inspect.Parameter.empty), ("k", inspect.Parameter.empty),
                                   ("v", inspect.Parameter.empty), ("cu_seqlens_q", inspect.Parameter.empty),
                                   ("cu_seqlens_k", inspect.Parameter.empty),
                                   ("max_seqlen_q", inspect.Parameter.empty),
                                   ("max_seqlen_k", inspect.Parameter.empty), ("dropout_p", 0.0),
                                   ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)),
                                   ("softcap", 0.0), ("alibi_slopes", None), ("deterministic", False),
                                   ("return_attn_probs", False), ("block_table", None)],
        "flash_attn_with_kvcache": [("q", inspect.Parameter.empty), ("k_cache", inspect.Parameter.empty),
                                    ("v_cache", inspect.Parameter.empty), ("k", None), ("v", None),
                                    ("rotary_cos", None), ("rotary_sin", None), ("cache_seqlens", None),
                                    ("cache_batch_idx", None), ("cache_leftpad", None), ("block_table", None),
                                    ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)),
                                    ("softcap", 0.0), ("rotary_interleaved", True), ("alibi_slopes", None),
                                    ("num_splits", 0), ("return_softmax_lse", False)],
    }
    for name, params in want.items():
        assert name in attnprof.__all__
        sig = inspect.signature(getattr(attnprof, name))
        star = params.index(("*", None)) if ("*", None) in params else len(params)
        positional = [(p.name, p.default) for p in sig.parameters.values() if p.kind != p.KEYWORD_ONLY]
        keyword = [(p.name, p.default) for p in sig.parameters.values() if p.kind == p.KEYWORD_ONLY]
        assert positional == params[:star], name
        # The one addition, backend, is keyword-only and last: a call means what it means in the source.
        assert keyword == params[star + 1:] + [("backend", "auto")], name


# ---- scaled_dot_product_attention


def bhsd(batch, heads, kv_heads, sq, sk, dim, device, seed=1, dtype=None):
    g = torch.Generator().manual_seed(seed)
    return (randn(batch, heads, sq, dim, device=device, dtype=dtype, generator=g),
            randn(batch, kv_heads, sk, dim, device=device, dtype=dtype, generator=g),
            randn(batch, kv_heads, sk, dim, device=device, dtype=dtype, generator=g))


def torch_sdpa(q, k, v, **kw):
    """torch's own SDPA in float64 on the CPU (its math path), the mask moved alongside."""
    mask = kw.pop("attn_mask", None)
    if mask is not None:
        mask = mask.cpu() if mask.dtype == torch.bool else mask.cpu().double()
    return F.scaled_dot_product_attention(*(x.detach().cpu().double() for x in (q, k, v)), attn_mask=mask, **kw)


SDPA_CASES = {
    "default": (dict(sq=24, sk=24), {}),
    "causal": (dict(sq=24, sk=24), dict(is_causal=True)),
    "causal_top_left_short_q": (dict(sq=9, sk=30), dict(is_causal=True)),
    "causal_top_left_long_q": (dict(sq=30, sk=9), dict(is_causal=True)),
    "scale": (dict(sq=16, sk=20), dict(scale=0.3)),
    "gqa": (dict(sq=16, sk=20, kv_heads=2), dict(enable_gqa=True)),
    "one_kv_head_broadcast": (dict(sq=16, sk=20, kv_heads=1), {}),
}


@pytest.mark.parametrize("case", SDPA_CASES)
def test_sdpa_matches_torch(case, device):
    shape, kw = SDPA_CASES[case]
    q, k, v = bhsd(2, 4, shape.get("kv_heads", 4), shape["sq"], shape["sk"], 32, device)
    out = attnprof.scaled_dot_product_attention(q, k, v, **kw)
    assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device
    close(out, torch_sdpa(q, k, v, **kw), device)


def test_sdpa_masks_match_torch(device):
    q, k, v = bhsd(2, 4, 2, 20, 28, 32, device)
    g = torch.Generator().manual_seed(5)
    boolean = torch.rand(2, 4, 20, 28, generator=g) > 0.4
    boolean[..., 0] = True  # every row sees a key: torch and attnprof agree on empty rows only on some paths
    additive = torch.randn(20, 28, generator=g)  # [L, S]: broadcast over batch and heads
    padding = torch.ones(2, 1, 1, 28, dtype=torch.bool)
    padding[1, ..., 17:] = False  # right padding of the keys
    for mask in (boolean, additive.to(q.dtype), padding):
        mask = mask.to(device)
        out = attnprof.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        close(out, torch_sdpa(q, k, v, attn_mask=mask, enable_gqa=True), device)
    # A key-padding mask is the mask alone, as torch's: a padded query still attends to the real keys (made
    # into rows beside a mask name it would be zero).
    q2, k2, v2 = bhsd(2, 4, 4, 28, 28, 32, device)
    padding = padding.to(device)
    out = attnprof.scaled_dot_product_attention(q2, k2, v2, attn_mask=padding)
    assert out[1, :, 17:].abs().sum() > 0
    close(out, torch_sdpa(q2, k2, v2, attn_mask=padding), device)


def test_sdpa_float_mask_of_another_dtype_is_cast_as_torch_takes_it(device):
    q, k, v = bhsd(1, 2, 2, 16, 16, 32, device, dtype=torch.bfloat16)
    additive = torch.randn(16, 16, generator=torch.Generator().manual_seed(9)).to(device)  # float32 beside bf16
    out = attnprof.scaled_dot_product_attention(q, k, v, attn_mask=additive)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.cpu().double(), torch_sdpa(q, k, v, attn_mask=additive.bfloat16()), atol=2e-2,
                               rtol=2e-2)


def test_sdpa_unbatched_inputs(device):
    q, k, v = (x[0] for x in bhsd(1, 4, 4, 12, 18, 32, device))
    out = attnprof.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert out.shape == q.shape
    close(out, torch_sdpa(q, k, v, is_causal=True), device)


def test_sdpa_gradients_match_torch(device):
    q, k, v = bhsd(2, 4, 2, 24, 24, 32, device)
    for x in (q, k, v):
        x.requires_grad_(True)
    out = attnprof.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(out)
    got = torch.autograd.grad(out, (q, k, v), dout)
    ref = [x.detach().cpu().double().requires_grad_() for x in (q, k, v)]
    want = torch.autograd.grad(F.scaled_dot_product_attention(*ref, is_causal=True, enable_gqa=True), ref,
                               dout.cpu().double())
    for g, w in zip(got, want):
        close(g, w, device)


def test_sdpa_refusals(device):
    q, k, v = bhsd(1, 4, 2, 8, 8, 32, device)
    sdpa = attnprof.scaled_dot_product_attention
    one_line_error(lambda: sdpa(q, k, v, dropout_p=0.1, enable_gqa=True), "dropout_p", "scaled_dot_product_attention")
    mask = torch.ones(8, 8, dtype=torch.bool, device=device)
    one_line_error(lambda: sdpa(q, q, q, attn_mask=mask, is_causal=True), "attn_mask", "is_causal")
    one_line_error(lambda: sdpa(q, k, v), "enable_gqa", "4 heads", "key 2")
    one_line_error(lambda: sdpa(q[0], k, v, enable_gqa=True), "key", "3-d")


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


def cumulative(lens, device):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=device)


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
    q = randn(sum(q_lens), 4, 32, device=device, generator=g)
    k, v = (randn(sum(k_lens), 2, 32, device=device, generator=g) for _ in range(2))
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
    q, k_cache, v_cache = bshd(3, sq, 48, 4, 2, 32, device, seed=12)
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
    # A length past the cache: the library's refusal, named by the caller's argument.
    one_line_error(lambda: kv(q, k_cache, v_cache, cache_seqlens=17), "cache_seqlens", "kv_rows[0] = (0, 17)")
    one_line_error(lambda: kv(q, k_cache, v_cache, cache_seqlens=lens, cache_leftpad=lens + 1), "cache_leftpad")
    one_line_error(lambda: kv(q, kp, vp, block_table=table, cache_seqlens=lens + 9), "cache_seqlens", "seq_lens")
    # With one query the diagonal is each sequence's last key, so a right window reaches nothing: two queries.
    q2 = torch.cat((q, q), 1)
    one_line_error(lambda: kv(q2, k_cache, v_cache, window_size=(2, 2)), "window_size=(2, 2)", "bidirectional")
    with pytest.raises(attnprof.ArgumentTypeError, match="num_splits"):
        kv(q, k_cache, v_cache, num_splits=1.5)


# ---- The defaults: no mask for all four


def test_defaults_are_no_mask(device):
    """Each entry point called with its required arguments alone attends to every key (a causal default, as
    attnprof.attention's mask=None, would differ: the check below sees it)."""
    q, k, v = bshd(2, 12, 12, 4, 2, 32, device, seed=21)
    full, _ = dense_reference(q, k, v)
    causal, _ = dense_reference(q, k, v, causal=True)
    assert (full - causal).abs().max() > 0.1
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
    close(attnprof.scaled_dot_product_attention(qh, kh.repeat_interleave(2, 1), vh.repeat_interleave(2, 1))
          .transpose(1, 2), full, device)
    close(attnprof.flash_attn_func(q, k, v), full, device)
    cu = cumulative([12, 12], device)
    out = attnprof.flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu, 12, 12)
    close(out.view_as(q), full, device)
    close(attnprof.flash_attn_with_kvcache(q, k, v), full, device)


def test_entry_points_trace_whole_under_torch_compile(device):
    """fullgraph=True: the mapping (the band, the cache's rows made with torch ops, the lse op) breaks no graph."""
    q, k, v = bshd(2, 8, 16, 4, 2, 32, device, seed=31)
    seqlens = torch.tensor([16, 5], dtype=torch.int32, device=device)
    cu_q, cu_k = cumulative([8, 8], device), cumulative([16, 16], device)
    calls = {
        "sdpa": lambda q, k, v: attnprof.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True),
        "flash_attn_func": lambda q, k, v: attnprof.flash_attn_func(q, k, v, causal=True, window_size=(4, 0)),
        "flash_attn_func_lse": lambda q, k, v: attnprof.flash_attn_func(q, k, v, causal=True,
                                                                        return_attn_probs=True)[1],
        "flash_attn_varlen_func": lambda q, k, v: attnprof.flash_attn_varlen_func(
            q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu_q, cu_k, 8, 16, causal=True),
        "flash_attn_with_kvcache": lambda q, k, v: attnprof.flash_attn_with_kvcache(
            q[:, :1], k, v, cache_seqlens=seqlens, causal=True),
    }
    for name, call in calls.items():
        torch._dynamo.reset()
        got = torch.compile(call, fullgraph=True, backend="eager")(q, k, v)
        assert torch.equal(got, call(q, k, v)), name
