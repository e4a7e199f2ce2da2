"""attnprof on torch CPU tensors: the eager call, torch.ops.attnprof.attention (-> (out, lse)), torch.compile."""

import pytest
import torch

import attnprof
from attnprof import _core

torch.manual_seed(0)


def qkv(shape=(2, 4, 64, 32), kv_shape=None, dtype=torch.float32, device="cpu"):
    kv_shape = kv_shape or shape
    return (torch.randn(shape, dtype=dtype, device=device), torch.randn(kv_shape, dtype=dtype, device=device),
            torch.randn(kv_shape, dtype=dtype, device=device))


def sdpa(q, k, v, causal=True, **kw):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    return torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal,
                                                            **kw).to(q.dtype)


@pytest.mark.parametrize("backend", ["naive", "math", "flash", "auto"])
def test_eager_matches_sdpa(backend):
    q, k, v = qkv()
    out = attnprof.attention(q, k, v, backend=backend)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape and out.dtype == q.dtype
    torch.testing.assert_close(out, sdpa(q, k, v), atol=2e-5, rtol=1e-4)


def test_bf16_grouped_heads_and_scale():
    q, k, v = qkv((1, 8, 64, 64), (1, 2, 64, 64), dtype=torch.bfloat16)
    out = attnprof.attention(q, k, v, backend="flash", mask="none", scale=0.2)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), sdpa(q, k, v, causal=False, scale=0.2).float(), atol=2e-2, rtol=2e-2)


def test_no_copy_data_pointers():
    q, k, v = qkv()
    out = torch.empty_like(q)
    views = _core._views(q, k, v, out, False)
    assert [p for p, _, _ in views] == [t.data_ptr() for t in (q, k, v, out)]
    assert [tuple(s) for _, _, s in views] == [t.stride() for t in (q, k, v, out)]
    assert attnprof.attention(q, k, v, backend="flash", out=out) is out
    torch.testing.assert_close(out, sdpa(q, k, v), atol=2e-5, rtol=1e-4)


def test_bshd_views():
    b, s, h, d = 2, 48, 4, 32
    qs, ks, vs = qkv((b, s, h, d))
    q, k, v = (t.transpose(1, 2) for t in (qs, ks, vs))  # [B, H, S, D] views of [B, S, H, D] buffers
    views = _core._views(q, k, v, torch.empty(q.shape), False)
    assert views[0][0] == qs.data_ptr() and tuple(views[0][2]) == q.stride()
    ref = sdpa(q, k, v)
    for backend in ("naive_inplace", "math", "flash"):
        torch.testing.assert_close(attnprof.attention(q, k, v, backend=backend), ref, atol=2e-5, rtol=1e-4)
    out = attnprof.attention(qs, ks, vs, backend="flash", layout="bshd")
    assert out.shape == (b, s, h, d)
    torch.testing.assert_close(out.transpose(1, 2), ref, atol=2e-5, rtol=1e-4)
    op, lse = torch.ops.attnprof.attention(qs, ks, vs, "flash", "causal", None, None, True)
    assert lse.shape == (0,)  # kept only where asked for
    torch.testing.assert_close(op.transpose(1, 2), ref, atol=2e-5, rtol=1e-4)


def test_custom_op_is_registered_and_runs():
    ops = attnprof.torch_ops()
    assert hasattr(ops, "attention")
    q, k, v = qkv()
    out, _ = torch.ops.attnprof.attention(q, k, v, "flash", "causal", None, None, False)
    torch.testing.assert_close(out, sdpa(q, k, v), atol=2e-5, rtol=1e-4)
    torch.library.opcheck(torch.ops.attnprof.attention.default, (q, k, v, "math", "causal", None, None, False),
                          test_utils=("test_schema", "test_faketensor"))
    # The forward that keeps the log-sum-exp, its fake and its autograd (the backward op) checked by torch.
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    torch.library.opcheck(torch.ops.attnprof.attention.default, (qg, kg, vg, "flash", "causal"),
                          {"return_lse": True}, test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))
    out, lse = torch.ops.attnprof.attention(q, k, v, "flash", "causal", None, None, False, None, None, None, None,
                                            None, None, None, None, None, None, None, None, None, False, True)
    torch.library.opcheck(torch.ops.attnprof.attention_backward.default,
                          (torch.ones_like(out), q, k, v, out, lse, "flash", "causal"),
                          test_utils=("test_schema", "test_faketensor"))


