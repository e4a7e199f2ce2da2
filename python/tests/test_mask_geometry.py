"""The one mask geometry from Python (issue 49 item 3): a sliding window of up to 2**63 - 1 keys hides nothing a
bottom-right causal mask does not, on every CPU backend, dense and packed (the window arithmetic used to overflow
on flash: error about 3 against the reference)."""

import numpy as np
import pytest
import torch

import attnprof

torch.manual_seed(0)

WINDOWS = [2**63 - 1, 2**63 - 8, 2**62, 40]


def bottom_right(q, k, v):
    """float64 bottom-right causal attention of [B, H, S, D] tensors (rows that see no key: zeros)."""
    s, skv = q.shape[2], k.shape[2]
    keep = torch.ones(s, skv, dtype=torch.bool).tril(skv - s)
    scores = (q.double() @ k.double().transpose(-1, -2)) / q.shape[-1] ** 0.5
    p = torch.softmax(scores.masked_fill(~keep, float("-inf")), -1).nan_to_num(0.0)
    return p @ v.double()


@pytest.mark.parametrize("backend", ["flash", "naive", "naive_inplace", "math"])
@pytest.mark.parametrize("window", WINDOWS)
def test_longest_windows_dense(backend, window):
    q, k, v = torch.randn(1, 2, 16, 64), torch.randn(1, 2, 24, 64), torch.randn(1, 2, 24, 64)
    out = attnprof.attention(q, k, v, backend=backend, mask="sliding_window", window=window)
    torch.testing.assert_close(out.double(), bottom_right(q, k, v), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("backend", ["flash", "naive", "naive_inplace", "math"])
@pytest.mark.parametrize("window", WINDOWS)
def test_longest_windows_packed(backend, window):
    q_lens, kv_lens = [16, 5, 3], [16, 20, 9]
    q = torch.randn(sum(q_lens), 2, 64)
    k, v = torch.randn(sum(kv_lens), 2, 64), torch.randn(sum(kv_lens), 2, 64)
    cq = torch.tensor([0, *np.cumsum(q_lens)], dtype=torch.int32)
    ck = torch.tensor([0, *np.cumsum(kv_lens)], dtype=torch.int32)
    out = attnprof.attention(q, k, v, backend=backend, mask="sliding_window", window=window, cu_seqlens_q=cq,
                             cu_seqlens_k=ck)
    for b in range(len(q_lens)):
        rows, keys = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        want = bottom_right(*(t[s].transpose(0, 1)[None] for t, s in ((q, rows), (k, keys), (v, keys))))
        torch.testing.assert_close(out[rows].double(), want[0].transpose(0, 1), atol=2e-5, rtol=1e-4,
                                   msg=lambda m: f"sequence {b}: {m}")
