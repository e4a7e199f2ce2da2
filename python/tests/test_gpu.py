"""CUDA tensors: the caller's current stream, no copies, torch.compile. Skipped, with the reason, without a GPU."""

import pytest

torch = pytest.importorskip("torch")

import attnprof  # noqa: E402
from attnprof import _core  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine (run on the GPU machine)"),
    pytest.mark.skipif(not attnprof.cuda_built(), reason="this attnprof build has no CUDA backends"),
]


def qkv(shape=(2, 8, 256, 64), kv_shape=None, dtype=torch.bfloat16):
    kv_shape = kv_shape or shape
    return (torch.randn(shape, dtype=dtype, device="cuda"), torch.randn(kv_shape, dtype=dtype, device="cuda"),
            torch.randn(kv_shape, dtype=dtype, device="cuda"))


def sdpa(q, k, v):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    return torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)


@pytest.mark.parametrize("backend", ["naive", "math", "efficient", "flash", "cudnn", "auto"])
def test_cuda_backends_match_sdpa(backend):
    q, k, v = qkv()
    if backend not in attnprof.explain(batch=2, heads=8, seq=256, head_dim=64, device="cuda").eligible() + ["auto"]:
        pytest.skip(f"{backend} is not eligible on this GPU")
    out = attnprof.attention(q, k, v, backend=backend)
    assert out.is_cuda and out.dtype == torch.bfloat16 and out.shape == q.shape
    torch.testing.assert_close(out.float(), sdpa(q, k, v), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("backend", ["efficient", "flash", "cudnn"])
@pytest.mark.parametrize("kv_heads", [8, 2])
def test_cuda_autograd_matches_sdpa(backend, kv_heads):
    """Gradients through attnprof's own backward, on the current stream, against PyTorch's in FP32."""
    q, k, v = qkv((2, 8, 256, 64), (2, kv_heads, 256, 64))
    for x in (q, k, v):
        x.requires_grad_(True)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        out = attnprof.attention(q, k, v, backend=backend)
        dout = torch.randn_like(out)
        got = torch.autograd.grad(out, (q, k, v), dout)
    side.synchronize()
    ref = [x.detach().float().requires_grad_() for x in (q, k, v)]
    want = torch.autograd.grad(sdpa(*ref), ref, dout.float())
    for g, w, name in zip(got, want, ("dq", "dk", "dv")):
        assert g.dtype == torch.bfloat16 and g.shape == w.shape, name
        torch.testing.assert_close(g.float(), w, atol=3e-2, rtol=3e-2, msg=name)


def test_cuda_autograd_under_torch_compile():
    q, k, v = qkv()
    for x in (q, k, v):
        x.requires_grad_(True)

    def loss(q, k, v):
        return attnprof.attention(q, k, v, backend="flash").float().square().sum()

    torch._dynamo.reset()
    got = torch.autograd.grad(torch.compile(loss, fullgraph=True)(q, k, v), (q, k, v))
    want = torch.autograd.grad(loss(q, k, v), (q, k, v))
    for g, w in zip(got, want):
        torch.testing.assert_close(g.float(), w.float(), atol=2e-2, rtol=2e-2)


def test_no_copy_on_cuda():
    q, k, v = qkv()
    out = torch.empty_like(q)
    views = _core._views(q, k, v, out, False)
    assert [p for p, _, _ in views] == [t.data_ptr() for t in (q, k, v, out)]
    assert attnprof.attention(q, k, v, backend="flash", out=out) is out
    qs = torch.randn(2, 256, 8, 64, dtype=torch.bfloat16, device="cuda")
    assert _core._views(qs.transpose(1, 2), k, v, out, False)[0][0] == qs.data_ptr()


def test_runs_on_the_current_stream():
    # q is written on a side stream after a long sleep; attention called on that
    # stream must see the write. Run anywhere else, it would read the zeros.
    q0, k, v = qkv()
    q = torch.zeros_like(q0)
    attnprof.attention(q0, k, v, backend="flash")  # the runtime and the backend made, outside the timing
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(1_000_000_000)  # about half a second of GPU time
        q.copy_(q0)
        out = attnprof.attention(q, k, v, backend="flash")
    assert not side.query(), "the side stream finished while the sleep should still hold it"
    side.synchronize()
    torch.testing.assert_close(out.float(), sdpa(q0, k, v), atol=2e-2, rtol=2e-2)
    # The op reads the stream the same way.
    with torch.cuda.stream(side):
        torch.cuda._sleep(1_000_000_000)
        q.zero_()
        q.copy_(q0)
        out, _ = torch.ops.attnprof.attention(q, k, v, "flash", "causal", None, None, False)
    side.synchronize()
    torch.testing.assert_close(out.float(), sdpa(q0, k, v), atol=2e-2, rtol=2e-2)


def test_torch_compile_on_cuda():
    q, k, v = qkv()

    def layer(q, k, v):
        return torch.ops.attnprof.attention(q, k, v, "flash", "causal", None, None, False)[0] * 2

    torch._dynamo.reset()
    explanation = torch._dynamo.explain(layer)(q, k, v)
    assert explanation.graph_break_count == 0
    compiled = torch.compile(layer, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v).float(), sdpa(q, k, v) * 2, atol=4e-2, rtol=2e-2)


