"""attnprof in Python: attention on your own tensors, and the profiler's reports as objects.

    import torch, attnprof
    q, k, v = (torch.randn(2, 8, 256, 64, dtype=torch.bfloat16) for _ in range(3))
    out = attnprof.attention(q, k, v, backend="flash", mask="causal")
    report = attnprof.compare(batch=2, heads=8, seq=256, head_dim=64)
    print(report)                      # the table `attnprof compare` prints
    report.results[0].findings[0].rule

The work is the C++ library's (attnprof._core); this package only moves
arguments in and records out. torch is imported only when a torch tensor
arrives or attnprof.torch_ops() is called, so `import attnprof` works without it.
"""

from __future__ import annotations

import sys as _sys

from . import _args, _core, _key_padding, _options
from ._args import ArgumentTypeError
from ._core import Error
from ._records import Explanation, Finding, Record, Report, Result
from ._analyze import Analysis, Diff, analyze, diff
from . import dropin as _dropin
from .dropin import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache, scaled_dot_product_attention
from ._plan import Plan, plan
from ._commands import compare, explain, profile

__all__ = [
    "Analysis",
    "ArgumentTypeError",
    "Diff",
    "Error",
    "Explanation",
    "Finding",
    "Plan",
    "Record",
    "Report",
    "Result",
    "analyze",
    "attention",
    "backend_names",
    "compare",
    "cuda_built",
    "diff",
    "explain",
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "plan",
    "profile",
    "quantize_fp8",
    "scaled_dot_product_attention",
    "torch_ops",
]


def backend_names() -> list[str]:
    """Every backend, in display order (and "auto" picks among the eligible ones)."""
    return _core.backend_names()


def cuda_built() -> bool:
    """Whether this build has the CUDA backends."""
    return _core.cuda_built()


_INT32, _INT64 = _args.INT32, _args.INT64
_whole, _real = _args.whole, _args.real


def _descale(name: str, value):
    """An FP8 descale: a number (checked here), or a 1-element tensor or array. One on a GPU is passed on as it
    is, for the kernels alone to read on the caller's stream (no host read, no synchronisation: issue 56); one
    in host memory is read here as its number."""
    if value is None:
        return None
    if hasattr(value, "shape") and hasattr(value, "item"):
        size = 1
        for n in value.shape:
            size *= int(n)
        if size != 1:
            raise Error(f"{name} must be a number or a 1-element tensor, got shape {tuple(value.shape)}")
        device = getattr(value, "device", None)
        if device is not None and getattr(device, "type", "cpu") != "cpu":
            if getattr(value, "requires_grad", False):
                value = value.detach()
            return value  # the binding checks its dtype (float32) and device (q's)
        value = value.reshape(()).item() if hasattr(value, "reshape") else value.item()
    return _real(name, value)


def quantize_fp8(t):
    """A float torch tensor as float8_e4m3fn with its per-tensor descale, as attnprof's FP8 runs quantize.

    descale = amax / 448 (1 for an all-zero tensor), so the largest |value| is stored as e4m3's
    largest finite value; stored = t / descale rounded to nearest even. Returns (t8, descale) with
    t8 * descale the values attention() computes with: attention(q8, k8, v8, q_descale=qs, ...).
    A tensor holding NaN or inf is refused: e4m3 has no infinity, and an inf amax would make the
    descale inf and every stored value 0 (a NaN, the descale NaN).
    """
    import torch

    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise Error(f"quantize_fp8 takes a floating torch tensor, got {type(t).__name__}")
    x = t.detach().float()
    finite = torch.isfinite(x)
    if not bool(finite.all()):
        bad = x[~finite]
        raise Error(f"quantize_fp8: t holds {bad.numel()} non-finite value(s) (first {float(bad[0])}): "
                    "quantize finite values (e4m3 has no infinity and the descale would not be finite)")
    amax = float(x.abs().max()) if x.numel() else 0.0
    descale = amax / 448.0 if amax > 0 else 1.0
    # torch's cast turns values past 448 into NaN: the clamp saturates, as the tensor cores do.
    return (x / descale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn), descale


