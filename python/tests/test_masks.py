"""attn_mask= as SDPA takes it (boolean or additive float, broadcastable to [B, H, S, Skv]) on the CPU
backends, against torch's SDPA, forward and through attnprof's backward; and paged KV caches as serving
engines pass them (k_cache, v_cache, block_table, seq_lens), against SDPA on each sequence's keys."""

import gc

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attnprof
from attnprof import _core

torch.manual_seed(0)


def qkv(b=3, h=4, hkv=2, s=40, skv=56, d=32, dtype=torch.float32):
    q = torch.randn(b, h, s, d, dtype=dtype)
    k = torch.randn(b, hkv, skv, d, dtype=dtype)
    v = torch.randn(b, hkv, skv, d, dtype=dtype)
    return q, k, v


def sdpa(q, k, v, **kw):
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=k.shape[1] != q.shape[1], **kw)


def key_padding(lengths, skv):
    return torch.arange(skv)[None, :] < torch.tensor(lengths)[:, None]  # [B, Skv]


def masks(b, h, s, skv):
    """SDPA-style masks of several broadcast shapes; every query row keeps a key."""
    kp = key_padding([skv, 17, 1][:b], skv)
    causal = torch.ones(s, skv, dtype=torch.bool).tril(skv - s)
    general = torch.rand(b, h, s, skv) > 0.3
    general[..., 0] = True
    return {
        "key padding [B, 1, 1, Skv]": kp[:, None, None, :],
        "key padding expanded to [B, H, S, Skv]": kp[:, None, None, :].expand(b, h, s, skv),
        "causal [S, Skv]": causal,
        "causal and padding [B, 1, S, Skv]": causal[None, None] & kp[:, None, None, :],
        "general [B, H, S, Skv]": general,
        "bias [B, 1, S, Skv]": torch.randn(b, 1, s, skv),
        "bias [1, Skv] with -inf": torch.where(torch.arange(skv) % 5 == 4, float("-inf"), 0.5)[None],
    }


@pytest.mark.parametrize("backend", ["flash", "naive", "math"])
@pytest.mark.parametrize("name", list(masks(3, 4, 40, 56)))
def test_masks_match_sdpa(backend, name):
    q, k, v = qkv()
    m = masks(3, 4, 40, 56)[name]
    got = attnprof.attention(q, k, v, backend=backend, attn_mask=m)
    want = sdpa(q, k, v, attn_mask=m)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


def test_mask_reaches_the_backend_not_a_copy_of_it():
    # The mask is read where it lies: a change to it between calls shows in the next call.
    q, k, v = qkv(b=2, s=8, skv=8)
    m = torch.ones(2, 1, 1, 8, dtype=torch.bool)
    a = attnprof.attention(q, k, v, backend="flash", attn_mask=m)
    m[1, ..., 4:] = False
    b = attnprof.attention(q, k, v, backend="flash", attn_mask=m)
    torch.testing.assert_close(a[0], b[0])
    assert not torch.allclose(a[1], b[1])
    torch.testing.assert_close(b, sdpa(q, k, v, attn_mask=m), atol=2e-5, rtol=2e-5)


def test_bshd_layout_keeps_the_mask_bhss():
    q, k, v = qkv()
    m = masks(3, 4, 40, 56)["causal and padding [B, 1, S, Skv]"]
    got = attnprof.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), backend="flash",
                             layout="bshd", attn_mask=m)
    torch.testing.assert_close(got.transpose(1, 2), sdpa(q, k, v, attn_mask=m), atol=2e-5, rtol=2e-5)


def test_numpy_mask_on_numpy_arrays():
    q, k, v = (x.numpy() for x in qkv(b=2, s=16, skv=24))
    m = np.arange(24)[None, None, None, :] < np.array([24, 9])[:, None, None, None]
    got = attnprof.attention(q, k, v, backend="flash", attn_mask=m)
    want = sdpa(*(torch.from_numpy(x) for x in (q, k, v)), attn_mask=torch.from_numpy(m)).numpy()
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)


def test_fully_masked_rows_are_zeros_on_flash():
    q, k, v = qkv(b=2, s=8, skv=8)
    m = key_padding([8, 0], 8)[:, None, None, :]
    out = attnprof.attention(q, k, v, backend="flash", attn_mask=m)
    assert torch.equal(out[1], torch.zeros_like(out[1]))


@pytest.mark.parametrize("name", ["causal and padding [B, 1, S, Skv]", "key padding [B, 1, 1, Skv]",
                                  "bias [B, 1, S, Skv]"])
