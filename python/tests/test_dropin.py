"""The drop-in entry points (issue 56 item 4): attnprof.scaled_dot_product_attention against torch's own; each
signature's defaults (no mask for all four) and every entry point traced whole under torch.compile. Here too the
helpers the drop-in tests share: flash_attn's documented semantics computed by hand in float64 (the bottom-right
diagonal, windows, the soft cap, grouped-query heads), and one-line refusals. flash_attn_func,
flash_attn_varlen_func and flash_attn_with_kvcache against those semantics are test_dropin_flash_attn.py. Every
comparison runs on the CPU and, where there is one, on a CUDA GPU (the cuda cases are skipped with the reason
otherwise, as test_gpu.py's)."""

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


def cumulative(lens, device):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=device)


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