# torch.Tensor and attnprof._torch.attention once torch is imported
# (_torch_ready() imports attnprof._torch): attention() then tells a torch
# call by one isinstance and calls the torch path with no import statement.
_torch_tensor = None
_torch_attention = None
_torch_module = None  # attnprof._torch: its fast path (_fast) and the checks it needs


def _torch_ready() -> bool:
    """Whether torch is imported; if so, the torch front above is set. torch.compile runs it at trace time and takes
    its result as a constant (the mark below, as torch.compiler.assume_constant_result sets it: attnprof/_torch.py):
    the front is then set before the trace reads it. Read unset inside a first compiled call, it would be a guard
    that fails at the next call, compiling the graph again."""
    global _torch_tensor, _torch_attention, _torch_module
    if _torch_tensor is None:
        if "torch" not in _sys.modules:
            return False
        from . import _torch

        _torch_tensor, _torch_attention, _torch_module = _torch.torch.Tensor, _torch.attention, _torch
    return True


_torch_ready._dynamo_marked_constant = True


def _check_arrays(*arrays):
    # What nanobind would refuse with a message about the whole call, said of the one array: numpy's object
    # arrays (they export no DLPack) and a read-only out.
    for name, x in zip(("q", "k", "v", "out", "attn_mask", "block_table", "seq_lens", "q_rows", "kv_rows"), arrays):
        if getattr(getattr(x, "dtype", None), "kind", None) == "O":
            raise Error(f"{name} is an array of Python objects (dtype object): use float32, float16 or bfloat16")
    if len(arrays) > 3:
        _writable_out(arrays[3])


def _writable_out(out):
    """A read-only out (numpy's writeable flag off) refused in one line, before nanobind's refusal of the call."""
    if getattr(getattr(out, "flags", None), "writeable", True) is False:
        raise Error("out is read-only (its writeable flag is off): pass an array attnprof may write, or no out")