def test_autograd_through_attnprofs_backward_with_a_mask(name):
    q, k, v = qkv()
    m = masks(3, 4, 40, 56)[name]
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    ref = [x.clone().requires_grad_() for x in (q, k, v)]
    dout = torch.randn_like(q)
    attnprof.attention(*leaves, attn_mask=m).backward(dout)
    sdpa(*ref, attn_mask=m).backward(dout)
    for got, want in zip(leaves, ref):
        torch.testing.assert_close(got.grad, want.grad, atol=1e-4, rtol=1e-4)


def test_mask_errors_are_one_line():
    q, k, v = qkv(b=2, s=8, skv=8)
    cases = [
        ({"attn_mask": torch.ones(3, 1, 1, 8, dtype=torch.bool)}, r"attn_mask \[3, 1, 1, 8\] does not broadcast"),
        ({"attn_mask": torch.ones(8, 7, dtype=torch.bool)}, r"dimension 3 is 7, want 8 or 1"),
        ({"attn_mask": torch.ones(1, 1, 1, 1, 8, dtype=torch.bool)}, r"has 5 dimensions"),
        ({"attn_mask": torch.ones(8, 8, dtype=torch.int64)}, r"attn_mask is int64: a mask is bool"),
        ({"attn_mask": torch.zeros(8, 8, dtype=torch.float64)}, r"64-bit float: a float mask takes q's dtype"),
        ({"attn_mask": torch.zeros(8, 8, dtype=torch.bfloat16)}, r"attn_mask is bf16 but q is fp32"),
        ({"attn_mask": torch.ones(1, 8, 8, dtype=torch.bool), "mask": "causal"}, r"are exclusive"),
        ({"attn_mask": torch.ones(8, 8, dtype=torch.bool), "mask": "causal"}, r"is not a key-padding mask of this "
                                                                              r"batch: bool \[B, Skv\] = \[2, 8\]"),
        ({"attn_mask": torch.zeros(8, 8).requires_grad_()}, r"attn_mask requires grad"),
        ({"attn_mask": np.ones((8, 8), bool)}, r"q is a torch tensor but attn_mask is ndarray"),
        ({"attn_mask": torch.ones(8, 8, dtype=torch.bool, device="meta")}, r"^attn_mask is on the meta device"),
    ]
    for kwargs, message in cases:
        gc.collect()
        before = _core.allocated_bytes("cpu")
        with pytest.raises(attnprof.Error, match=message) as info:
            attnprof.attention(q, k, v, backend="flash", **kwargs)
        assert "\n" not in str(info.value), str(info.value)
        assert _core.allocated_bytes("cpu") == before


# ---- paged KV caches ---------------------------------------------------------

