"""Soft-capping from Python (issue 22 item 3): attention(softcap=c) against Gemma-2's eager formula in float64,
forward and backward through torch autograd, numpy too; bad caps refused in one line."""

import numpy as np
import pytest
import torch

import attnprof

torch.manual_seed(0)


def capped(q, k, v, cap, causal=True, scale=1.0):
    """Gemma-2's eager attention in float64: scores * scale, / cap, tanh, * cap, then the mask and softmax."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) * scale
    s = torch.tanh(s / cap) * cap
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).tril().logical_not(), float("-inf"))
    return torch.softmax(s, -1) @ v


def qkv(shape=(1, 4, 70, 32), kv_shape=(1, 2, 70, 32), requires_grad=False):
    return tuple(torch.randn(s, dtype=torch.float32, requires_grad=requires_grad) for s in (shape, kv_shape, kv_shape))


@pytest.mark.parametrize("backend", ["naive", "naive_inplace", "math", "flash"])
@pytest.mark.parametrize("cap", [30.0, 2.0])
@pytest.mark.parametrize("mask", ["causal", "none"])
def test_forward_matches_the_capped_formula(backend, cap, mask):
    q, k, v = qkv()
    out = attnprof.attention(q, k, v, backend=backend, mask=mask, scale=1.0, softcap=cap)
    want = capped(q, k, v, cap, causal=mask == "causal")
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=1e-4)
    # Not the uncapped answer: the cap bites at these scores (scale 1, |s| up to about 20).
    assert (out.double() - capped(q, k, v, 1e9, causal=mask == "causal")).abs().max() > 1e-2


@pytest.mark.parametrize("cap", [30.0, 2.0])
def test_backward_through_autograd_matches_the_capped_formula(cap):
    q, k, v = qkv(requires_grad=True)
    dout = torch.randn(q.shape, dtype=torch.float64)
    out = attnprof.attention(q, k, v, backend="flash", scale=1.0, softcap=cap)
    grads = torch.autograd.grad(out, (q, k, v), dout.float())
    ref = capped(q, k, v, cap)
    want = torch.autograd.grad(ref, (q, k, v), dout)
    for name, g, w in zip("qkv", grads, want):
        torch.testing.assert_close(g.double(), w.double(), atol=1e-4, rtol=1e-3, msg=f"d{name}")
    # Another cap's gradients differ: dQ and dK carry tanh's derivative.
    other = torch.autograd.grad(capped(q, k, v, cap * 0.5), (q, k, v), dout)
    assert (grads[0].double() - other[0].double()).abs().max() > 1e-2


def test_numpy_arrays_take_it_too():
    q, k, v = (x.numpy() for x in qkv())
    out = attnprof.attention(q, k, v, backend="flash", scale=1.0, softcap=2.0)
    want = capped(*(torch.from_numpy(x) for x in (q, k, v)), 2.0).numpy()
    np.testing.assert_allclose(out, want, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("cap, message", [
    (0, r"^softcap must be positive"),
    (-1.5, r"^softcap must be positive"),
    (float("nan"), r"^softcap must be a finite number"),
    (float("inf"), r"^softcap must be a finite number"),
    ("big", r"^softcap must be a number, got str 'big'$"),
])
def test_bad_caps_are_refused_in_one_line(cap, message):
    q, k, v = qkv()
    with pytest.raises(attnprof.Error, match=message) as info:
        attnprof.attention(q, k, v, backend="flash", softcap=cap)
    assert "\n" not in str(info.value)