def attention(q, k, v, *, backend: str = "auto", mask: str | None = None, window: int | tuple[int, int] | None = None,
              scale: float | None = None, layout: str = "bhsd", out=None, threads: int = 0,
              deterministic: bool = False, softcap: float | None = None, attn_mask=None, block_table=None,
              seq_lens=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q: int | None = None,
              max_seqlen_k: int | None = None, q_descale=None, k_descale=None, v_descale=None, q_rows=None,
              kv_rows=None, check_inputs: bool = False, return_lse: bool = False):
    """softmax(scale * q k^T + mask) v, computed by an attnprof backend on the caller's arrays.

    mask names a structural mask ("none", "causal", "causal_bottom_right",
    "sliding_window" with window=N); None is "causal" (the study's default,
    as the CLI's; the drop-in entry points keep their sources' default of no
    mask), or, with attn_mask, the tensor alone. window=(left, right) is a
    band instead: query i sees the keys from left before its diagonal to
    right after it, -1 unbounded, the diagonal the bottom-right one (mask
    None) or the top-left one (mask="causal"); (-1, 0) is causal, (-1, -1)
    no mask, (w - 1, 0) the bottom-right sliding window of w keys. The core's
    masks end at the diagonal, so a band past it (right > 0) is refused by
    name, as is a bounded left from the top-left diagonal. attn_mask is a tensor mask as SDPA's attn_mask:
    boolean (True attends) or an additive float in q's dtype, broadcastable
    to [B, H, S, Skv] (always that order, whatever the layout; size-1 and
    missing leading dimensions broadcast), on q's device; a mask name beside
    it is refused (the tensor is the whole mask), except a key-padding mask
    (bool [B, Skv] or [B, 1, 1, Skv], each row one run of Trues: right or
    left padding), which is lowered to q_rows/kv_rows. With no mask name,
    flash takes a [B, 1, 1, Skv] key-padding mask as mask "none" with
    kv_rows, SDPA's answer (a padded query row attends its sequence's valid
    keys; a sequence with none gives zeros); on CUDA flash reads no other
    boolean mask (a row with holes is refused in the checking mode, and not
    read on the host otherwise), cudnn takes boolean and float ones. The mask
    gets no gradient, and like the rows it is saved for the backward: one
    rewritten in place before backward() is refused, as torch refuses its own.

    A padded batch as rows: q_rows and kv_rows, int32 [B, 2] on q's device,
    each sequence's (begin, end) query and key rows (or the core's own
    [1, 1, B, 2]); kv_rows also as key ends alone, [B, 1] or [1, 1, B, 1]
    (begin 0). The mask applies within each sequence's rows; rows outside
    them give zeros. flash reads rows; other backends refuse them by name.

    A paged KV cache, as serving engines call attention: k and v are the
    caches [num_pages, Hkv, page_size, D] (vLLM's layout), block_table int32
    [B, pages_per_seq] each sequence's pages, seq_lens int32 [B] its keys
    (at most pages_per_seq * page_size); mask="causal_bottom_right" aligns
    each sequence's queries to the end of its own keys. Inference only.
    Unequal seq_lens run on flash (CPU and CUDA) and cudnn (CUDA); backends
    with one length for every sequence refuse them by name. A CUDA block table and lengths are
    read only by the kernels, on the device in the stream's order (no copy
    to the host, no synchronisation): a length outside 0 .. the table's
    keys is clamped and a page index outside the cache masks that page's
    keys, and the call goes on. check_inputs=True (or the environment's
    ATTNPROF_CHECK_INPUTS=1) reads them on the host first, in the stream's
    order, and refuses the first bad entry by name, as the CPU always does
    (ATTNPROF_CHECK_INPUTS: anything but empty or "0", as the core reads it).

    A packed (variable-length) batch, as flash_attn_varlen_func takes one:
    q [total_q, H, D], k and v [total_k, Hkv, D], cu_seqlens_q and
    cu_seqlens_k the int32 cumulative lengths (batch + 1 entries from 0, on
    q's device), max_seqlen_q/_k at least every length (None: the longest).
    The mask applies per sequence (causal, causal-bottom-right and the window
    at each sequence's own diagonal); layout is ignored. flash, naive,
    naive_inplace and math take it on both devices and cudnn on CUDA, forward
    and autograd backward; efficient refuses it by name.

    softcap=c soft-caps the scaled scores before the mask, s -> tanh(s / c) * c
    (Gemma-2's logits): flash (on CUDA its sm90 kernels), naive, naive_inplace,
    math and cudnn (dense batches) take it, others refuse it by name; None is
    no cap; c lies from 2^-60 to 2^60, to 2^10 for fp16 (the kernels hold c
    and 1/c as floats; attnprof/limits.h).

    q is [B, H, S, D], k and v [B, Hkv, Skv, D] (layout="bshd": [B, S, H, D]
    and [B, Skv, Hkv, D]); any batch, head and sequence strides (views such
    as x.transpose(1, 2)), head_dim contiguous. torch tensors (CPU or CUDA)
    or any DLPack array (numpy on the CPU). Nothing is copied: the kernels
    read q, k, v where they are and write into `out`, allocated here with
    the input's own framework (torch.empty, numpy.empty) unless given. CUDA
    work is queued on torch's current stream. Bad input raises attnprof.Error
    (a ValueError) with the library's message, one line naming the argument;
    an argument of the wrong type (a bool for a number, None for a name)
    raises attnprof.ArgumentTypeError, an attnprof.Error that is also a
    TypeError. threads sets the CPU's thread count for the call only: the
    process's (torch.get_num_threads()) is as it was when it returns.

    FP8: q, k and v as torch.float8_e4m3fn tensors (e4m3, as FlashAttention-3 and cuDNN take them)
    with q_descale, k_descale and v_descale (floats or 1-element tensors; None is 1.0): the real
    values are the stored ones times their tensor's descale, each finite and positive. The output
    is bfloat16. Forward only; dense, paged and packed calls. quantize_fp8(t) makes (t8, descale)
    from a float tensor. The composites (naive, naive_inplace, math) compute in FP32 after
    dequantizing; flash on the CPU multiplies the stored values in its bf16 products (the descales
    as scales); on CUDA flash (sm90, head dim 128, dense) and cudnn take it; others say whether they
    do. A descale with inputs of another dtype is refused.

    return_lse=True returns (out, lse): lse the FP32 natural log of each
    query row's sum of exp(scaled scores), [B, H, S] ([H, total_q] for a
    packed batch), -inf for a row that sees no key, with no gradient; it comes
    from the forward that keeps it (flash, efficient, cudnn; not a paged cache
    or FP8), refused by name elsewhere.

    torch tensors that require grad (with grad enabled) go through
    torch.ops.attnprof.attention with return_lse=True, whose autograd is
    torch.ops.attnprof.attention_backward, attnprof's own
    backward (flash, efficient, cudnn: the backends that keep only the
    log-sum-exp); deterministic=True sums dQ in a fixed order on a GPU.
    """
    if check_inputs is not False:
        given = locals()  # the arguments alone: nothing else is bound yet
        if _args.flag("check_inputs", check_inputs):
            # The checking mode for this thread while the call is prepared (attnprof/check_inputs.h).
            previous = _core._exchange_checking_inputs(1)
            try:
                return attention(**{name: value for name, value in given.items() if name != "check_inputs"})
            finally:
                _core._exchange_checking_inputs(previous)
    # Each check costs a call only when the value is not the common one: a
    # repeated call's host time is what a model pays per layer
    # (bench/python_overhead.py times it piece by piece).
    bshd = _LAYOUTS.get(layout) if layout.__class__ is str else None
    if bshd is None:
        bshd = _is_bshd(_args.text("layout", layout))
    if backend.__class__ is not str:
        backend = _args.text("backend", backend)
    if threads.__class__ is not int or not _INT32[0] <= threads <= _INT32[1]:
        threads = _whole("threads", threads)
    if mask is not None and mask.__class__ is not str and not isinstance(mask, str):
        raise ArgumentTypeError(f"mask names a structural mask (a string); a mask tensor goes in attn_mask=, got "
                                f"{type(mask).__name__}")
    if window is not None:
        if isinstance(window, (tuple, list)):
            mask, window = _options.band(mask, window)
        else:
            window = _whole("window", window, _INT64)
    if scale is not None and scale.__class__ is not float:
        scale = _real("scale", scale)
    if softcap is not None and softcap.__class__ is not float:
        softcap = _real("softcap", softcap)
    if deterministic is not False and deterministic is not True:
        deterministic = _args.flag("deterministic", deterministic)
    if return_lse is not False:
        return_lse = _args.flag("return_lse", return_lse)
    packed = cu_seqlens_q is not None or cu_seqlens_k is not None
    if mask is None:
        mask = "causal" if packed else ""
    if q_descale is not None or k_descale is not None or v_descale is not None:
        q_descale, k_descale, v_descale = (_descale(n, d) for n, d in (("q_descale", q_descale),
                                                                       ("k_descale", k_descale),
                                                                       ("v_descale", v_descale)))
    if packed:
        _check_arrays(q, k, v, out, attn_mask, block_table, seq_lens)
        if attn_mask is not None or block_table is not None or seq_lens is not None:
            raise Error("a packed batch (cu_seqlens_q, cu_seqlens_k) takes structural masks only: no attn_mask, "
                        "block_table or seq_lens")
        if q_rows is not None or kv_rows is not None:
            raise Error(f"{'q_rows' if q_rows is not None else 'kv_rows'} with a packed batch (cu_seqlens): its "
                        "sequences already have their own rows")
        if cu_seqlens_q is None or cu_seqlens_k is None:
            raise Error("a packed batch needs both cu_seqlens_q and cu_seqlens_k")
        max_seqlen_q = _whole("max_seqlen_q", max_seqlen_q, _INT64, optional=True)
        max_seqlen_k = _whole("max_seqlen_k", max_seqlen_k, _INT64, optional=True)
    elif max_seqlen_q is not None or max_seqlen_k is not None:
        raise Error("max_seqlen_q and max_seqlen_k go with cu_seqlens_q and cu_seqlens_k (a packed batch)")
    if _torch_ready() and isinstance(q, _torch_tensor):
        t = _torch_module
        if t._fast is not None and attn_mask is None and q_descale is None and k_descale is None \
                and v_descale is None and not packed and not return_lse and not t._is_compiling() \
                and (out is not None or not t._profiling()):
            # The fast path (attnprof._torch_call) reads the tensors in C++, a paged cache's block table and
            # lengths and a padded batch's rows included; None for what it does not take (autograd, another
            # type or device), which the general path answers for. It takes attention()'s every plain option
            # by name, as _core lists them (a TypeError for one left out).
            done = t._fast(q, k, v, out, threads, block_table, seq_lens, q_rows, kv_rows, backend=backend, mask=mask,
                           window=window, scale=scale, bshd=bshd, softcap=softcap)
            if done is not None:
                return done
    # Every option once, in the table's names (attnprof/_options.py): the torch and numpy paths read them there.
    o = dict(backend=backend, mask=mask, window=window, scale=scale, bshd=bshd, softcap=softcap, attn_mask=attn_mask,
             block_table=block_table, seq_lens=seq_lens, q_descale=q_descale, k_descale=k_descale,
             v_descale=v_descale, q_rows=q_rows, kv_rows=kv_rows, cu_seqlens_q=cu_seqlens_q,
             cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
             deterministic=deterministic)
    if _torch_tensor is not None and isinstance(q, _torch_tensor):
        return _torch_attention(q, k, v, out, threads, return_lse, o)
    _check_arrays(q, k, v, out, attn_mask, block_table, seq_lens, q_rows, kv_rows)
    if attn_mask is not None and block_table is None and seq_lens is None:
        # A key-padding attn_mask as rows, on the host, as torch tensors are lowered (attnprof/_key_padding.py).
        o["mask"], o["attn_mask"], o["q_rows"], o["kv_rows"] = _key_padding.lower(q, k, attn_mask, mask, bshd,
                                                                                  backend, q_rows, kv_rows)
    if out is None:
        out = _empty_like(q)
    try:
        lse = _options.forward(q, k, v, out, o, 0, threads, return_lse)
    except TypeError as e:
        del out
        raise Error(not_an_array(e)) from None
    except BaseException:
        del out  # a refused call leaves nothing allocated, even while the traceback lives
        raise
    return (out, _host_array(lse)) if return_lse else out


