"""FP8 (issue 24) from Python on the CPU: float8_e4m3fn torch tensors with their descales, a bf16
output, quantize_fp8, explain and compare in fp8, and bad input as one attnprof.Error each."""

import math

import numpy as np
import pytest
import torch

import attnprof

torch.manual_seed(24)

FLOOR = 2.0**-4 / math.sqrt(3.0)  # the stated FP8 floor (attnprof compare --help)


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def reference(q, k, v, causal=True):
    group = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    return torch.nn.functional.scaled_dot_product_attention(q.double(), k, v, is_causal=causal)


def real_inputs(shape=(1, 4, 64, 64), kv_shape=None):
    kv_shape = kv_shape or shape
    # As attnprof draws them: uniform in [-1, 1), rounded to bf16.
    return tuple((torch.rand(s) * 2 - 1).to(torch.bfloat16) for s in (shape, kv_shape, kv_shape))


def test_quantize_fp8_is_amax_over_448_rounded_to_nearest():
    t = torch.tensor([[0.5, -2.0], [1.0, 0.0]])
    t8, descale = attnprof.quantize_fp8(t)
    assert t8.dtype == torch.float8_e4m3fn
    assert descale == pytest.approx(2.0 / 448)
    assert t8.float().abs().max().item() == 448.0
    torch.testing.assert_close(t8.float() * descale, t, atol=0, rtol=2.0**-4)
    zeros8, one = attnprof.quantize_fp8(torch.zeros(3))
    assert one == 1.0 and zeros8.float().abs().max().item() == 0.0
    with pytest.raises(attnprof.Error, match="floating torch tensor"):
        attnprof.quantize_fp8(np.zeros(3))


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_quantize_fp8_refuses_non_finite_values_in_one_line(bad):
    with pytest.raises(attnprof.Error, match=r"quantize_fp8: t holds 1 non-finite value") as e:
        attnprof.quantize_fp8(torch.tensor([1.0, bad]))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("backend", ["naive", "naive_inplace", "math"])
@pytest.mark.parametrize("shape,kv_shape,causal", [((1, 4, 64, 64), None, True), ((2, 8, 48, 32), (2, 2, 80, 32), False)])
def test_fp8_tensors_within_the_stated_tolerance(backend, shape, kv_shape, causal):
    q, k, v = real_inputs(shape, kv_shape)
    (q8, qs), (k8, ks), (v8, vs) = (attnprof.quantize_fp8(x) for x in (q, k, v))
    mask = "causal" if causal else "none"
    out = attnprof.attention(q8, k8, v8, backend=backend, mask=mask, q_descale=qs, k_descale=ks, v_descale=vs)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    truth = reference(q, k, v, causal)  # the REAL (bf16) inputs: the error includes quantization's
    err = rel(out, truth)
    math_err = rel(attnprof.attention(q8, k8, v8, backend="math", mask=mask, q_descale=qs, k_descale=ks,
                                      v_descale=vs), truth)
    assert err <= 2 * math_err + FLOOR
    bf16_err = rel(attnprof.attention(q, k, v, backend=backend, mask=mask), truth)
    assert bf16_err < err / 4, "fp8 costs more than bf16 on the same real inputs"
    assert 5e-3 < err < 6e-2
    # FP8 semantics: the FP32 computation of the dequantized values, rounded to bf16.
    deq = [x.float() * s for x, s in ((q8, qs), (k8, ks), (v8, vs))]
    want = attnprof.attention(*deq, backend=backend, mask=mask).to(torch.bfloat16)
    torch.testing.assert_close(out, want, atol=0, rtol=0)


@pytest.mark.parametrize("shape,kv_shape,causal", [((1, 4, 64, 64), None, True), ((2, 8, 48, 32), (2, 2, 80, 32), False),
                                                   ((1, 2, 70, 40), None, True)])
def test_flash_takes_fp8_on_the_cpu(shape, kv_shape, causal):
    q, k, v = real_inputs(shape, kv_shape)
    (q8, qs), (k8, ks), (v8, vs) = (attnprof.quantize_fp8(x) for x in (q, k, v))
    mask = "causal" if causal else "none"
    out = attnprof.attention(q8, k8, v8, backend="flash", mask=mask, q_descale=qs, k_descale=ks, v_descale=vs)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    truth = reference(q, k, v, causal)
    err = rel(out, truth)
    math_err = rel(attnprof.attention(q8, k8, v8, backend="math", mask=mask, q_descale=qs, k_descale=ks,
                                      v_descale=vs), truth)
    assert err <= 2 * math_err + FLOOR
    assert 5e-3 < err < 6e-2
    # The stored values multiplied as they are, the descales as scales: with descales that are powers of
    # two, flash's bf16 forward on the dequantized values (exact in bf16), bit for bit.
    scales = (2.0**-7, 2.0**-6, 2.0**-8)
    a = attnprof.attention(q8, k8, v8, backend="flash", mask=mask, q_descale=scales[0], k_descale=scales[1],
                           v_descale=scales[2])
    deq = [(x.float() * s).to(torch.bfloat16) for x, s in zip((q8, k8, v8), scales)]
    torch.testing.assert_close(a, attnprof.attention(*deq, backend="flash", mask=mask), atol=0, rtol=0)


