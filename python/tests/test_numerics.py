"""Issue 49's numerics from Python on the CPU: NaN and inf pass through every backend as through
PyTorch's SDPA (item 8), the math path takes a negative scale (item 4), and an output over an
input is refused in one line (item 5), through the call and the transformers path alike."""

import pytest
import torch

import attnprof

torch.manual_seed(49)

BACKENDS = ["naive", "naive_inplace", "math", "flash"]


def sdpa(q, k, v, causal, scale=None, bias=None):
    """SDPA's math in float64, op by op (softmax passes NaN and makes inf - inf NaN, as SDPA does)."""
    q, k, v = q.double(), k.double(), v.double()
    s = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    if bias is not None:
        s = s + bias.double()
    return torch.softmax(s, -1) @ v


def inputs(dtype=torch.float32, shape=(1, 2, 16, 64)):
    return tuple((torch.rand(shape) * 2 - 1).to(dtype) for _ in range(3))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("where,value", [("q", float("nan")), ("q", float("inf")), ("k", float("nan")),
                                         ("k", float("-inf"))])
def test_nan_and_inf_pass_through_as_sdpa_gives_them(backend, where, value):
    q, k, v = inputs()
    (q if where == "q" else k)[0, 1, 9, 5] = value
    out = attnprof.attention(q, k, v, backend=backend, mask="causal")
    want = sdpa(q, k, v, causal=True)
    assert torch.equal(out.isnan(), want.isnan()), f"NaN rows {out.isnan().any(-1)} vs {want.isnan().any(-1)}"
    if value != value:
        assert want.isnan().any()
    finite = ~want.isnan()
    torch.testing.assert_close(out.double()[finite], want[finite], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_nan_in_a_float_mask_passes_through(backend):
    q, k, v = inputs()
    bias = torch.zeros(1, 1, 16, 16)
    bias[0, 0, 4, 2] = float("nan")
    out = attnprof.attention(q, k, v, backend=backend, attn_mask=bias)
    want = sdpa(q, k, v, causal=False, bias=bias)
    assert torch.equal(out.isnan(), want.isnan())
    assert out[0, :, 4].isnan().all() and not out[0, :, 5].isnan().any()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [False, True])
def test_a_negative_scale_matches_sdpa(backend, causal):
    q, k, v = inputs()
    out = attnprof.attention(q, k, v, backend=backend, mask="causal" if causal else "none", scale=-0.125)
    torch.testing.assert_close(out.double(), sdpa(q, k, v, causal, scale=-0.125), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("over", ["q", "k", "v"])
def test_an_output_over_an_input_is_refused_in_one_line(backend, over):
    q, k, v = inputs(shape=(1, 2, 512, 64))
    target = {"q": q, "k": k, "v": v}[over]
    with pytest.raises(attnprof.Error, match=f"out shares memory with {over}") as e:
        attnprof.attention(q, k, v, backend=backend, out=target)
    assert "\n" not in str(e.value)


def test_a_partly_overlapping_strided_output_is_refused():
    buf = torch.rand(1, 16, 4, 2, 64) * 2 - 1  # [B, S, q|k|v|out, H, D]
    q, k, v = (buf[:, :, i].transpose(1, 2) for i in range(3))
    ok = buf[:, :, 3].transpose(1, 2)
    out = attnprof.attention(q, k, v, backend="flash", out=ok)  # interleaved, disjoint: runs
    torch.testing.assert_close(out.double(), sdpa(q, k, v, causal=True), atol=1e-5, rtol=1e-5)
    shifted = torch.as_strided(buf, ok.shape, ok.stride(), ok.storage_offset() - 96)  # half of each row in v's slot
    with pytest.raises(attnprof.Error, match="out shares memory with v"):
        attnprof.attention(q, k, v, backend="flash", out=shifted)