def test_key_padding_without_a_mask_name_on_cuda_flash_compiles_whole_and_trains():
    """SDPA's call with a key-padding mask on flash: lowered to kv_rows on the device inside the compiled graph (the
    checking mode read as a constant of the trace, nothing read on the host), forward and gradients as SDPA's."""
    q, k, v = (t.requires_grad_() for t in qkv())
    pad = torch.arange(256, device="cuda")[None, None, None, :] < torch.tensor([256, 77], device="cuda")[:, None, None,
                                                                                                         None]

    dout = torch.randn(q.shape, device="cuda")

    def loss(q, k, v, m):
        return (attnprof.attention(q, k, v, backend="flash", attn_mask=m).float() * dout).sum()

    torch._dynamo.reset()
    got = torch.autograd.grad(torch.compile(loss, fullgraph=True)(q, k, v, pad), (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=pad)
    want = torch.autograd.grad((ref * dout).sum(), (q, k, v))
    for a, b in zip(got, want):
        torch.testing.assert_close(a.float(), b.float(), atol=5e-2, rtol=5e-2)


def test_bshd_on_cuda():
    qs, ks, vs = qkv((2, 256, 8, 64))
    out = attnprof.attention(qs, ks, vs, backend="flash", layout="bshd")
    ref = sdpa(qs.transpose(1, 2), ks.transpose(1, 2), vs.transpose(1, 2))
    torch.testing.assert_close(out.transpose(1, 2).float(), ref, atol=2e-2, rtol=2e-2)


def test_mismatched_devices_and_nothing_left_allocated():
    q, k, v = qkv()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    lib_before = _core.allocated_bytes("cuda")
    with pytest.raises(attnprof.Error, match=r"different devices"):
        attnprof.attention(q, k.cpu(), v)
    with pytest.raises(attnprof.Error, match=r"is float64"):
        attnprof.attention(q.double(), k.double(), v.double())
    with pytest.raises(attnprof.Error, match=r"keeps the \[S, Skv\] probabilities"):
        attnprof.attention(q.requires_grad_(True), k, v, backend="math")
    assert torch.cuda.memory_allocated() == before
    assert _core.allocated_bytes("cuda") == lib_before


def test_cuda_masks_and_paged_caches():
    """attn_mask on CUDA: a bias reaches cudnn; flash takes a key-padding mask with no mask name as key rows
    (lowered on the device) and, in the checking mode, refuses any other boolean mask by name. A paged cache from
    Python on flash and cudnn, equal lengths."""
    q, k, v = qkv((2, 8, 128, 64))
    bias = torch.randn(2, 1, 128, 128, dtype=torch.bfloat16, device="cuda")
    group = 1
    want = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=bias.float())
    eligible = attnprof.explain(batch=2, heads=8, seq=128, head_dim=64, device="cuda", mask="bias").eligible()
    for backend in ("cudnn", "math"):
        if backend in eligible:
            got = attnprof.attention(q, k, v, backend=backend, attn_mask=bias)
            torch.testing.assert_close(got.float(), want, atol=3e-2, rtol=3e-2)
    pad = torch.arange(128, device="cuda")[None, None, None, :] < torch.tensor([128, 50], device="cuda")[:, None, None,
                                                                                                          None]
    want = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=pad)
    # Key padding with no mask name, as SDPA is called: lowered to kv_rows on the device (attnprof/_key_padding.py).
    got = attnprof.attention(q, k, v, backend="flash", attn_mask=pad)
    torch.testing.assert_close(got.float(), want, atol=3e-2, rtol=3e-2)
    holed = pad.clone()
    holed[..., 7] = False  # not one run of Trues: not key padding
    # A CUDA mask is not read on the host by default (stream order); the checking mode reads it and refuses a hole.
    with pytest.raises(attnprof.Error, match=r"^attn_mask row 0 is not one run of Trues: flash on cuda:0 reads a "
                                             r"boolean attn_mask only as key padding"):
        attnprof.attention(q, k, v, backend="flash", attn_mask=holed, check_inputs=True)
    # Backends that read mask tensors take it as the whole mask.
    if "cudnn" in attnprof.explain(batch=2, heads=8, seq=128, head_dim=64, device="cuda", mask="boolean").eligible():
        want = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=holed)
        got = attnprof.attention(q, k, v, backend="cudnn", attn_mask=holed)
        torch.testing.assert_close(got.float(), want, atol=3e-2, rtol=3e-2)
    del group
    # Paged decode: 2 sequences of 64 keys in pages of 16.
    qd = torch.randn(2, 8, 1, 64, dtype=torch.bfloat16, device="cuda")
    kc = torch.randn(8, 8, 16, 64, dtype=torch.bfloat16, device="cuda")
    vc = torch.randn(8, 8, 16, 64, dtype=torch.bfloat16, device="cuda")
    table = torch.tensor([[3, 0, 6, 1], [2, 7, 5, 4]], dtype=torch.int32, device="cuda")
    lens = torch.tensor([64, 64], dtype=torch.int32, device="cuda")
    kl = kc[table.long()].permute(0, 2, 1, 3, 4).reshape(2, 8, 64, 64)
    vl = vc[table.long()].permute(0, 2, 1, 3, 4).reshape(2, 8, 64, 64)
    want = torch.nn.functional.scaled_dot_product_attention(qd.float(), kl.float(), vl.float())
    for backend in ("flash", "cudnn"):
        got = attnprof.attention(qd, kc, vc, block_table=table, seq_lens=lens, mask="none", backend=backend)
        torch.testing.assert_close(got.float(), want, atol=3e-2, rtol=3e-2)
    # Unequal lengths: read by the kernels on the device, each sequence over its own keys.
    for backend in ("flash", "cudnn"):
        got = attnprof.attention(qd, kc, vc, block_table=table, seq_lens=torch.tensor([64, 30], dtype=torch.int32,
                                                                                      device="cuda"), mask="none",
                                 backend=backend)
        want = torch.nn.functional.scaled_dot_product_attention(qd[1:].float(), kl[1:, :, :30].float(),
                                                                vl[1:, :, :30].float())
        torch.testing.assert_close(got[1:].float(), want, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("backend", ["efficient", "flash", "cudnn"])
def test_cuda_call_cache_reads_each_calls_tensors_and_stream(backend):
    """The call cache on CUDA tensors: a hit reads the tensors it is given (new buffers of one shape), writes into the
    out it is given, on the stream current at that call; a CPU k after a cached all-CUDA call is still refused."""
    if backend not in attnprof.explain(batch=2, heads=8, seq=256, head_dim=64, device="cuda").eligible():
        pytest.skip(f"{backend} is not eligible on this GPU")
    entries = None
    side = torch.cuda.Stream()
    for i in range(3):
        q, k, v = qkv()
        out = torch.empty_like(q)
        with torch.cuda.stream(side if i % 2 else torch.cuda.current_stream()):
            assert attnprof.attention(q, k, v, backend=backend, out=out) is out
        torch.cuda.synchronize()
        torch.testing.assert_close(out.float(), sdpa(q, k, v), atol=2e-2, rtol=2e-2)
        if entries is None:
            entries = _core._cache_entries()
        assert _core._cache_entries() == entries  # the same key each time: a hit
    with pytest.raises(attnprof.Error, match=r"different devices"):
        attnprof.attention(q, k.cpu(), v, backend=backend, out=out)
    with pytest.raises(attnprof.Error, match=r"q is bf16 but out is fp16"):
        attnprof.attention(q, k, v, backend=backend, out=out.half())
    assert _core._cache_entries() == entries


def test_cuda_flash_varlen_and_softcap_match_torch():
    """flash's sm90 kernels on a packed batch (forward and autograd) against per-sequence SDPA in float32, and a
    soft cap against Gemma-2's formula."""
    if "flash" not in attnprof.explain(batch=2, heads=4, seq=256, head_dim=128, device="cuda",
                                       seq_lens=[100, 156]).eligible():
        pytest.skip("flash's sm90 kernels need an sm90 GPU")
    lens = [100, 1, 300, 55]
    cu = torch.tensor([0] + list(__import__("itertools").accumulate(lens)), dtype=torch.int32, device="cuda")
    total = int(cu[-1])
    q = torch.randn(total, 8, 128, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    k = torch.randn(total, 2, 128, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    v = torch.randn(total, 2, 128, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    got = attnprof.attention(q, k, v, backend="flash", mask="causal", cu_seqlens_q=cu, cu_seqlens_k=cu,
                             max_seqlen_q=max(lens), max_seqlen_k=max(lens))
    got.float().square().sum().backward()
    outs = []
    for b, n in enumerate(lens):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        qs, ks, vs = (x.detach()[rows].float().transpose(0, 1).requires_grad_() for x in (q, k, v))
        o = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
        o.square().sum().backward()
        outs.append((rows, o.transpose(0, 1), qs.grad.transpose(0, 1), ks.grad.transpose(0, 1),
                     vs.grad.transpose(0, 1)))
    for rows, o, dq, dk, dv in outs:
        torch.testing.assert_close(got[rows].float(), o, atol=3e-2, rtol=3e-2)
        for mine, want in ((q.grad, dq), (k.grad, dk), (v.grad, dv)):
            scale = want.abs().max().clamp(min=1.0)
            assert (mine[rows].float() - want).abs().max() <= 2e-2 * scale
    # Soft cap 5 on scores scaled up so that it bends them.
    qd, kd, vd = (torch.randn(2, 4, 256, 128, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    s = (qd.float() @ kd.float().transpose(-1, -2)) * 0.5
    s = torch.tanh(s / 5.0) * 5.0
    want = torch.softmax(s, dim=-1) @ vd.float()
    got = attnprof.attention(qd, kd, vd, backend="flash", mask="none", scale=0.5, softcap=5.0)
    torch.testing.assert_close(got.float(), want, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("backend", ["flash", "cudnn"])
@pytest.mark.parametrize("mask", ["none", "causal"])
def test_cuda_fp8_matches_sdpa_on_the_dequantized_inputs(backend, mask):
    """float8_e4m3fn q, k, v with their descales on flash's and cudnn's FP8 kernels: bf16 out, within
    e4m3's P rounding (relative L2 under 0.05) of SDPA in float32 on the dequantized values."""
    torch = pytest.importorskip("torch")
    if backend not in attnprof.explain(batch=2, heads=4, seq=512, head_dim=128, device="cuda", dtype="fp8",
                                       mask=mask).eligible():
        pytest.skip(f"{backend} takes no fp8 here (needs an sm90 GPU)")
    real = [torch.randn(2, 4, 512, 128, device="cuda") * s for s in (1.5, 1.5, 1.0)]
    (q8, qs), (k8, ks), (v8, vs) = (attnprof.quantize_fp8(t) for t in real)
    got = attnprof.attention(q8, k8, v8, backend=backend, mask=mask, q_descale=qs, k_descale=ks, v_descale=vs)
    assert got.dtype == torch.bfloat16
    want = torch.nn.functional.scaled_dot_product_attention(q8.float() * qs, k8.float() * ks, v8.float() * vs,
                                                            is_causal=mask == "causal")
    rel = float((got.float() - want).norm() / want.norm())
    assert rel < 0.05, rel
    with pytest.raises(attnprof.Error, match="descale"):
        attnprof.attention(q8, k8, v8, backend=backend, mask=mask, q_descale=0.0, k_descale=ks, v_descale=vs)
