"""A packed batch's cumulative lengths in stream order (issue 56 item 2): on a GPU, flash's kernels (and cudnn's small
kernel that makes its ragged offsets, cuDNN 9.25 and newer) read the caller's cu_seqlens on the device, in the caller's
stream order (no host read, no synchronisation), sized by max_seqlen_q and _k (or the packed rows), and clamp what
they read; every other backend reads them on the host in the caller's stream
order (a wait, never another stream's view of memory it has not written); the checking mode reads them first and
refuses the first bad entry in one line, as the CPU always does. The GPU tests are skipped, with the reason, without a
GPU."""

import itertools

import pytest

torch = pytest.importorskip("torch")

import attnprof  # noqa: E402

gpu = pytest.mark.skipif(not (torch.cuda.is_available() and attnprof.cuda_built()),
                         reason="no CUDA GPU here, or this attnprof build has no CUDA backends (run on the GPU machine)")


def packed(lens, heads=4, kv_heads=2, d=64, device="cpu", dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    total = sum(lens)
    q = torch.randn(total, heads, d, generator=g).to(device, dtype)
    k = torch.randn(total, kv_heads, d, generator=g).to(device, dtype)
    v = torch.randn(total, kv_heads, d, generator=g).to(device, dtype)
    cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32)
    return q, k, v, cu


def reference(q, k, v, lens, causal=True):
    """Each sequence alone, float64 SDPA (bottom-right and top-left agree for equal query and key lengths)."""
    q, k, v = (x.detach().cpu().double() for x in (q, k, v))
    out = torch.zeros(q.shape, dtype=torch.float64)
    at = 0
    for n in lens:
        rows = slice(at, at + n)
        if n:
            o = torch.nn.functional.scaled_dot_product_attention(
                q[rows].transpose(0, 1), k[rows].transpose(0, 1), v[rows].transpose(0, 1), is_causal=causal,
                enable_gqa=True)
            out[rows] = o.transpose(0, 1)
        at += n
    return out


def test_max_seqlen_beyond_the_limit_is_named_as_itself():
    q, k, v, cu = packed([5, 7])
    with pytest.raises(attnprof.Error, match=r"^max_seqlen_q is 1099511627776: out of range, at most 4194304") as info:
        attnprof.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=2**40)
    assert "\n" not in str(info.value) and "seq 1099511627776" not in str(info.value)
    with pytest.raises(attnprof.Error, match=r"^max_seqlen_k is -3: out of range"):
        attnprof.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_k=-3)


def test_cpu_reads_the_lengths_and_refuses_bad_ones_by_entry():
    """The CPU's lengths are host memory: read and checked on every call, whatever max_seqlen says."""
    q, k, v, cu = packed([5, 7, 4])
    got = attnprof.attention(q, k, v, backend="flash", cu_seqlens_q=cu, cu_seqlens_k=cu)
    assert (got.double() - reference(q, k, v, [5, 7, 4])).abs().max() < 1e-4
    bad = cu.clone()
    bad[2] = 3
    with pytest.raises(attnprof.Error, match=r"^cu_seqlens_q decreases at entry 2 \(5 then 3\)"):
        attnprof.attention(q, k, v, cu_seqlens_q=bad, cu_seqlens_k=cu)
    with pytest.raises(attnprof.Error, match=r"^max_seqlen_q is 6, smaller than sequence 1's length 7"):
        attnprof.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=6)


def busy_stream_lengths(cu_host, stream, spins):
    """cu_seqlens written by the stream after a long kernel, into memory that held garbage: a host read made out of
    the stream's order sees the garbage."""
    with torch.cuda.stream(stream):
        cu = torch.full((cu_host.numel(),), 64, dtype=torch.int32, device="cuda")
        torch.cuda._sleep(spins)
        cu.copy_(cu_host.to("cuda", non_blocking=True))
    return cu


@gpu
@pytest.mark.parametrize("backend", ["flash", "auto", "cudnn", "naive"])
def test_cuda_lengths_written_behind_a_busy_stream_are_read_in_its_order(backend):
    """The packed batch of issue 56: cu_seqlens made on a busy stream, the call made at once on that stream. Flash
    reads them only on the device; the others read them on the host in that stream's order. Today's code read them
    on its own stream before the caller's stream wrote them ("cu_seqlens_q[0] is 64")."""
    lens = [100, 1, 300, 55, 0, 17]
    q, k, v, cu_host = packed(lens, heads=8, kv_heads=2, d=128, device="cuda", dtype=torch.bfloat16)
    want = reference(q, k, v, lens)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    wrong = 0
    for _ in range(50):
        cu = busy_stream_lengths(cu_host.pin_memory(), side, 20_000_000)
        with torch.cuda.stream(side):
            try:
                out = attnprof.attention(q, k, v, backend=backend, mask="causal", cu_seqlens_q=cu, cu_seqlens_k=cu,
                                         max_seqlen_q=max(lens), max_seqlen_k=max(lens))
            except attnprof.Error as e:
                if "not eligible" in str(e) or "cannot run" in str(e):
                    pytest.skip(f"{backend} does not take this packed batch here: {e}")
                raise
        side.synchronize()
        wrong += not (out.double().cpu() - want).abs().max() < 3e-2
    assert wrong == 0, f"{wrong} of 50 calls read lengths the stream had not written"