def paged(k, v, page, extra_pages=3, width=None, seed=0):
    """k, v [B, Hkv, Skv, D] scattered into caches [num_pages, Hkv, page, D] through a shuffled table."""
    b, hkv, skv, d = k.shape
    per_seq = -(-skv // page)
    width = width or per_seq
    num = b * per_seq + extra_pages
    perm = torch.randperm(num, generator=torch.Generator().manual_seed(seed))
    table = torch.zeros(b, width, dtype=torch.int32)
    table[:, :per_seq] = perm[: b * per_seq].view(b, per_seq).to(torch.int32)
    kc = torch.randn(num, hkv, page, d, dtype=k.dtype)  # unused pages hold noise
    vc = torch.randn(num, hkv, page, d, dtype=k.dtype)
    for s in range(b):
        for j in range(skv):
            kc[table[s, j // page], :, j % page] = k[s, :, j]
            vc[table[s, j // page], :, j % page] = v[s, :, j]
    return kc, vc, table


@pytest.mark.parametrize("mask", ["none", "causal_bottom_right"])
def test_paged_unequal_lengths_match_sdpa_per_sequence(mask):
    q, k, v = qkv(b=3, s=4, skv=70)
    kc, vc, table = paged(k, v, page=16, width=6)  # wider than the 5 pages needed, as engines allocate
    lens = torch.tensor([70, 9, 33], dtype=torch.int32)
    with torch.no_grad():
        out = attnprof.attention(q, kc, vc, block_table=table, seq_lens=lens, mask=mask)
    for s, n in enumerate(lens.tolist()):
        causal = torch.ones(4, n, dtype=torch.bool).tril(n - 4) if mask != "none" else None
        want = sdpa(q[s:s + 1], k[s:s + 1, :, :n], v[s:s + 1, :, :n], attn_mask=causal)
        torch.testing.assert_close(out[s:s + 1], want, atol=2e-5, rtol=2e-5)


def test_paged_equal_lengths_run_on_the_composites_too():
    q, k, v = qkv(b=2, s=1, skv=48)
    kc, vc, table = paged(k, v, page=16)
    lens = torch.tensor([48, 48], dtype=torch.int32)
    want = sdpa(q, k, v)
    for backend in ("flash", "naive", "math"):
        got = attnprof.attention(q, kc, vc, block_table=table, seq_lens=lens, mask="none", backend=backend)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    # Unequal lengths: a backend with one length for all is refused by name; auto finds flash.
    lens = torch.tensor([48, 20], dtype=torch.int32)
    with pytest.raises(attnprof.Error, match=r"naive on cpu takes one kv length for every sequence"):
        attnprof.attention(q, kc, vc, block_table=table, seq_lens=lens, mask="none", backend="naive")
    got = attnprof.attention(q, kc, vc, block_table=table, seq_lens=lens, mask="none")
    torch.testing.assert_close(got[1:], sdpa(q[1:], k[1:, :, :20], v[1:, :, :20]), atol=2e-5, rtol=2e-5)


def test_paged_bad_input_is_one_line_and_leaves_nothing():
    q, k, v = qkv(b=2, s=1, skv=32)
    kc, vc, table = paged(k, v, page=16, extra_pages=0)  # 4 pages
    lens = torch.tensor([32, 32], dtype=torch.int32)
    out_of_range = table.clone()
    out_of_range[1, 1] = 4
    negative = table.clone()
    negative[0, 0] = -1
    cases = [
        ({"block_table": out_of_range}, r"block table \[1\]\[1\] = 4 is not a physical page \(the cache has 4, 0 .. 3\)"),
        ({"block_table": negative}, r"block table \[0\]\[0\] = -1 is not a physical page"),
        ({"block_table": table.to(torch.int64)}, r"block_table must be int32"),
        ({"block_table": table.flatten()}, r"block_table must be 2-d, \[batch, pages_per_seq\]"),
        ({"block_table": table[:1]}, r"batch differs: q has 2, block_table has 1"),
        ({"seq_lens": torch.tensor([32, 33], dtype=torch.int32)},
         r"seq_lens\[1\] = 33 is outside 0 .. 32 \(the block table's 2 pages of 16 keys\)"),
        ({"seq_lens": torch.tensor([-1, 3], dtype=torch.int32)}, r"seq_lens\[0\] = -1 is outside"),
        ({"seq_lens": torch.tensor([0, 0], dtype=torch.int32)}, r"seq_lens are all 0"),
        ({"seq_lens": lens.to(torch.int64)}, r"seq_lens must be int32"),
        ({"seq_lens": None}, r"takes block_table= and seq_lens= together"),
        ({"attn_mask": torch.ones(1, 32, dtype=torch.bool)}, r"attn_mask with a paged KV cache"),
    ]
    for change, message in cases:
        kwargs = {"block_table": table, "seq_lens": lens, "mask": "none", "backend": "flash"}
        kwargs.update(change)
        gc.collect()
        before = _core.allocated_bytes("cpu")
        with pytest.raises(attnprof.Error, match=message) as info:
            attnprof.attention(q, kc, vc, **kwargs)
        assert "\n" not in str(info.value), str(info.value)
        assert _core.allocated_bytes("cpu") == before
    # A cache of the wrong rank is refused in the cache's own layout, not q's.
    for name, bad in (("k_cache", {"k": kc[0]}), ("v_cache", {"v": vc.unsqueeze(0)})):
        caches = {"k": kc, "v": vc} | bad
        with pytest.raises(attnprof.Error, match=name + r" must be 4-d, \[num_pages, kv_heads, page_size, head_dim\]; "
                           r"got [35]-d") as info:
            attnprof.attention(q, caches["k"], caches["v"], block_table=table, seq_lens=lens, mask="none")
        assert "\n" not in str(info.value), str(info.value)
    with pytest.raises(attnprof.Error, match=r"page_size 12 must be a power of two"):
        attnprof.attention(q, kc[:, :, :12], vc[:, :, :12], block_table=table, seq_lens=torch.tensor(
            [12, 12], dtype=torch.int32), mask="none")
    with pytest.raises(attnprof.Error, match=r"paged KV cache is inference only"):
        attnprof.attention(q.requires_grad_(), kc, vc, block_table=table, seq_lens=lens, mask="none")
