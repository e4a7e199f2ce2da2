"""attnprof.attention on numpy arrays: the DLPack path, no copies, BSHD views."""

import numpy as np
import pytest

import attnprof
from attnprof import _core
from conftest import reference


def qkv(rng, shape=(2, 4, 64, 32), kv_shape=None, dtype=np.float32):
    kv_shape = kv_shape or shape
    return (rng.standard_normal(shape).astype(dtype), rng.standard_normal(kv_shape).astype(dtype),
            rng.standard_normal(kv_shape).astype(dtype))


def ptr(a):
    return a.__array_interface__["data"][0]


@pytest.mark.parametrize("backend", ["naive", "naive_inplace", "math", "flash", "auto"])
def test_matches_float64_reference(rng, backend):
    q, k, v = qkv(rng)
    out = attnprof.attention(q, k, v, backend=backend)
    assert isinstance(out, np.ndarray) and out.shape == q.shape and out.dtype == np.float32
    np.testing.assert_allclose(out, reference(q, k, v), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("mask,window", [("none", None), ("causal", None), ("causal_bottom_right", None),
                                         ("sliding_window", 16)])
def test_masks_scale_and_grouped_heads(rng, mask, window):
    q, k, v = qkv(rng, (1, 4, 48, 32), (1, 2, 64, 32))
    out = attnprof.attention(q, k, v, backend="math", mask=mask, window=window, scale=0.3)
    ref_mask = {"causal_bottom_right": "sliding_window"}.get(mask, mask)
    ref_window = window if window else (10**9 if mask == "causal_bottom_right" else None)
    if mask == "causal":  # top-left aligned on Skv > S
        ref = reference(q, k, v, "causal", 0.3)
    else:
        ref = reference(q, k, v, ref_mask, 0.3, ref_window)
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=1e-4)


def test_float16(rng):
    q, k, v = qkv(rng, dtype=np.float16)
    out = attnprof.attention(q, k, v, backend="flash")
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.astype(np.float64), reference(q, k, v), atol=5e-3, rtol=1e-2)


def test_no_copy_of_inputs_or_output(rng):
    # The library's views start at the caller's own data pointers with the caller's strides.
    q, k, v = qkv(rng)
    out = np.empty_like(q)
    views = _core._views(q, k, v, out, False)
    for (p, sizes, strides), a in zip(views, (q, k, v, out)):
        assert p == ptr(a)
        assert tuple(sizes) == a.shape
        assert tuple(strides) == tuple(s // a.itemsize for s in a.strides)
    # out= is written in place and returned as is.
    assert attnprof.attention(q, k, v, backend="flash", out=out) is out
    np.testing.assert_allclose(out, reference(q, k, v), atol=2e-5, rtol=1e-4)


def test_bshd_views_and_layout(rng):
    # One [B, S, H, D] buffer, read as [B, H, S, D] through a transposed view (no copy) ...
    b, s, h, d = 2, 40, 4, 32
    qs, ks, vs = qkv(rng, (b, s, h, d))
    q, k, v = (x.transpose(0, 2, 1, 3) for x in (qs, ks, vs))
    assert not q.flags.c_contiguous
    views = _core._views(q, k, v, np.empty(q.shape, np.float32), False)
    assert views[0][0] == ptr(qs) and tuple(views[0][2]) == (s * h * d, d, h * d, 1)
    ref = reference(q, k, v)
    for backend in ("naive", "math", "flash"):
        np.testing.assert_allclose(attnprof.attention(q, k, v, backend=backend), ref, atol=2e-5, rtol=1e-4)
    # ... or passed as they are with layout="bshd": the output is [B, S, H, D] too.
    out = attnprof.attention(qs, ks, vs, backend="flash", layout="bshd")
    assert out.shape == (b, s, h, d)
    np.testing.assert_allclose(out.transpose(0, 2, 1, 3), ref, atol=2e-5, rtol=1e-4)
    views = _core._views(qs, ks, vs, out, True)
    assert [v_[0] for v_ in views] == [ptr(qs), ptr(ks), ptr(vs), ptr(out)]


def test_sliced_views(rng):
    # A slice along the sequence (an offset into the buffer) and a head subset are views too.
    q, k, v = qkv(rng, (1, 6, 80, 32))
    qv, kv, vv = q[:, 1:5, 8:72], k[:, 1:5, 8:72], v[:, 1:5, 8:72]
    assert _core._views(qv, kv, vv, np.empty(qv.shape, np.float32), False)[0][0] == ptr(qv)
    np.testing.assert_allclose(attnprof.attention(qv, kv, vv, backend="flash"), reference(qv, kv, vv), atol=2e-5,
                               rtol=1e-4)