@gpu
@pytest.mark.parametrize("backend", ["flash", "cudnn"])
def test_cuda_packed_call_makes_no_copy_and_no_synchronisation(backend):
    """torch.profiler's record of a packed flash or cudnn call (forward and backward): no device-to-host copy and
    no synchronisation of any kind inside it, max_seqlen given or not. cudnn's ragged offsets are made by a kernel
    from the caller's cu_seqlens (it read them on the host before)."""
    if backend == "cudnn" and (torch.backends.cudnn.version() or 0) < 92500:
        pytest.skip("cuDNN before 9.25 cannot rule out empty sequences unread: cudnn reads the lengths on the host")
    lens = [33, 64, 7]
    q, k, v, cu = packed(lens, heads=8, kv_heads=8, d=128, device="cuda", dtype=torch.bfloat16)
    cu = cu.cuda()
    for x in (q, k, v):
        x.requires_grad_()
    for max_q in (max(lens), None):
        attnprof.attention(q, k, v, backend=backend, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max_q,
                           max_seqlen_k=max_q).sum().backward()  # warm: plans, handles, graphs
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            with torch.profiler.record_function("the packed call"):
                out = attnprof.attention(q, k, v, backend=backend, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                         max_seqlen_q=max_q, max_seqlen_k=max_q)
                out.sum().backward()
        torch.cuda.synchronize()
        # Only what happened inside the call: the profiler synchronises the device itself when it stops.
        window = next(e.time_range for e in prof.events() if e.name == "the packed call")
        names = [e.name for e in prof.events()
                 if e.device_type == torch.autograd.DeviceType.CPU and e.name != "the packed call"
                 and window.start <= e.time_range.start <= window.end]
        assert any("attnprof" in n for n in names), names
        syncs = [n for n in names if "Synchronize" in n or "EventSynchronize" in n]
        copies = [n for n in names if "DtoH" in n or "Device -> Pageable" in n or "Memcpy DtoH" in n]
        assert not syncs and not copies, (max_q, syncs, copies)
        torch.testing.assert_close(out.double().cpu(), reference(q, k, v, lens), atol=3e-2, rtol=3e-2)


@gpu
def test_cuda_flash_without_max_seqlen_sizes_by_the_packed_rows():
    lens = [3, 250, 1, 90]
    q, k, v, cu = packed(lens, heads=4, kv_heads=1, d=64, device="cuda", dtype=torch.float16)
    out = attnprof.attention(q, k, v, backend="flash", mask="causal", cu_seqlens_q=cu.cuda(), cu_seqlens_k=cu.cuda())
    torch.testing.assert_close(out.double().cpu(), reference(q, k, v, lens), atol=2e-2, rtol=2e-2)


@gpu
def test_cuda_bad_lengths_are_clamped_on_the_device_and_refused_by_the_checking_mode():
    lens = [40, 24]
    q, k, v, cu = packed(lens, device="cuda", dtype=torch.bfloat16)
    bad = torch.tensor([0, 50, 64], dtype=torch.int32, device="cuda")  # sequence 0 longer than max_seqlen 40
    with pytest.raises(attnprof.Error, match=r"^max_seqlen_q is 40, smaller than sequence 0's length 50"):
        attnprof.attention(q, k, v, backend="flash", cu_seqlens_q=bad, cu_seqlens_k=bad, max_seqlen_q=40,
                           max_seqlen_k=40, check_inputs=True)
    wild = torch.tensor([7, -100000, 1 << 30], dtype=torch.int32, device="cuda")
    with pytest.raises(attnprof.Error, match=r"^cu_seqlens_q\[0\] is 7"):
        attnprof.attention(q, k, v, backend="flash", cu_seqlens_q=wild, cu_seqlens_k=wild, check_inputs=True)
    # Without the checking mode: clamped into the packed rows on the device, no fault, no host read.
    out = attnprof.attention(q, k, v, backend="flash", cu_seqlens_q=wild, cu_seqlens_k=wild, max_seqlen_q=64,
                             max_seqlen_k=64)
    out2 = attnprof.attention(q, k, v, backend="flash", cu_seqlens_q=bad, cu_seqlens_k=bad, max_seqlen_q=40,
                              max_seqlen_k=40)
    torch.cuda.synchronize()
    assert out.shape == q.shape and out2.shape == q.shape
