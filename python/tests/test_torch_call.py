"""attnprof._torch_call, torch tensors' fast path into attention() (src/bindings/torch_call.cpp, issue 22 item 6): it
is built wherever the build's Python imports torch, and taken for the torch it was built against. Through it a call
gives the DLPack path's output bit for bit, allocates `out` as that path does, refuses bad input in the same words,
and hands what it does not read (autograd, numpy, mask tensors) to the general path."""

from pathlib import Path

import numpy as np
import pytest
import torch

import attnprof
from attnprof import _torch

from test_errors import CASES

torch.manual_seed(0)


@pytest.fixture
def dlpack_path():
    """Runs the block with the fast path off; restored after."""
    def run(fn):
        _torch._use_fast(False)
        try:
            return fn()
        finally:
            _torch._use_fast(True)
    return run


def test_the_fast_path_is_built_and_taken():
    built = list(Path(attnprof.__file__).parent.glob("_torch_call*"))
    if not built:  # a wheel built in pip's isolated environment, which has no torch to build against
        pytest.skip(f"this attnprof was built without torch, so calls take {_torch.fast_path}")
    assert _torch.fast_path.startswith("attnprof._torch_call"), _torch.fast_path
    assert _torch._fast is not None


def test_a_build_for_another_torch_is_not_taken(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "0.0.1")
    fast, why = _torch._load_fast()
    assert fast is None
    assert "built against torch" in why and "0.0.1" in why and "rebuild" in why


