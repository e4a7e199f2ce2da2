"""torch.ops.attnprof as its ecosystem writes it (issue 56 item 4): one forward op returning (out, lse) with its
autograd, one backward op, dense, padded rows, packed and paged in one schema; attention(return_lse=True);
attention(window=(left, right)). CPU tensors here; the same ops run on CUDA (test_gpu.py)."""

import numpy as np
import pytest
import torch

import attnprof
from attnprof import _options

torch.manual_seed(0)


def qkv(shape=(2, 4, 24, 16), kv_shape=None, dtype=torch.float32):
    kv_shape = kv_shape or shape
    return torch.randn(shape, dtype=dtype), torch.randn(kv_shape, dtype=dtype), torch.randn(kv_shape, dtype=dtype)


def scores(q, k, band):
    """Scaled scores of [B, H, S, D] q and k with keys outside `band(i, j)` at -inf, in float64."""
    s = (q.double() @ k.double().transpose(-1, -2)) / q.shape[-1] ** 0.5
    i = torch.arange(q.shape[2])[:, None]
    j = torch.arange(k.shape[2])[None, :]
    return s.masked_fill(~band(i, j), float("-inf"))


def reference(q, k, v, band):
    """(out, lse) of the band in float64."""
    s = scores(q, k, band)
    return torch.softmax(s, -1) @ v.double(), torch.logsumexp(s, -1)


