"""Per-sequence rows through attention(): q_rows/kv_rows, and mask= with a key-padding attn_mask lowered to them,
against each sequence run alone (SDPA on its own rows) and padded with zeros; gradients too."""
import pytest
import torch
import torch.nn.functional as F

import attnprof
from attnprof import Error


def alone(q, k, v, q_rows, kv_rows, causal):
    """Each sequence on its own rows by SDPA (top-left causal of its own rows), zeros elsewhere."""
    out = torch.zeros_like(q)
    for b in range(q.shape[0]):
        q0, q1 = (0, q.shape[2]) if q_rows is None else q_rows[b].tolist()
        k0, k1 = kv_rows[b].tolist()
        if q1 > q0 and k1 > k0:
            out[b, :, q0:q1] = F.scaled_dot_product_attention(q[b:b + 1, :, q0:q1], k[b:b + 1, :, k0:k1],
                                                              v[b:b + 1, :, k0:k1], is_causal=causal,
                                                              enable_gqa=True)[0]
    return out


def key_padding(lens, pads, kv_seq):
    keys = torch.arange(kv_seq)
    return torch.stack([(keys >= p) & (keys < p + n) for n, p in zip(lens, pads)])


@pytest.mark.parametrize("pads", [[0, 0, 0], [0, 5, 30], [2, 0, 11]], ids=["right", "left", "both"])
def test_causal_with_a_key_padding_mask_is_each_sequence_alone(pads):
    torch.manual_seed(0)
    S, lens = 40, [40, 30, 7]
    q = torch.randn(3, 4, S, 32, requires_grad=True)
    k = torch.randn(3, 2, S, 32, requires_grad=True)
    v = torch.randn(3, 2, S, 32, requires_grad=True)
    kp = key_padding(lens, pads, S)
    out = attnprof.attention(q, k, v, mask="causal", attn_mask=kp, backend="auto")
    rows = torch.tensor([[p, p + n] for n, p in zip(lens, pads)], dtype=torch.int32)
    want = alone(q, k, v, rows, rows, causal=True)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), g)
    ref = torch.autograd.grad(want, (q, k, v), g)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_decode_kv_rows_are_each_sequence_alone():
    torch.manual_seed(1)
    q, k, v = torch.randn(3, 4, 1, 32), torch.randn(3, 4, 50, 32), torch.randn(3, 4, 50, 32)
    kv_rows = torch.tensor([[0, 50], [20, 50], [49, 50]], dtype=torch.int32)
    out = attnprof.attention(q, k, v, mask="causal-bottom-right", kv_rows=kv_rows)
    torch.testing.assert_close(out, alone(q, k, v, None, kv_rows, causal=False), atol=1e-5, rtol=1e-5)


def test_bad_rows_are_refused_in_one_line():
    q, k, v = torch.randn(2, 2, 8, 32), torch.randn(2, 2, 8, 32), torch.randn(2, 2, 8, 32)
    cases = [
        (dict(kv_rows=torch.tensor([[0, 8], [5, 9000]], dtype=torch.int32)), "kv_rows[1] = (5, 9000) is outside 0 .. 8"),
        (dict(q_rows=torch.tensor([[0, 8], [6, 2]], dtype=torch.int32)), "q_rows[1] = (6, 2) begins after it ends"),
        (dict(q_rows=torch.tensor([[0, 8], [0, 8]], dtype=torch.int64)), "q_rows must be int32"),
        (dict(q_rows=torch.tensor([[0, 8, 1], [0, 8, 1]], dtype=torch.int32)), "q_rows must be int32 [B, 2]"),
        (dict(mask="causal", attn_mask=torch.tensor([[1, 0, 1, 1, 1, 1, 1, 1], [1] * 8], dtype=torch.bool)),
         "attn_mask row 0 is not one run of Trues"),
        (dict(kv_rows=torch.tensor([[0, 8], [0, 8]], dtype=torch.int32), attn_mask=torch.ones(2, 1, 1, 8,
                                                                                                 dtype=torch.bool)),
         "kv_rows with attn_mask"),
    ]
    for kwargs, want in cases:
        kwargs.setdefault("mask", None)
        with pytest.raises(Error) as e:
            attnprof.attention(q, k, v, backend="flash", **kwargs)
        assert want in str(e.value) and "\n" not in str(e.value), str(e.value)
    cu = torch.tensor([0, 8, 16], dtype=torch.int32)
    with pytest.raises(Error, match="kv_rows with a packed batch"):
        attnprof.attention(torch.randn(16, 2, 32), torch.randn(16, 2, 32), torch.randn(16, 2, 32), cu_seqlens_q=cu,
                           cu_seqlens_k=cu, max_seqlen_q=8, max_seqlen_k=8,
                           kv_rows=torch.tensor([[0, 8], [0, 8]], dtype=torch.int32))