class _Capsule:
    """The library's DLPack capsule of a host array, as numpy.from_dlpack takes one (an object with __dlpack__)."""

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, **_):
        return self.capsule

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU: a call on numpy arrays runs on the host


def _host_array(capsule):
    """The library's log-sum-exp as a numpy array (a host call's arrays are numpy's)."""
    import numpy

    return numpy.from_dlpack(_Capsule(capsule))


# The layouts as the library parses them, read once: a call into _core here
# would break torch.compile's graph. Anything else gets the library's refusal.
_LAYOUTS = {name: _core.is_bshd(name) for name in ("bhsd", "bshd")}


def _is_bshd(layout: str) -> bool:
    bshd = _LAYOUTS.get(layout)
    return _core.is_bshd(layout) if bshd is None else bshd


def not_an_array(e: TypeError) -> str:
    # nanobind refused an argument before the library saw it.
    return ("attnprof.attention takes CPU or CUDA arrays that export DLPack (torch tensors, numpy arrays), "
            f"writable for out: {str(e).splitlines()[0]}")


def _empty_like(q):
    """An uninitialised array of q's kind, shape and dtype (numpy, or the array's own module)."""
    if hasattr(q, "shape") and hasattr(q, "dtype"):
        module = _sys.modules.get(type(q).__module__.split(".")[0])
        empty = getattr(module, "empty", None)
        if empty is not None:
            try:
                return empty(q.shape, dtype=q.dtype)
            except TypeError:
                pass
    raise Error(f"attnprof.attention takes torch tensors or DLPack arrays with a shape and dtype; got {type(q).__name__}")


def torch_ops():
    """Registers torch.ops.attnprof.attention (imports torch) and returns torch.ops.attnprof."""
    from . import _torch

    return _torch.ops()


_dropin._front = attention  # the drop-ins' front (attnprof/dropin.py says why at import)