def test_two_ops_and_their_schemas_from_one_table():
    ops = attnprof.torch_ops()
    names = {name for name in dir(ops) if not name.startswith("_") and isinstance(getattr(ops, name),
                                                                                   torch._ops.OpOverloadPacket)}
    assert names == {"attention", "attention_backward"}, names
    forward = str(ops.attention.default._schema)
    backward = str(ops.attention_backward.default._schema)
    assert forward.endswith("bool return_lse=False) -> (Tensor, Tensor)")
    assert backward.endswith("-> (Tensor, Tensor, Tensor)")
    for name in _options.NAMES:  # every option in both, in the table's order
        assert f" {name}=" in forward and f" {name}=" in backward
    # Each option is taken by some call of the library (a name in the table no binding reads would be dropped).
    for name in _options.NAMES:
        assert any(name in takes for takes in _options._TAKES.values()), name


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_return_lse_dense(layout):
    q, k, v = qkv()
    out_ref, lse_ref = reference(q, k, v, lambda i, j: j <= i)
    args = (q, k, v) if layout == "bhsd" else tuple(t.transpose(1, 2) for t in (q, k, v))
    out, lse = attnprof.attention(*args, backend="flash", layout=layout, return_lse=True)
    if layout == "bshd":
        out = out.transpose(1, 2)
    assert lse.shape == (2, 4, 24) and lse.dtype == torch.float32
    torch.testing.assert_close(out, out_ref.to(out.dtype), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(lse.double(), lse_ref, atol=1e-5, rtol=1e-5)
    # return_lse=False gives the same out, alone.
    torch.testing.assert_close(attnprof.attention(*args, backend="flash", layout=layout), out if layout == "bhsd"
                               else out.transpose(1, 2))


def test_return_lse_on_numpy_arrays():
    q, k, v = qkv(dtype=torch.float32)
    out, lse = attnprof.attention(q.numpy(), k.numpy(), v.numpy(), backend="flash", mask="none", return_lse=True)
    assert isinstance(out, np.ndarray) and isinstance(lse, np.ndarray) and lse.shape == (2, 4, 24)
    _, lse_ref = reference(q, k, v, lambda i, j: j >= 0)
    np.testing.assert_allclose(lse, lse_ref.numpy(), atol=1e-5, rtol=1e-5)


def test_return_lse_rows_and_packed():
    q, k, v = qkv((2, 4, 24, 16), dtype=torch.float32)
    # Padded rows: sequence 1 has 10 queries and keys.
    rows = torch.tensor([[0, 24], [0, 10]], dtype=torch.int32)
    out, lse = attnprof.attention(q, k, v, backend="flash", q_rows=rows, kv_rows=rows, return_lse=True)
    _, lse0 = reference(q[:1], k[:1], v[:1], lambda i, j: j <= i)
    _, lse1 = reference(q[1:, :, :10], k[1:, :, :10], v[1:, :, :10], lambda i, j: j <= i)
    torch.testing.assert_close(lse[0].double(), lse0[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse[1, :, :10].double(), lse1[0], atol=1e-5, rtol=1e-5)
    # Packed: the two sequences [24, 10] as one [34, H, D] batch; lse [H, total_q], as flash_attn's varlen.
    qp = torch.cat((q[0].transpose(0, 1), q[1, :, :10].transpose(0, 1)))
    kp = torch.cat((k[0].transpose(0, 1), k[1, :, :10].transpose(0, 1)))
    vp = torch.cat((v[0].transpose(0, 1), v[1, :, :10].transpose(0, 1)))
    cu = torch.tensor([0, 24, 34], dtype=torch.int32)
    out_p, lse_p = attnprof.attention(qp, kp, vp, backend="flash", cu_seqlens_q=cu, cu_seqlens_k=cu,
                                      return_lse=True)
    assert lse_p.shape == (4, 34)
    torch.testing.assert_close(lse_p[:, :24].double(), lse0[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse_p[:, 24:].double(), lse1[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_p[24:], out[1, :, :10].transpose(0, 1), atol=1e-6, rtol=1e-6)


def test_return_lse_with_gradients():
    q, k, v = qkv(dtype=torch.float32)
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    out, lse = attnprof.attention(qg, kg, vg, backend="flash", return_lse=True)
    assert out.requires_grad and not lse.requires_grad  # the log-sum-exp carries no gradient
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (qg, kg, vg), dout)
    q2, k2, v2 = (t.clone().requires_grad_(True) for t in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(q2.double(), k2.double(), v2.double(), is_causal=True)
    expected = torch.autograd.grad(ref, (q2, k2, v2), dout.double())
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_lse_is_refused_where_no_forward_keeps_one():
    q, k, v = qkv(dtype=torch.float32)
    with pytest.raises(attnprof.Error, match=r"^naive keeps the \[S, Skv\] probabilities"):
        attnprof.attention(q, k, v, backend="naive", return_lse=True)
    cache = torch.randn(4, 4, 8, 16)
    table = torch.arange(4, dtype=torch.int32).reshape(1, 4)
    with pytest.raises(attnprof.Error, match=r"^block_table is not taken by a forward that keeps the log-sum-exp"):
        attnprof.attention(q[:1], cache, cache, backend="flash", block_table=table,
                           seq_lens=torch.tensor([20], dtype=torch.int32), return_lse=True)
    with pytest.raises(attnprof.ArgumentTypeError, match=r"return_lse must be True or False"):
        attnprof.attention(q, k, v, return_lse=1)


def test_fakes_are_exact():
    """Every layout's fake gives the real op's outputs: shape, dtype, strides (torch.compile plans with them)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k, v = qkv((2, 4, 24, 16), dtype=torch.float32)
    rows = torch.tensor([[0, 24], [0, 10]], dtype=torch.int32)
    qp, kp = torch.randn(34, 4, 16), torch.randn(34, 2, 16)
    cu = torch.tensor([0, 24, 34], dtype=torch.int32)
    calls = [
        ((q, k, v), {}),
        ((q, k, v), {"return_lse": True}),
        ((q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)), {"bshd": True, "return_lse": True}),
        ((q, k, v), {"q_rows": rows, "kv_rows": rows, "return_lse": True}),
        ((qp, kp, kp), {"cu_seqlens_q": cu, "cu_seqlens_k": cu}),
        ((qp, kp, kp), {"cu_seqlens_q": cu, "cu_seqlens_k": cu, "return_lse": True}),
    ]
    mode = FakeTensorMode()

    def faked(x):
        return mode.from_tensor(x) if isinstance(x, torch.Tensor) else x

    def same(real, fake, what):
        for r, f in zip(real, fake):
            assert (r.shape, r.dtype, r.stride()) == (f.shape, f.dtype, f.stride()), (what, r.shape, f.shape)

    for args, kwargs in calls:
        real = torch.ops.attnprof.attention(*args, "flash", **kwargs)
        with mode:
            fake = torch.ops.attnprof.attention(*map(faked, args), "flash", **{n: faked(t) for n, t in kwargs.items()})
        same(real, fake, kwargs)
        if kwargs.pop("return_lse", False):  # the backward of a forward that kept its log-sum-exp
            grads_in = (torch.ones_like(real[0]), *args, *real)
            real_grads = torch.ops.attnprof.attention_backward(*grads_in, "flash", **kwargs)
            with mode:
                fake_grads = torch.ops.attnprof.attention_backward(*map(faked, grads_in), "flash",
                                                                   **{n: faked(t) for n, t in kwargs.items()})
            same(real_grads, fake_grads, ("backward", kwargs))


def test_compiled_training_step_with_lse_traces_whole():
    q, k, v = qkv((1, 2, 16, 16), dtype=torch.float32)
    qp, kp = torch.randn(20, 2, 16), torch.randn(20, 2, 16)
    cu = torch.tensor([0, 12, 20], dtype=torch.int32)

    def step(q, k, v, qp, kp):
        out, lse = attnprof.attention(q, k, v, backend="flash", window=(3, 0), return_lse=True)
        packed = attnprof.attention(qp, kp, kp, backend="flash", cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=12,
                                    max_seqlen_k=12)
        return out.sum() + lse.sum() + packed.sum()

    torch._dynamo.reset()
    args = [t.clone().requires_grad_(True) for t in (q, k, v, qp, kp)]
    explanation = torch._dynamo.explain(step)(*args)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    loss = compiled(*args)
    grads = torch.autograd.grad(loss, args)
    eager_args = [t.detach().clone().requires_grad_(True) for t in args]
    eager = step(*eager_args)
    torch.testing.assert_close(loss, eager)
    for g, e in zip(grads, torch.autograd.grad(eager, eager_args)):
        torch.testing.assert_close(g, e)


def test_packed_lengths_rewritten_after_the_forward_are_refused():
    # issue 57 item 3, for the packed layout: the cumulative lengths are saved with their version counters.
    qp = torch.randn(20, 2, 16, requires_grad=True)
    cu = torch.tensor([0, 12, 20], dtype=torch.int32)
    out = attnprof.attention(qp, qp, qp, backend="flash", cu_seqlens_q=cu, cu_seqlens_k=cu)
    cu[1] = 8  # the forward ran with sequences of 12 and 8: a backward of 8 and 12 would be another call's
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


# ---- window=(left, right)

@pytest.mark.parametrize("window,mask,band", [
    ((-1, 0), None, lambda i, j, off: j <= i + off),
    ((-1, -1), None, lambda i, j, off: j >= 0),
    ((3, 0), None, lambda i, j, off: (j <= i + off) & (j >= i + off - 3)),
    ((0, 0), None, lambda i, j, off: j == i + off),
    ((-1, 0), "causal", lambda i, j, off: j <= i),
    ((-1, 0), "causal_bottom_right", lambda i, j, off: j <= i + off),
])
@pytest.mark.parametrize("arrays", ["torch", "numpy"])
def test_window_band(window, mask, band, arrays):
    q, k, v = qkv((1, 2, 12, 16), (1, 2, 20, 16), dtype=torch.float32)
    want, _ = reference(q, k, v, lambda i, j: band(i, j, 20 - 12))
    args = (q, k, v) if arrays == "torch" else (q.numpy(), k.numpy(), v.numpy())
    out = attnprof.attention(*args, backend="flash", mask=mask, window=window)
    torch.testing.assert_close(torch.as_tensor(out).double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window,mask,message", [
    ((3, 2), None, r"^window=\(3, 2\) reaches up to 2 keys past the diagonal: a bidirectional band"),
    ((-1, 4), None, r"^window=\(-1, 4\) reaches up to 4 keys past the diagonal"),
    ((2, -1), None, r"^window=\(2, -1\) reaches every key past the diagonal"),
    ((3, 0), "causal", r"^window=\(3, 0\) with mask='causal': attnprof's sliding window ends at the bottom-right"),
    ((3, 0), "sliding_window", r"^mask='sliding_window' with window=\(left, right\): the band is the mask"),
    ((-2, 0), None, r"^window=\(-2, 0\): each side is a number of keys, or -1 for unbounded"),
])
def test_window_band_refusals(window, mask, message):
    q, k, v = qkv((1, 2, 12, 16), dtype=torch.float32)
    with pytest.raises(attnprof.Error, match=message):
        attnprof.attention(q, k, v, backend="flash", mask=mask, window=window)


def test_window_band_types():
    q, k, v = qkv((1, 2, 12, 16), dtype=torch.float32)
    for window, message in (((1, 2, 3), r"window must be a number of keys or \(left, right\)"),
                            ((1.5, 0), r"window\[0\] must be a whole number"),
                            ((0, True), r"window\[1\] must be a whole number")):
        with pytest.raises(attnprof.ArgumentTypeError, match=message):
            attnprof.attention(q, k, v, backend="flash", window=window)


# ---- CUDA: the same ops on the GPU (skipped, with the reason, without one; scripts/gpu.sh python runs them).

GPU = [pytest.mark.gpu,
       pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine (run on the GPU machine)"),
       pytest.mark.skipif(not attnprof.cuda_built(), reason="this attnprof build has no CUDA backends")]


@pytest.mark.parametrize("backend", ["flash", "cudnn", "efficient"])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("_", [pytest.param(None, marks=GPU)])
def test_return_lse_on_cuda(backend, packed, _):
    """(out, lse) on a side stream, dense and packed, against float64 on the same GPU; the fake's shapes equal
    the real ones; gradients through the op that kept its lse."""
    torch.manual_seed(1)
    if packed and backend == "efficient":
        pytest.skip("efficient refuses a packed batch by name (test_varlen.py)")
    q, k, v = (torch.randn(2, 4, 128, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    band = lambda i, j: (j <= i).to(q.device)  # noqa: E731
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())  # q, k and v were made on the current stream
    with torch.cuda.stream(side):
        if packed:
            flat = [t.transpose(1, 2).reshape(256, 4, 64) for t in (q, k, v)]
            cu = torch.tensor([0, 128, 256], dtype=torch.int32, device="cuda")
            out, lse = attnprof.attention(*flat, backend=backend, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=128,
                                          max_seqlen_k=128, return_lse=True)
            out = out.reshape(2, 128, 4, 64).transpose(1, 2)
            lse = lse.reshape(4, 2, 128).transpose(0, 1)
        else:
            out, lse = attnprof.attention(q, k, v, backend=backend, return_lse=True)
    side.synchronize()
    s = (q.double() @ k.double().transpose(-1, -2)) / 8.0
    s = s.masked_fill(~band(torch.arange(128, device="cuda")[:, None], torch.arange(128, device="cuda")[None, :]),
                      float("-inf"))
    assert lse.dtype == torch.float32 and lse.shape == (2, 4, 128)
    torch.testing.assert_close(lse.double(), torch.logsumexp(s, -1), atol=2e-2, rtol=2e-3)
    torch.testing.assert_close(out.double(), torch.softmax(s, -1) @ v.double(), atol=2e-2, rtol=2e-2)
    if not packed:
        qg = q.clone().requires_grad_(True)
        out_g, _ = attnprof.attention(qg, k, v, backend=backend, return_lse=True)
        (dq,) = torch.autograd.grad(out_g.float().sum(), (qg,))
        ref = q.double().requires_grad_(True)
        (want,) = torch.autograd.grad((torch.softmax(((ref @ k.double().transpose(-1, -2)) / 8.0).masked_fill(
            ~band(torch.arange(128, device="cuda")[:, None], torch.arange(128, device="cuda")[None, :]),
            float("-inf")), -1) @ v.double()).sum(), (ref,))
        torch.testing.assert_close(dq.double(), want, atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("_", [pytest.param(None, marks=GPU)])
def test_compiled_lse_on_cuda(_):
    q, k, v = (torch.randn(1, 4, 128, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))

    def f(q, k, v):
        out, lse = attnprof.attention(q, k, v, backend="flash", window=(31, 0), return_lse=True)
        return out.float().sum(-1) + lse

    torch._dynamo.reset()
    assert torch._dynamo.explain(f)(q, k, v).graph_break_count == 0
    torch.testing.assert_close(torch.compile(f, fullgraph=True)(q, k, v), f(q, k, v))


def test_plan_takes_the_band_as_attention_does():
    q, k, v = qkv((1, 2, 12, 16), (1, 2, 20, 16))
    plan = attnprof.plan(q, k, v, backend="flash", window=(3, 0), threads=1)
    assert torch.equal(plan.run(q, k, v), attnprof.attention(q, k, v, backend="flash", window=(3, 0), threads=1))
    with pytest.raises(attnprof.Error, match=r"^window=\(3, 2\) reaches up to 2 keys past the diagonal"):
        attnprof.plan(q, k, v, backend="flash", window=(3, 2))