@pytest.mark.parametrize("backend", ["flash", "math"])
def test_packed_fp8_batches_are_their_sequences(backend):
    # Three sequences (one empty) packed as flash_attn_varlen_func takes them, quantized per packed
    # tensor: each sequence's rows are the dense fp8 call's on that sequence with the same descales,
    # and within the stated tolerance of float64 on the real inputs.
    lens, heads, kv_heads, dim = [37, 0, 70], 4, 2, 64
    total = sum(lens)
    q, k, v = ((torch.rand(total, h, dim) * 2 - 1).to(torch.bfloat16) for h in (heads, kv_heads, kv_heads))
    (q8, qs), (k8, ks), (v8, vs) = (attnprof.quantize_fp8(x) for x in (q, k, v))
    cu = torch.tensor([0, 37, 37, 107], dtype=torch.int32)
    out = attnprof.attention(q8, k8, v8, backend=backend, cu_seqlens_q=cu, cu_seqlens_k=cu, q_descale=qs,
                             k_descale=ks, v_descale=vs)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    for s, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        if a == b:
            continue
        one = lambda x: x[a:b].transpose(0, 1).unsqueeze(0)  # [1, H, len, D]
        dense = attnprof.attention(one(q8), one(k8), one(v8), backend=backend, q_descale=qs, k_descale=ks,
                                   v_descale=vs)
        torch.testing.assert_close(one(out), dense, atol=0, rtol=0, msg=f"sequence {s}")
        err = rel(one(out), reference(one(q), one(k), one(v)))
        assert 5e-3 < err <= 2 * 3e-2 + FLOOR, f"sequence {s}: {err}"
    # A descale doubled is O doubled (before bf16's rounding).
    twice = attnprof.attention(q8, k8, v8, backend=backend, cu_seqlens_q=cu, cu_seqlens_k=cu, q_descale=qs,
                               k_descale=ks, v_descale=2 * vs)
    torch.testing.assert_close(twice.float(), 2 * out.float(), atol=0, rtol=2.0**-7)
    with pytest.raises(attnprof.Error, match=r"q_descale applies to fp8 \(float8_e4m3fn\) inputs only"):
        attnprof.attention(q, k, v, backend=backend, cu_seqlens_q=cu, cu_seqlens_k=cu, q_descale=qs)
    with pytest.raises(attnprof.Error, match=r"dtype fp8 is forward only"):
        attnprof.attention(q8.requires_grad_(), k8, v8, backend=backend, cu_seqlens_q=cu, cu_seqlens_k=cu)


def test_descales_are_read_floats_or_one_element_tensors():
    q, k, v = real_inputs()
    (q8, qs), (k8, ks), (v8, vs) = (attnprof.quantize_fp8(x) for x in (q, k, v))
    a = attnprof.attention(q8, k8, v8, backend="math", q_descale=qs, k_descale=ks, v_descale=vs)
    b = attnprof.attention(q8, k8, v8, backend="math", q_descale=torch.tensor([qs]), k_descale=torch.tensor(ks),
                           v_descale=np.array([vs], dtype=np.float32))
    torch.testing.assert_close(a, b, atol=1e-2, rtol=1e-2)
    # The descale is used: doubling v's doubles the output (exactly, before the bf16 rounding).
    c = attnprof.attention(q8, k8, v8, backend="math", q_descale=qs, k_descale=ks, v_descale=2 * vs)
    torch.testing.assert_close(c.float(), 2 * a.float(), atol=0, rtol=2.0**-7)
    # None is 1.0: the stored values are the real ones.
    ones = attnprof.attention(q8, k8, v8, backend="math", scale=1e-3)
    want = attnprof.attention(q8.float(), k8.float(), v8.float(), backend="math", scale=1e-3).to(torch.bfloat16)
    torch.testing.assert_close(ones, want, atol=0, rtol=0)
    out = torch.empty(q.shape, dtype=torch.bfloat16)
    assert attnprof.attention(q8, k8, v8, backend="naive", out=out, q_descale=qs, k_descale=ks, v_descale=vs) is out


