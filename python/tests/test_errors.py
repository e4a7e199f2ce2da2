"""Bad input: one attnprof.Error (a ValueError) with the library's message, nothing left allocated."""

import gc
import tracemalloc

import numpy as np
import pytest

import attnprof
from attnprof import _core


def arrays(shape=(1, 2, 16, 32), kv_shape=None, dtype=np.float32):
    kv_shape = kv_shape or shape
    return np.ones(shape, dtype), np.ones(kv_shape, dtype), np.ones(kv_shape, dtype)


def read_only(a):
    a.setflags(write=False)
    return a


CASES = {
    "wrong rank": (lambda: (np.ones((2, 16, 32), np.float32),) + arrays()[1:], {}, r"q must be 4-d.*got 3-d"),
    "dtype not taken": (lambda: arrays(dtype=np.float64), {}, r"is float64, a dtype attnprof does not take"),
    "int dtype": (lambda: arrays(dtype=np.int32), {}, r"dtype attnprof does not take"),
    "mixed dtypes": (lambda: arrays()[:2] + (np.ones((1, 2, 16, 32), np.float16),), {}, r"q is fp32 but v is fp16"),
    "strided head_dim": (lambda: (np.ones((1, 2, 16, 64), np.float32)[..., ::2],) + arrays()[1:], {},
                         r"strided head_dim.*contiguous"),
    "negative strides": (lambda: (np.ones((1, 2, 16, 32), np.float32)[:, :, ::-1],) + arrays()[1:], {},
                         r"negative stride"),
    "k and v differ": (lambda: arrays()[:2] + (np.ones((1, 2, 8, 32), np.float32),), {}, r"k and v differs"),
    "head_dim differs": (lambda: (np.ones((1, 2, 16, 16), np.float32),) + arrays()[1:], {}, r"head_dim differs"),
    "heads not a multiple": (lambda: arrays((1, 3, 16, 32), (1, 2, 16, 32)), {}, r"heads"),
    "unknown backend": (lambda: arrays(), {"backend": "fastest"}, r"unknown backend 'fastest'"),
    "GPU-only backend on CPU": (lambda: arrays(), {"backend": "cudnn"}, r"cudnn.*(CPU|cpu)"),
    "unknown mask": (lambda: arrays(), {"mask": "diagonal"}, r"unknown mask 'diagonal'"),
    "mask tensor by name": (lambda: arrays(), {"mask": "boolean"}, r"names a mask tensor: pass the tensor as attn_mask="),
    "bad attn_mask shape": (lambda: arrays(), {"attn_mask": np.ones((1, 2, 15, 16), bool)},
                            r"attn_mask \[1, 2, 15, 16\] does not broadcast to \[B, H, S, Skv\] = \[1, 2, 16, 16\]"),
    "attn_mask dtype": (lambda: arrays(), {"attn_mask": np.ones((16, 16), np.int32)}, r"attn_mask is int32: a mask is bool"),
    "float attn_mask of another dtype": (lambda: arrays(), {"attn_mask": np.zeros((16, 16), np.float16)},
                                         r"attn_mask is fp16 but q is fp32"),
    "attn_mask and a mask name": (lambda: arrays(), {"attn_mask": np.ones((1, 16, 16), bool), "mask": "none"},
                                  r"attn_mask and mask=.none. are exclusive"),
    "a [S, Skv] mask beside a mask name": (lambda: arrays(), {"attn_mask": np.ones((16, 16), bool), "mask": "none"},
                                           r"^attn_mask \[16, 16\] beside mask='none' is not a key-padding mask of "
                                           r"this batch: bool \[B, Skv\] = \[1, 16\]"),
    "window without sliding window": (lambda: arrays(), {"window": 4}, r"window applies only to mask=sliding-window"),
    "window not positive": (lambda: arrays(), {"mask": "sliding_window", "window": 0}, r"window must be positive"),
    "sliding window without window": (lambda: arrays(), {"mask": "sliding_window"}, r"needs window=N"),
    "scale overflows": (lambda: arrays(), {"scale": 1e300}, r"scale 1e\+300 makes the scores overflow"),
    "scale not finite": (lambda: arrays(), {"scale": float("nan")}, r"scale must be a finite, non-zero number"),
    "unknown layout": (lambda: arrays(), {"layout": "sbhd"}, r"unknown layout"),
    "read-only out": (lambda: arrays(), {"out": read_only(np.zeros((1, 2, 16, 32), np.float32))},
                      r"^out is read-only \(its writeable flag is off\): pass an array attnprof may write, or no out$"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_numpy_input_raises_one_error_and_leaves_nothing(case):
    make, kwargs, message = CASES[case]
    q, k, v = make()
    gc.collect()
    before = _core.allocated_bytes("cpu")
    tracemalloc.start()
    try:
        # numpy traces its array buffers in a domain of their own.
        buffers = [tracemalloc.DomainFilter(True, np.lib.tracemalloc_domain)]
        snapshot = tracemalloc.take_snapshot().filter_traces(buffers)
        with pytest.raises(attnprof.Error, match=message) as info:
            attnprof.attention(q, k, v, **kwargs)
        gc.collect()
        # The traceback is still held (info): the output array made for the call must not be.
        diff = tracemalloc.take_snapshot().filter_traces(buffers).compare_to(snapshot, "filename")
        leaked = sum(d.size_diff for d in diff if d.size_diff > 0)
        assert leaked == 0, f"{leaked} bytes of numpy buffers still allocated after a refused call"
        assert info.value is not None
    finally:
        tracemalloc.stop()
    assert isinstance(info.value, ValueError)
    assert _core.allocated_bytes("cpu") == before


def test_out_must_match_and_not_broadcast():
    q, k, v = arrays()
    with pytest.raises(attnprof.Error, match=r"q and out"):
        attnprof.attention(q, k, v, out=np.empty((1, 2, 8, 32), np.float32))
    with pytest.raises(attnprof.Error, match=r"broadcast view"):
        broadcast = np.lib.stride_tricks.as_strided(np.empty((16, 32), np.float32), q.shape, (0, 0, 128, 4))
        attnprof.attention(q, k, v, out=broadcast)
    with pytest.raises(attnprof.Error, match=r"^out is read-only \(its writeable flag is off\)"):
        attnprof.attention(q, k, v, out=np.broadcast_to(np.empty((1, 1, 16, 32), np.float32), q.shape))
    with pytest.raises(attnprof.Error, match=r"q is fp32 but out is fp16"):
        attnprof.attention(q, k, v, out=np.empty(q.shape, np.float16))


def test_not_an_array():
    with pytest.raises(attnprof.Error, match=r"takes torch tensors or DLPack arrays"):
        attnprof.attention([1.0], [1.0], [1.0])


def test_bad_problem_for_reports():
    with pytest.raises(attnprof.Error, match=r"unknown dtype 'fp4'"):
        attnprof.explain(dtype="fp4")
    assert attnprof.explain(dtype="fp8", device="cpu").results  # fp8 (e4m3) is a dtype now: test_fp8.py
    with pytest.raises(attnprof.Error, match=r"batch"):
        attnprof.compare(batch=-1, trace_dir=None)


def test_arrays_it_cannot_read():
    q, k, v = arrays()
    with pytest.raises(attnprof.Error, match=r"q must be 4-d.*got 0-d"):
        attnprof.attention(np.array(1.0, np.float32), k, v)
    with pytest.raises(attnprof.Error, match=r"q is an array of Python objects"):
        attnprof.attention(q.astype(object), k, v)
    with pytest.raises(attnprof.Error, match=r"dtype attnprof does not take"):
        attnprof.attention(q.astype(np.complex64), k, v)
    with pytest.raises(attnprof.Error, match=r"q is empty \(dimension 2 has size 0\)"):
        attnprof.attention(np.ones((1, 2, 0, 32), np.float32), k, v)
    with pytest.raises(attnprof.Error, match=r"strided head_dim"):
        attnprof.attention(np.asfortranarray(q), k, v)


def test_sizes_it_cannot_hold():
    q, k, v = arrays()
    # 2^55 elements of one float, by stride 0: no offset arithmetic on them.
    huge = np.lib.stride_tricks.as_strided(np.zeros(32, np.float32), (2**20, 2**20, 2**10, 32), (0, 0, 0, 4))
    with pytest.raises(attnprof.Error, match=r"more than 2\^48 elements"):
        attnprof.attention(huge, huge, huge, out=np.empty(q.shape, np.float32))
    # An output whose elements overlap (not a broadcast: no stride is 0).
    overlapping = np.lib.stride_tricks.as_strided(np.zeros(2048, np.float32), q.shape, (4, 4, 4, 4))
    with pytest.raises(attnprof.Error, match=r"out .* overlaps itself"):
        attnprof.attention(q, k, v, out=overlapping)
    for kwargs, message in (({"threads": 2**40}, r"threads is out of range"),
                            ({"threads": -3}, r"threads must be from 0"),
                            ({"threads": 1.5}, r"threads must be a whole number"),
                            ({"mask": "sliding_window", "window": 2**70}, r"window is out of range"),
                            ({"scale": "x"}, r"scale must be a number"),
                            ({"scale": float("nan")}, r"finite")):
        with pytest.raises(attnprof.Error, match=message):
            attnprof.attention(q, k, v, **kwargs)
    small = {"batch": 1, "heads": 1, "seq": 64, "trace_dir": None}
    for kwargs, message in (({"batch": 2**64}, r"batch is out of range"),
                            ({"schedule": (0, 0, -1, 1)}, r"schedule.active must be from 1 to 1000"),
                            ({"schedule": (0, 0, 2**31, 1)}, r"schedule.active is out of range"),
                            ({"schedule": (0, 1)}, r"schedule must be"),
                            ({"threads": 5000}, r"threads must be from 0 to 4096"),
                            ({"check_rows": -5}, r"check_rows must be from 1"),
                            ({"unprofiled_calls": -1}, r"unprofiled_calls must be from 0"),
                            ({"seed": -1}, r"seed is out of range")):
        with pytest.raises(attnprof.Error, match=message):
            attnprof.compare(**{**small, **kwargs})


def test_colliding_outputs_are_refused_before_any_work(tmp_path):
    trace = tmp_path / "traces" / "1_1_64_64_flash.json"
    with pytest.raises(attnprof.Error, match=r"same file as the flash trace"):
        attnprof.compare(batch=1, heads=1, seq=64, backends=["flash"], trace_dir=str(tmp_path / "traces"),
                         json_path=str(trace))
    assert not (tmp_path / "traces" / "1_1_64_64_flash.txt").exists()


def test_keyboard_interrupt_stops_a_long_call_and_leaves_nothing(tmp_path):
    import os
    import signal
    import threading
    import time

    # A call that finishes first: what the library keeps between calls (its mask cache) is not the interrupt's.
    attnprof.compare(batch=1, heads=2, seq=128, head_dim=64, backends=["naive"], trace_dir=None,
                     schedule=(0, 0, 1, 1), threads=1)
    gc.collect()
    before = _core.allocated_bytes("cpu")
    timer = threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            # 10000 steps of naive: minutes, unless the interrupt stops it.
            attnprof.compare(batch=1, heads=2, seq=128, head_dim=64, backends=["naive"],
                             trace_dir=str(tmp_path / "traces"), json_path=str(tmp_path / "o.json"),
                             schedule=(0, 0, 1000, 10), threads=1)
    finally:
        timer.cancel()
    assert time.monotonic() - start < 30
    left = [p.name for p in tmp_path.rglob("*") if p.is_file()]
    assert left == [], f"an interrupted call left {left}"
    gc.collect()
    assert _core.allocated_bytes("cpu") == before


# The library names fields as Python's keywords are spelled, never the CLI's flags.
FIELD_CASES = {
    "batch": ({"batch": -1}, r"^batch must be positive, got -1$"),
    "batch zero": ({"batch": 0}, r"^batch must be positive, got 0$"),
    "heads": ({"heads": 0}, r"^heads must be positive"),
    "head_dim": ({"head_dim": 300}, r"^head_dim 300 is above the largest supported, 256$"),
    "kv_heads": ({"heads": 8, "kv_heads": 3}, r"^kv_heads 3 must divide heads 8"),
    "seq": ({"seq": 1 << 30}, r"^seq 1073741824 is beyond"),
    "kv_seq": ({"kv_seq": 0}, r"^kv_seq must be positive"),
    "window": ({"mask": "causal", "window": 8}, r"^window applies only to mask=sliding-window$"),
    "deterministic": ({"deterministic": True}, r"^deterministic applies to the backward \(pass=backward or train\)"),
    "pass": ({"pass_": "sideways"}, r"^unknown pass 'sideways': use forward, backward or train$"),
    "device": ({"device": "tpu"}, r"^unknown device 'tpu': use cpu or cuda"),
    "mask": ({"mask": "diagonal"}, r"^unknown mask 'diagonal'"),
    # issue 22 item 3: a soft cap of zero or less, or not a finite number; None is no cap.
    "softcap zero": ({"softcap": 0}, r"^softcap must be positive \(scores become tanh\(s / c\) \* c; leave it out"),
    "softcap negative": ({"softcap": -30.0}, r"^softcap must be positive"),
    "softcap nan": ({"softcap": float("nan")}, r"^softcap must be a finite number"),
    "softcap inf": ({"softcap": float("inf")}, r"^softcap must be a finite number"),
    "softcap text": ({"softcap": "thirty"}, r"^softcap must be a number, got str 'thirty'$"),
    # issue 20 item 12: 2^64 scores, refused by field before an estimate can wrap past 64 bits.
    "scores": ({"batch": 1024, "heads": 1024, "seq": 1 << 22, "kv_seq": 1 << 22, "head_dim": 256},
               r"^batch x heads x seq x kv_seq is 1.84e\+19 attention scores"),
}


@pytest.mark.parametrize("case", list(FIELD_CASES))
def test_errors_name_fields_not_flags(case):
    kwargs, message = FIELD_CASES[case]
    with pytest.raises(attnprof.Error, match=message) as info:
        attnprof.explain(**kwargs)
    assert "--" not in str(info.value), str(info.value)


def test_the_cli_spellings_are_taken_too():
    # One parser: "gpu" and "cuda:0" for cuda (the CLI took one, Python the other), '-' or '_' in mask names.
    def problem(**kw):
        args = dict(batch=1, heads=2, kv_heads=None, seq=64, kv_seq=None, head_dim=32, dtype="fp32", device="cpu",
                    mask="causal", window=None, scale=None)
        args.update(kw)
        return _core.Problem(**args)

    for device in ("cuda", "cuda:0", "gpu"):
        assert problem(device=device).describe().endswith("on cuda")
    for mask in ("sliding-window", "sliding_window"):
        assert "sliding-window 8" in problem(mask=mask, window=8).describe()
    with pytest.raises(attnprof.Error, match=r"^unknown layout 'sbhd': use bhsd"):
        attnprof.attention(*arrays(), layout="sbhd")


def test_backend_lists_agree_with_their_checks():
    # issue 20 item 11, in Python: compare's backends name backends (auto is profile's and attention's).
    with pytest.raises(attnprof.Error, match=r"auto is not a backend to list in backends") as info:
        attnprof.compare(backends=["auto"], seq=64, trace_dir=None)
    assert ", auto" not in str(info.value)
    with pytest.raises(attnprof.Error, match=r"unknown backend 'turbo' in backends: use naive"):
        attnprof.compare(backends=["naive", "turbo"], seq=64, trace_dir=None)
    with pytest.raises(attnprof.Error, match=r"unknown backend 'turbo': use naive.*, auto$"):
        attnprof.profile("turbo", seq=64, trace_dir=None)
    with pytest.raises(attnprof.Error, match=r"unknown backend 'turbo' in expect"):
        attnprof.compare(backends=["naive"], expect={"turbo": 3}, seq=64, trace_dir=None)


def test_defaults_are_the_librarys():
    import inspect

    d = _core.defaults()
    sig = inspect.signature(attnprof.compare).parameters
    for name in ("seq", "head_dim", "dtype", "mask", "seed", "check_rows", "unprofiled_calls", "schedule", "sort_by"):
        assert sig[name].default == d[name], name
    assert d["seq"] == 1024 and d["head_dim"] == 64 and d["dtype"] == "bf16" and d["schedule"] == (0, 1, 3, 1)


torch = pytest.importorskip("torch")


TORCH_CASES = {
    "wrong rank": (lambda: (torch.ones(2, 16, 32), torch.ones(1, 2, 16, 32), torch.ones(1, 2, 16, 32)),
                   r"q must be 4-d"),
    "float64": (lambda: tuple(torch.ones(1, 2, 16, 32, dtype=torch.float64) for _ in range(3)), r"is float64"),
    "mixed dtypes": (lambda: (torch.ones(1, 2, 16, 32), torch.ones(1, 2, 16, 32),
                              torch.ones(1, 2, 16, 32, dtype=torch.bfloat16)), r"q is fp32 but v is bf16"),
    "strided head_dim": (lambda: (torch.ones(1, 2, 32, 16).transpose(2, 3), torch.ones(1, 2, 16, 32),
                                  torch.ones(1, 2, 16, 32)), r"strided head_dim"),
    "mixed with numpy": (lambda: (torch.ones(1, 2, 16, 32), np.ones((1, 2, 16, 32), np.float32),
                                  torch.ones(1, 2, 16, 32)), r"pass torch tensors throughout"),
}


@pytest.mark.parametrize("case", list(TORCH_CASES))
def test_bad_torch_input_raises_one_error(case):
    make, message = TORCH_CASES[case]
    before = _core.allocated_bytes("cpu")
    with pytest.raises(attnprof.Error, match=message):
        attnprof.attention(*make())
    assert _core.allocated_bytes("cpu") == before


def test_custom_op_reports_the_same_error():
    q = torch.ones(1, 2, 16, 32, dtype=torch.float64)
    with pytest.raises(attnprof.Error, match=r"is float64"):
        torch.ops.attnprof.attention(q, q, q) if hasattr(torch.ops, "attnprof") and hasattr(
            torch.ops.attnprof, "attention") else attnprof.torch_ops().attention(q, q, q)


def test_a_device_attnprof_does_not_take():
    """The meta device by name (it holds no data), whichever tensor is on it, with or without gradients."""
    meta = torch.ones(1, 2, 16, 32, device="meta")
    cpu = torch.ones(1, 2, 16, 32)
    for args, name in (((meta, meta, meta), "q"), ((cpu, meta, cpu), "k"), ((cpu, cpu, meta), "v"),
                       ((meta.requires_grad_(), meta, meta), "q")):
        with pytest.raises(attnprof.Error, match=rf"^{name} is on the meta device, which holds no data") as e:
            attnprof.attention(*args)
        assert "\n" not in str(e.value) and "DLPack" not in str(e.value)
    with pytest.raises(attnprof.Error, match=r"^attn_mask is on the meta device"):
        attnprof.attention(cpu, cpu, cpu, attn_mask=torch.ones(1, 1, 1, 16, dtype=torch.bool, device="meta"),
                           backend="flash")


# ---- issue 57 item 9: each refusal names the right thing, in one line ----

def _refused(message, **kwargs):
    q = kwargs.pop("q", None)
    q = q if q is not None else torch.randn(2, 2, 8, 16)
    with pytest.raises(attnprof.Error, match=message) as e:
        attnprof.attention(q, kwargs.pop("k", q), kwargs.pop("v", q), **kwargs)
    assert "\n" not in str(e.value), str(e.value)
    return str(e.value)


def test_rows_of_the_wrong_rank_name_the_shapes_rows_take():
    for name in ("q_rows", "kv_rows"):
        text = _refused(rf"^{name} must be int32 \[B, 2\] = \[2, 2\], each sequence's \(begin, end\) rows.*"
                        r"got 1-d \[2\]$", backend="flash", mask="none",
                        **{name: torch.tensor([8, 5], dtype=torch.int32)})
        assert "pages_per_seq" not in text
        assert ("key ends" in text) == (name == "kv_rows")


@pytest.mark.parametrize("backend", ["naive", "math", "naive_inplace"])
def test_rows_on_a_backend_without_them_say_so(backend):
    rows = torch.tensor([[0, 8], [0, 5]], dtype=torch.int32)
    # The runner's one answer for a problem in a layout (eligibility_of), with the backends that take it.
    text = _refused(rf"^backend {backend} cannot run this problem: {backend} on cpu reads no per-sequence rows, "
                    r"which layout padded \(kv_rows\) gives every run; eligible here: flash$",
                    backend=backend, mask="none", kv_rows=rows)
    assert "seq_lens" not in text
    # A key-padding mask beside a mask name is lowered to rows: the same refusal.
    _refused(rf"^backend {backend} cannot run this problem: {backend} on cpu reads no per-sequence rows",
             backend=backend, mask="causal",
             attn_mask=torch.tensor([[True] * 8, [True] * 5 + [False] * 3]))


@pytest.mark.parametrize("shape", [(3, 8), (2, 9), (2, 1, 1, 9), (1, 1, 1, 8)])
def test_a_key_padding_mask_of_the_wrong_shape_beside_a_mask_name_names_the_shape(shape):
    text = _refused(rf"^attn_mask \[{', '.join(map(str, shape))}\] beside mask='causal' is not a key-padding mask "
                    r"of this batch: bool \[B, Skv\] = \[2, 8\]", backend="flash", mask="causal",
                    attn_mask=torch.ones(shape, dtype=torch.bool))
    assert "exclusive" not in text


@pytest.mark.parametrize("field", ["max_seqlen_q", "max_seqlen_k"])
def test_max_seqlen_out_of_range_is_named_with_its_limit(field):
    q = torch.randn(10, 2, 16)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    given = dict(max_seqlen_q=6, max_seqlen_k=6)
    given[field] = 2**40
    for arrays in ((q, cu), (q.numpy(), cu.numpy())):
        x, c = arrays
        with pytest.raises(attnprof.Error, match=rf"^{field} is 1099511627776: out of range, at most 4194304") as e:
            attnprof.attention(x, x, x, cu_seqlens_q=c, cu_seqlens_k=c, **given)
        assert "seq 1099511627776" not in str(e.value) and "\n" not in str(e.value)


def test_module_uses_the_shared_cxx_runtime():
    """The module links the process's libstdc++ rather than carrying its own copy.

    A statically linked copy met the shared one numpy and torch load, and the
    first number formatted into an error message crashed (SIGSEGV in
    std::ostream::_M_insert<long>, on the H200 machine's nanobind build). A
    static copy defines the runtime's own functions, std::locale::classic()
    among them; a module on the shared runtime only refers to them.
    """
    import shutil
    import subprocess

    nm = shutil.which("nm")
    assert nm, "nm (binutils, installed with g++) is needed to read the module's symbols"
    defined = subprocess.run([nm, "-D", "--defined-only", _core.__file__], capture_output=True, text=True,
                             check=True).stdout
    assert "_ZNSt6locale7classicEv" not in defined, "libstdc++ is linked statically into " + _core.__file__


def test_softcap_is_taken_and_shown():
    # issue 22 item 3: the CPU backends take a cap, and the problem says so.
    ex = attnprof.explain(batch=1, heads=2, seq=64, head_dim=32, dtype="fp32", softcap=30)
    text = str(ex)
    for name in ("naive", "naive_inplace", "math", "flash"):
        line = next(l for l in text.splitlines() if l.startswith(name + " "))
        assert "not eligible" not in line, line
    p = _core.Problem(batch=1, heads=2, kv_heads=None, seq=64, kv_seq=None, head_dim=32, dtype="fp32", device="cpu",
                      mask="causal", window=None, scale=None, softcap=2.5)
    assert "soft cap 2.5" in p.describe()
    assert p.file_stem() == "1_2_64_32_softcap2.5"
    assert '"softcap": 2.5' in p.json()