def test_fake_gives_the_output_shape():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q, k, v = qkv((2, 4, 128, 64), (2, 1, 256, 64), dtype=torch.bfloat16)
        out, lse = torch.ops.attnprof.attention(q, k, v)
        assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous()
        assert lse.shape == (0,) and lse.dtype == torch.float32
        out, lse = torch.ops.attnprof.attention(q, k, v, return_lse=True)
        assert lse.shape == (2, 4, 128) and lse.dtype == torch.float32
        out, lse = torch.ops.attnprof.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), bshd=True,
                                                return_lse=True)
        assert lse.shape == (2, 4, 128)
        qp, kp = torch.empty(100, 4, 64, dtype=torch.bfloat16), torch.empty(120, 1, 64, dtype=torch.bfloat16)
        cu_q, cu_k = torch.tensor([0, 40, 100], dtype=torch.int32), torch.tensor([0, 60, 120], dtype=torch.int32)
        out, lse = torch.ops.attnprof.attention(qp, kp, kp, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, return_lse=True)
        assert out.shape == qp.shape and lse.shape == (4, 100)


def _graph_breaks(fn, *args):
    explanation = torch._dynamo.explain(fn)(*args)
    return explanation.graph_break_count, explanation.graph_count


def test_torch_compile_fullgraph_on_cpu():
    attnprof.torch_ops()  # registers torch.ops.attnprof, which `layer` calls, when this test runs alone
    q, k, v = qkv()

    def layer(q, k, v):
        return torch.ops.attnprof.attention(q * 0.5, k, v, "flash", "causal", None, None, False)[0] + 1.0

    def through_api(q, k, v):
        return attnprof.attention(q, k, v, backend="math") * 2.0

    torch._dynamo.reset()
    assert _graph_breaks(layer, q, k, v) == (0, 1)
    assert _graph_breaks(through_api, q, k, v) == (0, 1)
    compiled = torch.compile(layer, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), sdpa(q * 0.5, k, v) + 1.0, atol=2e-5, rtol=1e-4)
    compiled_api = torch.compile(through_api, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled_api(q, k, v), sdpa(q, k, v) * 2.0, atol=2e-5, rtol=1e-4)


def sdpa_grads(q, k, v, dout, causal=True):
    """dQ, dK, dV of PyTorch's SDPA in float64 (grouped-query by repeating K and V)."""
    q, k, v = (x.detach().double().requires_grad_() for x in (q, k, v))
    out = sdpa(q, k, v, causal)
    return torch.autograd.grad(out, (q, k, v), dout.double())


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_autograd_matches_sdpa(kv_heads):
    q, k, v = qkv((2, 4, 64, 32), (2, kv_heads, 64, 32))
    for x in (q, k, v):
        x.requires_grad_(True)
    out = attnprof.attention(q, k, v, backend="flash")
    assert out.requires_grad and out.grad_fn is not None
    dout = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), dout)
    for g, want, name in zip(got, sdpa_grads(q, k, v, dout), ("dq", "dk", "dv")):
        assert g.shape == want.shape, name
        torch.testing.assert_close(g.double(), want, atol=1e-4, rtol=1e-4, msg=name)


def test_autograd_under_torch_compile():
    q, k, v = qkv()
    for x in (q, k, v):
        x.requires_grad_(True)

    def loss(q, k, v):
        return (attnprof.attention(q, k, v, backend="flash") ** 2).sum()

    torch._dynamo.reset()
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    got = torch.autograd.grad(compiled(q, k, v), (q, k, v))
    want = torch.autograd.grad(loss(q, k, v), (q, k, v))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_backward_refusals_are_clear():
    q, k, v = qkv()
    q.requires_grad_(True)
    # A composite keeps the probabilities: autograd through attnprof takes the recomputing backends.
    with pytest.raises(attnprof.Error, match=r"naive keeps the \[S, Skv\] probabilities"):
        attnprof.attention(q, k, v, backend="naive")
    # The op without return_lse keeps no log-sum-exp: it runs forward and refuses a backward, naming the way.
    out, _ = torch.ops.attnprof.attention(q, k, v)
    assert out.requires_grad
    with pytest.raises(attnprof.Error, match=r"only with return_lse=True"):
        out.sum().backward()
    # Without grad, tensors that need grad are read as they are.
    with torch.no_grad():
        torch.testing.assert_close(attnprof.attention(q, k, v, backend="flash"), sdpa(q.detach(), k, v), atol=2e-5,
                                   rtol=1e-4)


