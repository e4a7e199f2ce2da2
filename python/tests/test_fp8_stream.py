"""FP8 descales in stream order (issue 56 item 2): a descale given as a CUDA tensor is read only by the kernels
(flash's FP8 kernel, cuDNN's FP8 graph), on the caller's stream, never on the host: no device-to-host copy and no
synchronisation in the call (attnprof used to .item() it). Numbers stay accepted, and a host tensor is read as its
number; bad descales are one line. The CUDA tests are skipped, with the reason, without a GPU."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import attnprof  # noqa: E402
from attnprof import _core  # noqa: E402

gpu = pytest.mark.skipif(not (torch.cuda.is_available() and attnprof.cuda_built()),
                         reason="no CUDA GPU here, or this attnprof build has no CUDA backends (run on the GPU machine)")


def fp8_inputs(shape=(2, 4, 256, 128), device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    reals = [(torch.rand(shape, generator=g) * 2 - 1).to(torch.bfloat16) for _ in range(3)]
    out = []
    for r in reals:
        t8, d = attnprof.quantize_fp8(r)
        out.append((t8.to(device), d))
    return out


def test_the_binding_takes_a_one_element_float32_array_as_a_descale():
    """A descale array reaches the C++ call as an array (the CPU's is host memory, read as its number): the same
    output as the number; other dtypes and sizes are one line naming the argument."""
    (q8, qs), (k8, ks), (v8, vs) = fp8_inputs(shape=(1, 2, 32, 64))
    want = torch.empty(q8.shape, dtype=torch.bfloat16)
    got = torch.empty(q8.shape, dtype=torch.bfloat16)
    dl = torch.utils.dlpack.to_dlpack  # as attnprof._torch passes tensors

    def call(out, **descales):
        _core.attention(dl(q8), dl(k8), dl(v8), dl(out), backend="math", mask="causal", **descales)

    call(want, q_descale=qs, k_descale=ks, v_descale=vs)
    call(got, q_descale=np.array([qs], dtype=np.float32), k_descale=dl(torch.tensor(ks, dtype=torch.float32)),
         v_descale=np.array([[vs]], dtype=np.float32))
    assert torch.equal(want, got)
    with pytest.raises(attnprof.Error, match=r"^v_descale must be a number or a float32 tensor of one element, got "):
        call(got, v_descale=np.array([vs], dtype=np.float64))
    with pytest.raises(attnprof.Error, match=r"^q_descale must be a number or a float32 tensor of one element"):
        call(got, q_descale=np.ones(2, dtype=np.float32))


def descale_tensors(values, stream, spins):
    """The descales as CUDA tensors written by `stream` after a long kernel, into memory that held 1000: a read made
    out of the stream's order sees 1000."""
    with torch.cuda.stream(stream):
        t = torch.full((3,), 1000.0, dtype=torch.float32, device="cuda")
        torch.cuda._sleep(spins)
        t.copy_(torch.tensor(values, dtype=torch.float32).pin_memory(), non_blocking=True)
    return t[0:1], t[1:2], t[2:3]


def run_or_skip(backend, *args, **kwargs):
    try:
        return attnprof.attention(*args, backend=backend, **kwargs)
    except attnprof.Error as e:
        if "not eligible" in str(e) or "cannot run" in str(e) or "not built" in str(e):
            pytest.skip(f"{backend} takes no fp8 here: {e}")
        raise


@gpu
@pytest.mark.parametrize("backend", ["flash", "cudnn"])
def test_cuda_descale_tensors_written_behind_a_busy_stream_give_the_numbers_output(backend):
    (q8, qs), (k8, ks), (v8, vs) = fp8_inputs(device="cuda")
    want = run_or_skip(backend, q8, k8, v8, mask="causal", q_descale=qs, k_descale=ks, v_descale=vs)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    for _ in range(5):
        tq, tk, tv = descale_tensors([qs, ks, vs], side, 20_000_000)
        with torch.cuda.stream(side):
            got = attnprof.attention(q8, k8, v8, backend=backend, mask="causal", q_descale=tq, k_descale=tk,
                                     v_descale=tv)
            busy = not side.query()  # the call returned while the stream still slept: it waited for nothing
        side.synchronize()
        assert busy, "the call waited for the caller's stream"
        assert torch.equal(got.cpu(), want.cpu())


@gpu
@pytest.mark.parametrize("backend", ["flash", "cudnn"])
def test_cuda_fp8_call_with_descale_tensors_makes_no_copy_and_no_synchronisation(backend):
    """torch.profiler's record of the call: no device-to-host copy and no synchronisation inside it (attnprof's
    _descale used to .item() each tensor: a copy and a wait each)."""
    (q8, qs), (k8, ks), (v8, vs) = fp8_inputs(device="cuda")
    tq, tk, tv = (torch.tensor([d], dtype=torch.float32, device="cuda") for d in (qs, ks, vs))
    run_or_skip(backend, q8, k8, v8, mask="causal", q_descale=tq, k_descale=tk, v_descale=tv)  # warm: graphs, plans
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        with torch.profiler.record_function("the fp8 call"):
            out = attnprof.attention(q8, k8, v8, backend=backend, mask="causal", q_descale=tq, k_descale=tk,
                                     v_descale=tv)
    torch.cuda.synchronize()
    window = next(e.time_range for e in prof.events() if e.name == "the fp8 call")
    names = [e.name for e in prof.events()
             if e.device_type == torch.autograd.DeviceType.CPU and e.name != "the fp8 call"
             and window.start <= e.time_range.start <= window.end]
    syncs = [n for n in names if "Synchronize" in n]
    copies = [n for n in names if "DtoH" in n or "Device -> Pageable" in n or "item" in n or "_local_scalar" in n]
    assert not syncs and not copies, (syncs, copies)
    want = attnprof.attention(q8, k8, v8, backend=backend, mask="causal", q_descale=qs, k_descale=ks, v_descale=vs)
    assert torch.equal(out.cpu(), want.cpu())


@gpu
def test_cuda_descale_tensors_bad_ones_are_one_line_and_the_checking_mode_reads_them():
    (q8, qs), (k8, ks), (v8, vs) = fp8_inputs(device="cuda")
    with pytest.raises(attnprof.Error, match=r"^q_descale must be a number or a float32 tensor of one element"):
        run_or_skip("flash", q8, k8, v8, q_descale=torch.ones(1, dtype=torch.float64, device="cuda"))
    zero = torch.zeros(1, dtype=torch.float32, device="cuda")
    with pytest.raises(attnprof.Error, match=r"^k_descale must be a finite positive number"):
        run_or_skip("flash", q8, k8, v8, q_descale=qs, k_descale=zero, check_inputs=True)
    with pytest.raises(attnprof.Error, match=r"takes fp8 descales as numbers, not device tensors"):
        attnprof.attention(q8, k8, v8, backend="math", q_descale=torch.ones(1, device="cuda"))
