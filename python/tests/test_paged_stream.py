"""A paged cache's block table and lengths in stream order (issue 51): on a GPU they are read only by the kernels,
in the caller's stream order (no host read, no synchronisation), and out-of-range entries are clamped there; the
checking mode (check_inputs=True, ATTNPROF_CHECK_INPUTS=1) reads them first and refuses the first bad entry in one
line, as the CPU always does. The GPU tests are skipped, with the reason, without a GPU."""

import gc

import pytest

torch = pytest.importorskip("torch")

import attnprof  # noqa: E402
from attnprof import _core  # noqa: E402

gpu = pytest.mark.skipif(not (torch.cuda.is_available() and attnprof.cuda_built()),
                         reason="no CUDA GPU here, or this attnprof build has no CUDA backends (run on the GPU machine)")


def paged(b=2, hkv=2, heads=4, pages_per_seq=2, page=16, d=64, device="cpu", dtype=torch.float32):
    """q [b, heads, 1, d], caches of b * pages_per_seq pages, the identity table."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, heads, 1, d, generator=g, dtype=torch.float32).to(device, dtype)
    kc = torch.randn(b * pages_per_seq, hkv, page, d, generator=g).to(device, dtype)
    vc = torch.randn(b * pages_per_seq, hkv, page, d, generator=g).to(device, dtype)
    table = torch.arange(b * pages_per_seq, dtype=torch.int32).view(b, pages_per_seq).to(device)
    return q, kc, vc, table


def reference(q, kc, vc, table, lens):
    """Each sequence over its own keys (the table's pages in order), float64."""
    q, kc, vc, table = q.cpu().double(), kc.cpu().double(), vc.cpu().double(), table.cpu()
    out = torch.zeros(q.shape, dtype=torch.float64)
    group = q.shape[1] // kc.shape[1]
    for s, n in enumerate(lens):
        k = kc[table[s].long().cpu()].permute(1, 0, 2, 3).reshape(kc.shape[1], -1, kc.shape[3])[:, :n]
        v = vc[table[s].long().cpu()].permute(1, 0, 2, 3).reshape(vc.shape[1], -1, vc.shape[3])[:, :n]
        k, v = k.repeat_interleave(group, 0).double().cpu(), v.repeat_interleave(group, 0).double().cpu()
        if n:
            out[s] = torch.nn.functional.scaled_dot_product_attention(q[s].double().cpu(), k, v)
    return out


def test_check_inputs_takes_a_flag_and_changes_nothing_on_the_cpu():
    q, kc, vc, table = paged()
    lens = torch.tensor([32, 20], dtype=torch.int32)
    plain = attnprof.attention(q, kc, vc, block_table=table, seq_lens=lens, mask="none")
    checked = attnprof.attention(q, kc, vc, block_table=table, seq_lens=lens, mask="none", check_inputs=True)
    torch.testing.assert_close(checked, plain, atol=0, rtol=0)
    torch.testing.assert_close(plain.double(), reference(q, kc, vc, table, [32, 20]), atol=2e-5, rtol=2e-5)
    with pytest.raises(attnprof.ArgumentTypeError, match=r"check_inputs must be True or False"):
        attnprof.attention(q, kc, vc, block_table=table, seq_lens=lens, check_inputs=1)
    # The thread's setting is restored after the call, refused or not.
    assert _core._exchange_checking_inputs(-1) == -1


@pytest.mark.parametrize("check_inputs", [False, True])
def test_bad_paged_entries_are_one_line_and_nothing_is_computed_on_the_cpu(check_inputs):
    q, kc, vc, table = paged()  # 4 pages
    lens = torch.tensor([32, 32], dtype=torch.int32)
    outside = table.clone()
    outside[0, 0] = 1003829616
    cases = [
        ({"block_table": outside},
         r"^block table \[0\]\[0\] = 1003829616 is not a physical page \(the cache has 4, 0 .. 3\)$"),
        ({"seq_lens": torch.tensor([32, 33], dtype=torch.int32)},
         r"^seq_lens\[1\] = 33 is outside 0 .. 32 \(the block table's 2 pages of 16 keys\)$"),
        ({"seq_lens": torch.tensor([-4, 3], dtype=torch.int32)}, r"^seq_lens\[0\] = -4 is outside 0 .. 32"),
        ({"block_table": table.to(torch.int64)}, r"^block_table must be int32, not int64$"),
        ({"block_table": table.float()}, r"^block_table must be int32, not float32$"),
    ]
    for change, message in cases:
        kwargs = {"block_table": table, "seq_lens": lens, "mask": "none", "backend": "flash",
                  "check_inputs": check_inputs}
        kwargs.update(change)
        out = torch.full_like(q, 7.0)
        gc.collect()
        before = _core.allocated_bytes("cpu")
        with pytest.raises(attnprof.Error, match=message) as info:
            attnprof.attention(q, kc, vc, out=out, **kwargs)
        assert "\n" not in str(info.value), str(info.value)
        assert bool((out == 7.0).all()), "a refused call wrote its output"
        assert _core.allocated_bytes("cpu") == before


@gpu
def test_cuda_table_and_lengths_written_on_a_side_stream_are_read_in_its_order():
    """The race of issue 51: the table and lengths made by torch ops on a busy side stream, the call made at once on
    that stream; every one of 1000 results against the reference. Today's code read them on the host, on another
    stream, before the side stream wrote them."""
    q, kc, vc, table = paged(b=4, pages_per_seq=8, page=16, d=128, heads=8, device="cuda", dtype=torch.bfloat16)
    lens_host = [128, 3, 77, 16]
    want = reference(q, kc, vc, table, lens_host)
    busy = torch.randn(4096, 4096, device="cuda")
    side = torch.cuda.Stream()
    garbage = 0
    with torch.cuda.stream(side):
        for _ in range(1000):
            t = torch.full_like(table, 1003829616)
            n = torch.full((4,), 1013038345, dtype=torch.int32, device="cuda")
            busy @ busy  # the long kernel first
            t.copy_(table)
            n.copy_(torch.tensor(lens_host, dtype=torch.int32).to("cuda", non_blocking=True))
            out = attnprof.attention(q, kc, vc, block_table=t, seq_lens=n, mask="none", backend="flash")
            side.synchronize()
            garbage += not torch.allclose(out.double().cpu(), want, atol=3e-2, rtol=3e-2)
    assert garbage == 0, f"{garbage} of 1000 calls read values the stream had not written"


@gpu
def test_cuda_checking_mode_refuses_the_first_bad_entry_by_name():
    q, kc, vc, table = paged(device="cuda", dtype=torch.bfloat16)
    lens = torch.tensor([32, 32], dtype=torch.int32, device="cuda")
    outside = table.clone()
    outside[1, 1] = 4
    with pytest.raises(attnprof.Error, match=r"^block table \[1\]\[1\] = 4 is not a physical page") as info:
        attnprof.attention(q, kc, vc, block_table=outside, seq_lens=lens, mask="none", check_inputs=True)
    assert "\n" not in str(info.value)
    with pytest.raises(attnprof.Error, match=r"^seq_lens\[0\] = -1 is outside 0 .. 32"):
        attnprof.attention(q, kc, vc, block_table=table, seq_lens=torch.tensor([-1, 3], dtype=torch.int32,
                                                                               device="cuda"), check_inputs=True)
    with pytest.raises(attnprof.Error, match=r"^block_table is on cpu but q is on cuda"):
        attnprof.attention(q, kc, vc, block_table=table.cpu(), seq_lens=lens)
    # Without the checking mode the same entries run: the bad page's keys skipped, no fault.
    out = attnprof.attention(q, kc, vc, block_table=outside, seq_lens=lens, mask="none", backend="flash")
    torch.cuda.synchronize()
    assert bool(torch.isfinite(out).all())