# issue 19 item 6: the plan cache keyed by shape, mask and backend alone (not the pass, deterministic or the
# KV cache), so a backward after a forward of the same shape reused the forward's plan: its eligibility,
# and auto's pick, were never checked for the backward.
def test_a_backward_is_planned_as_a_backward_not_as_the_forward_before_it():
    attnprof.torch_ops()
    q, k, v = qkv((1, 2, 48, 32))
    attnprof.attention(q, k, v, backend="naive")  # planned for inference: naive runs a forward
    out, lse = torch.ops.attnprof.attention(q, k, v, "flash", return_lse=True)
    # The same refusal, in the same words, as a training call with naive meets.
    with pytest.raises(attnprof.Error, match=r"^naive keeps the \[S, Skv\] probabilities") as train:
        torch.ops.attnprof.attention(q, k, v, "naive", return_lse=True)
    with pytest.raises(attnprof.Error, match=r"^naive keeps the \[S, Skv\] probabilities") as backward:
        torch.ops.attnprof.attention_backward(torch.ones_like(out), q, k, v, out, lse, "naive")
    assert str(train.value) == str(backward.value)


def test_auto_resolves_per_pass():
    # A forward's auto may pick a composite; a training step's must pick a backend that keeps only the
    # log-sum-exp (flash, on the CPU), whatever the forward of the same shape picked.
    q, k, v = qkv((1, 2, 40, 32))
    torch.testing.assert_close(attnprof.attention(q, k, v, backend="auto"), sdpa(q, k, v), atol=2e-5, rtol=1e-4)
    qg = q.clone().requires_grad_(True)
    out = attnprof.attention(qg, k, v, backend="auto")
    dout = torch.randn_like(out)
    (dq,) = torch.autograd.grad(out, (qg,), dout)
    torch.testing.assert_close(dq.double(), sdpa_grads(q, k, v, dout)[0], atol=1e-4, rtol=1e-4)


def test_negated_views_outs_needing_grad_and_lse_from_a_probabilities_backend_are_refused_in_one_line():
    """torch's negative bit (a lazily negated view, as .conj().imag makes one) is lost through DLPack: such a q or
    mask is refused by name (it was read as the opposite values), an out= that requires grad is refused as torch's
    out= functions refuse it, and return_lse on a backend that keeps probabilities says so, not "autograd"."""
    q, k, v = qkv((1, 2, 8, 16))
    mask = (torch.randn(8, 8, dtype=torch.complex64) * 3).conj().imag
    assert mask.is_neg()
    for kwargs, name in (({"attn_mask": mask}, "attn_mask"), ({}, "q")):
        qq = torch._neg_view(q) if name == "q" else q
        for call in (attnprof.attention, attnprof.scaled_dot_product_attention):
            with pytest.raises(attnprof.Error) as e:
                call(qq, k, v, **kwargs)
            assert str(e.value) == (f"{name} is a lazily negated view (torch's negative bit, as .conj().imag makes "
                                    f"one), which DLPack cannot carry: pass {name}.resolve_neg()")
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(attnprof.attention(q, k, v, attn_mask=mask.resolve_neg()), want, atol=2e-5, rtol=1e-4)
    with pytest.raises(attnprof.Error, match=r"^out requires grad, and autograd does not record a write into out="):
        attnprof.attention(q, k, v, out=torch.empty_like(q).requires_grad_())
    for backend in ("naive", "math"):
        with pytest.raises(attnprof.Error) as e:
            attnprof.attention(q, k, v, backend=backend, return_lse=True)
        assert str(e.value).startswith(f"{backend} keeps the [S, Skv] probabilities, not their log-sum-exp: "
                                       "return_lse and autograd through attnprof take a backend")


def test_the_checking_mode_is_marked_as_dynamo_marks_a_constant():
    """attnprof marks its constants for torch.compile with the attribute torch.compiler.assume_constant_result sets,
    without calling it (it imports torch._dynamo: 1.4 s on import): if torch marks otherwise, this fails."""
    from attnprof import _key_padding

    def probe():
        return True

    torch.compiler.assume_constant_result(probe)
    marks = vars(probe)
    assert marks, "assume_constant_result set no attribute"
    for marked in (_key_padding.checking_inputs, attnprof._torch_ready):
        assert {name: getattr(marked, name, None) for name in marks} == marks, marked