@pytest.mark.parametrize("bad,match", [
    (0.0, r"q_descale must be a finite positive number"),
    (-1.0, r"q_descale must be a finite positive number"),
    (float("nan"), r"q_descale must be a finite positive number"),
    (float("inf"), r"q_descale must be a finite positive number"),
    (1e300, r"q_descale is beyond float32's range"),
    ("big", r"q_descale must be a number"),
    (torch.ones(2), r"q_descale must be a number or a 1-element tensor, got shape \(2,\)"),
])
def test_a_bad_descale_is_one_line(bad, match):
    q8, k8, v8 = (attnprof.quantize_fp8(x)[0] for x in real_inputs())
    with pytest.raises(attnprof.Error, match=match):
        attnprof.attention(q8, k8, v8, backend="math", q_descale=bad)


def test_fp8_refusals_name_what_to_change():
    q, k, v = real_inputs()
    q8, k8, v8 = (attnprof.quantize_fp8(x)[0] for x in (q, k, v))
    with pytest.raises(attnprof.Error, match=r"q_descale applies to fp8 \(float8_e4m3fn\) inputs only; q is bf16"):
        attnprof.attention(q, k, v, backend="math", q_descale=0.5)
    with pytest.raises(attnprof.Error, match=r"q is fp8 but k is bf16"):
        attnprof.attention(q8, k, v8, backend="math")
    with pytest.raises(attnprof.Error, match=r"out"):
        attnprof.attention(q8, k8, v8, backend="math", out=torch.empty(q.shape, dtype=torch.float8_e4m3fn))
    with pytest.raises(attnprof.Error, match=r"a float mask with fp8 inputs is bf16"):
        attnprof.attention(q8, k8, v8, backend="math", attn_mask=torch.zeros(64, 64, dtype=torch.float32))
    with pytest.raises(attnprof.Error, match=r"dtype fp8 is forward only"):
        attnprof.compare(dtype="fp8", seq=64, batch=1, heads=2, pass_="backward", trace_dir=None)
    with pytest.raises(attnprof.Error, match=r"fp8_descale applies to dtype fp8 only"):
        attnprof.compare(seq=64, batch=1, heads=2, fp8_descale=0.01, trace_dir=None)
    with pytest.raises(attnprof.Error, match=r"fp8_descale must be a finite positive number"):
        attnprof.compare(dtype="fp8", seq=64, batch=1, heads=2, fp8_descale=0, trace_dir=None)


def test_a_bf16_bias_mask_goes_with_fp8_inputs():
    q, k, v = real_inputs()
    (q8, qs), (k8, ks), (v8, vs) = (attnprof.quantize_fp8(x) for x in (q, k, v))
    bias = (torch.rand(64, 64) - 0.5).to(torch.bfloat16)
    out = attnprof.attention(q8, k8, v8, backend="math", attn_mask=bias, q_descale=qs, k_descale=ks, v_descale=vs)
    want = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                            attn_mask=bias.double())
    assert rel(out, want) < 6e-2


def test_explain_and_compare_in_fp8():
    e = attnprof.explain(dtype="fp8", seq=64, batch=1, heads=2)
    rows = {r["backend"]: r for r in e.results}
    assert rows["math"]["eligible"] and "FP8 semantics" in rows["math"]["reason"]
    assert rows["flash"]["eligible"] and "e4m3 inputs read as they are stored" in rows["flash"]["reason"]
    rep = attnprof.compare(dtype="fp8", seq=64, batch=1, heads=2, backends=["naive", "math"], trace_dir=None,
                           schedule=(0, 0, 1, 1), threads=1)
    assert rep.accepted
    for name in ("naive", "math"):
        r = rep[name]
        assert r.fp8["bf16_rel_error"] < r.rel_error
        assert [t["name"] for t in r.fp8["tensors"]] == ["q", "k", "v"]
        assert any(f.rule == "fp8-quantization" for f in r.findings)
    assert "bf16 error" in str(rep)
    sat = attnprof.profile("math", dtype="fp8", seq=64, batch=1, heads=2, trace_dir=None, schedule=(0, 0, 1, 1),
                           threads=1, fp8_descale=0.001)
    warnings = [f for f in sat.results[0].findings if f.rule == "fp8-saturation"]
    assert len(warnings) == 3 and all(f.severity == "warning" for f in warnings)