CALLS = {
    "flash causal": dict(backend="flash", mask="causal"),
    "naive none, scale": dict(backend="naive", mask="none", scale=0.3),
    "math window": dict(backend="math", mask="sliding_window", window=5),
    "flash bottom-right, grouped heads": dict(backend="flash", mask="causal_bottom_right", kv_heads=2),
    "flash soft cap": dict(backend="flash", mask="causal", softcap=2.0),
    "bshd": dict(backend="flash", mask="causal", layout="bshd"),
    "bf16": dict(backend="flash", mask="none", dtype=torch.bfloat16),
    "threads": dict(backend="flash", mask="causal", threads=1),
    "auto": dict(backend="auto", mask="causal"),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_outputs_equal_the_dlpack_paths_bit_for_bit(name, dlpack_path):
    kw = dict(CALLS[name])
    dtype = kw.pop("dtype", torch.float32)
    kv_heads = kw.pop("kv_heads", 4)
    bshd = kw.get("layout") == "bshd"
    shape = (2, 4, 37, 16) if not bshd else (2, 37, 4, 16)
    kv_shape = (2, kv_heads, 45, 16) if not bshd else (2, 45, kv_heads, 16)
    q = torch.randn(shape, dtype=dtype)
    k, v = torch.randn(kv_shape, dtype=dtype), torch.randn(kv_shape, dtype=dtype)
    got = attnprof.attention(q, k, v, **kw)  # out allocated by the fast path
    want = dlpack_path(lambda: attnprof.attention(q, k, v, **kw))
    assert got.dtype == want.dtype and got.shape == want.shape and got.is_contiguous()
    assert torch.equal(got, want), name
    out = torch.full_like(q, float("nan"))
    assert attnprof.attention(q, k, v, out=out, **kw) is out  # written in place, no copy
    assert torch.equal(out, want), name


def test_strided_views_are_read_where_they_are(dlpack_path):
    base = torch.randn(2, 30, 4, 32)
    q, k, v = (base[..., i * 8:(i + 1) * 8].transpose(1, 2) for i in range(3))  # head_dim contiguous, others strided
    out = torch.empty(2, 4, 30, 8).transpose(0, 1).contiguous().transpose(0, 1)  # a permuted output
    got = attnprof.attention(q, k, v, backend="flash", out=out)
    assert got is out
    want = dlpack_path(lambda: attnprof.attention(q, k, v, backend="flash"))
    assert torch.equal(out, want)


# numpy's cases as torch tensors (torch.from_numpy keeps the strides); not the mask tensors' (the general
# path's) nor negative strides (torch has none: a flip copies).
@pytest.mark.parametrize("case", [c for c in CASES if "attn_mask" not in c and c != "negative strides"])
def test_bad_input_is_refused_in_the_same_words(case, dlpack_path):
    make, kwargs, message = CASES[case]
    q, k, v = (torch.from_numpy(x) for x in make())
    with pytest.raises(attnprof.Error) as fast:
        attnprof.attention(q, k, v, **kwargs)
    with pytest.raises(attnprof.Error) as general:
        dlpack_path(lambda: attnprof.attention(q, k, v, **kwargs))
    assert str(fast.value) == str(general.value)
    assert "\n" not in str(fast.value)


def test_what_it_does_not_read_takes_the_general_path():
    q, k, v = (torch.randn(1, 2, 24, 16, requires_grad=True) for _ in range(3))
    out = attnprof.attention(q, k, v, backend="flash")
    assert out.grad_fn is not None  # autograd: attnprof's backward
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
    with torch.no_grad():
        assert attnprof.attention(q, k, v, backend="flash").grad_fn is None  # under no_grad: the fast path
    mask = torch.ones(24, 24, dtype=torch.bool).tril()
    a = attnprof.attention(q.detach(), k.detach(), v.detach(), backend="naive", attn_mask=mask)
    b = attnprof.attention(q.detach(), k.detach(), v.detach(), backend="naive", mask="causal")
    assert torch.allclose(a, b)
    class Sub(torch.Tensor):  # a subclass may mean something else by its data: the general path's
        pass

    qs, ks, vs = (x.detach().as_subclass(Sub) for x in (q, k, v))
    plain = attnprof.attention(q.detach(), k.detach(), v.detach(), backend="flash")
    assert torch.equal(attnprof.attention(qs, ks, vs, backend="flash"), plain)
    meta = torch.empty(1, 2, 24, 16, device="meta")
    with pytest.raises(attnprof.Error):  # no storage to read: the general path refuses it in its words
        attnprof.attention(meta, meta, meta, backend="flash")
    with pytest.raises(attnprof.Error, match="q is a torch tensor but k is ndarray"):
        attnprof.attention(q.detach(), k.detach().numpy(), v.detach(), backend="flash")
    with pytest.raises(attnprof.Error):
        attnprof.attention(q.detach().double(), k.detach().double(), v.detach().double(), backend="flash")


def _index_calls():
    """A paged cache (block table, lengths) and a padded batch (rows), each as attention() takes it on the CPU."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(3, 4, 1, 16, generator=g)
    k_pages, v_pages = (torch.randn(9, 2, 8, 16, generator=g) for _ in range(2))
    table = torch.randperm(9, generator=g)[:6].view(3, 2).to(torch.int32)
    paged = (q, k_pages, v_pages, dict(backend="flash", mask="causal_bottom_right", block_table=table,
                                       seq_lens=torch.tensor([16, 5, 1], dtype=torch.int32)))
    qp, kp, vp = (torch.randn(3, 4, 20, 16, generator=g) for _ in range(3))
    rows = (qp, kp, vp, dict(backend="flash", mask="causal", q_rows=torch.tensor([[0, 20], [2, 9], [5, 5]],
                                                                                dtype=torch.int32),
                             kv_rows=torch.tensor([[20], [9], [7]], dtype=torch.int32)))
    return {"paged": paged, "rows": rows}


@pytest.mark.parametrize("name", ["paged", "rows"])
def test_index_arrays_take_the_fast_path_and_equal_the_dlpack_path(name, dlpack_path, monkeypatch):
    if _torch._fast is None:
        pytest.skip(f"this attnprof was built without its torch extension: calls take {_torch.fast_path}")
    q, k, v, kw = _index_calls()[name]
    want = dlpack_path(lambda: attnprof.attention(q, k, v, **kw))
    answers = []
    fast = _torch._fast
    monkeypatch.setattr(_torch, "_fast", lambda *a, **o: answers.append(fast(*a, **o)) or answers[-1])
    out = torch.full_like(q, float("nan"))
    assert attnprof.attention(q, k, v, out=out, **kw) is out
    assert len(answers) == 1 and answers[0] is out  # taken by the fast path, written in place
    assert torch.equal(out, want), name
    # An index array this path does not read (int64, a list) goes to the general path, which answers as it would.
    for key in ("seq_lens", "kv_rows"):
        if key in kw:
            for other in (kw[key].long(), kw[key].tolist()):
                bad = dict(kw, **{key: other})
                with pytest.raises(attnprof.Error) as fast_error:
                    attnprof.attention(q, k, v, **bad)
                with pytest.raises(attnprof.Error) as general:
                    dlpack_path(lambda: attnprof.attention(q, k, v, **bad))
                assert str(fast_error.value) == str(general.value)
                assert answers[-1] is None  # declined, not refused, by the fast path
    # Bad values are refused in the same words on both paths.
    key = "seq_lens" if name == "paged" else "kv_rows"
    bad = dict(kw, **{key: torch.tensor([99, 1, 1], dtype=torch.int32).view(kw[key].shape)})
    with pytest.raises(attnprof.Error) as fast_error:
        attnprof.attention(q, k, v, **bad)
    with pytest.raises(attnprof.Error) as general:
        dlpack_path(lambda: attnprof.attention(q, k, v, **bad))
    assert str(fast_error.value) == str(general.value) and "99" in str(fast_error.value)
