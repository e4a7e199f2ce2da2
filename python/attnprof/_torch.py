"""The PyTorch side, imported only once a torch tensor arrives: two torch.library custom ops, each with a fake
implementation so that torch.compile traces it whole, and the eager path of attnprof.attention on torch tensors.

torch.ops.attnprof.attention(q, k, v, <options>, return_lse=False) -> (out, lse) is every forward: dense, padded
rows, packed (cu_seqlens_q/_k) and paged (block_table, seq_lens) in one schema of optional tensors, the options
those of attnprof/_options.py's table. lse is the FP32 log-sum-exp of each query row ([B, H, S], [H, total_q]
packed) where return_lse=True, else an empty tensor: it is kept only where asked for (the training forward keeps
it; the inference forward writes none). Its autograd is torch.ops.attnprof.attention_backward(dout, q, k, v, out,
lse, <options>) -> (dq, dk, dv), attnprof's own backward, for a forward that kept its log-sum-exp."""

from __future__ import annotations

import contextlib

import torch
import torch.utils.dlpack

from . import _args, _key_padding, _options
from ._core import Error


# The caller's current stream as a cudaStream_t: the raw getter PyTorch's own
# compiled code uses (no Stream object made per call), else the public one.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream_of(t: torch.Tensor) -> int:
    # get_device() is the index as an int (-1 on the CPU): no torch.device
    # object is made per call, which halved this lookup on the H200.
    index = t.get_device()
    if index < 0:
        return 0
    if _raw_stream is not None:
        return _raw_stream(index)
    return torch.cuda.current_stream(index).cuda_stream


_is_compiling = torch.compiler.is_compiling
# torch.compile reads the checking mode as a constant of its trace (a call into attnprof._core would break the
# graph), as the environment it mostly comes from is one: marked once here, never inside traced code. The mark is
# the attribute torch.compiler.assume_constant_result sets, set without it: that function imports torch._dynamo
# (1.4 s), which a program that never compiles would pay at its first torch call. The test
# test_torch_cpu.py::test_the_checking_mode_is_marked_as_dynamo_marks_a_constant fails if torch marks otherwise.
_key_padding.checking_inputs._dynamo_marked_constant = True
_Tensor = torch.Tensor
# Under torch.profiler the eager call goes through torch.ops.attnprof.attention,
# so the trace holds the op with its shapes (attnprof analyze reads it).
_profiling = torch.autograd._profiler_enabled


def _labelled(o):
    """Under torch.profiler, a range inside the op (its implementation opens it, so a call from a compiled graph
    and one captured into a CUDA graph have it too) naming what its string arguments cannot keep in a trace (torch
    records them empty): `attnprof analyze` reads the mask and backend from it (src/analysis/attention_op_args.cpp).
    A no-op otherwise."""
    if not _profiling():
        return contextlib.nullcontext()
    backend, mask, window, attn_mask = o["backend"], o["mask"], o["window"], o["attn_mask"]
    name = mask or ("causal" if attn_mask is None else "boolean" if attn_mask.dtype == torch.bool else "bias")
    return torch.profiler.record_function(f"attnprof.attention backend={backend} mask={name} window={window or 0}")


# DLPack capsules through torch's C exporter: ten times cheaper per tensor than
# Tensor.__dlpack__ (a Python method with its own checks, about 5 us), and the
# same borrowed view of the same memory. It exports a lazily negated view (torch's
# negative bit, as .conj().imag makes one) as its memory, the sign lost: refused.
_torch_to_dlpack = torch.utils.dlpack.to_dlpack
_NEGATED = "a lazily negated view (torch's negative bit, as .conj().imag makes one), which DLPack cannot carry"


def _to_dlpack(t):
    if isinstance(t, _Tensor) and t.is_neg():
        raise BufferError(_NEGATED)
    return _torch_to_dlpack(t)


def _load_fast():
    """attnprof._torch_call (attention() and Plan.run), the fast path for torch tensors (src/bindings/torch_call.cpp),
    where it was built against this very torch; else None. With the reason, for fast_path."""
    try:
        from . import _torch_call
    except ImportError as e:
        return None, f"the DLPack path (attnprof._torch_call is not importable: {e})"
    if _torch_call.TORCH_VERSION != torch.__version__:
        return None, (f"the DLPack path (attnprof._torch_call was built against torch {_torch_call.TORCH_VERSION}, "
                      f"this is {torch.__version__}: rebuild attnprof)")
    return _torch_call, f"attnprof._torch_call (built against torch {_torch_call.TORCH_VERSION})"


_torch_call, fast_path = _load_fast()
_fast_attention = _torch_call.attention if _torch_call is not None else None
_fast_plan_run_loaded = _torch_call.plan_run if _torch_call is not None else None
_fast = _fast_attention  # None: every call takes the DLPack path (_use_fast)
_fast_plan_run = _fast_plan_run_loaded  # Plan.run's, alike


def _use_fast(on: bool):
    """Off: every call (attention() and Plan.run) takes the DLPack path, as before the extension
    (bench/python_overhead.py compares)."""
    global _fast, _fast_plan_run
    _fast = _fast_attention if on else None
    _fast_plan_run = _fast_plan_run_loaded if on else None


def _on_meta(name) -> Error:
    return Error(f"{name} is on the meta device, which holds no data: attnprof.attention computes on CPU and CUDA "
                 "tensors (torch.ops.attnprof's ops on meta tensors give only the output's shape)")


def _not_exported(e, names, tensors, generic=None) -> Error:
    """The refusal of tensors DLPack could not export: a tensor on the meta device (it holds no data) or a negated
    view by name, else generic(e) (nanobind's or torch's reason, in attention()'s words by default)."""
    for name, t in zip(names, tensors):
        if isinstance(t, _Tensor) and t.is_meta:
            return _on_meta(name)
        if isinstance(t, _Tensor) and t.is_neg():
            return Error(f"{name} is {_NEGATED}: pass {name}.resolve_neg()")
    if generic is not None:
        return generic(e)
    from . import not_an_array

    return Error(not_an_array(e))


def _dlpack(*tensors, names):
    try:
        return tuple(map(_to_dlpack, tensors))
    except (RuntimeError, BufferError, TypeError) as e:  # a device or layout DLPack cannot describe
        raise _not_exported(e, names, tensors) from None


_BACKWARD_NAMES = ("dout", "q", "k", "v", "out", "lse", "dq", "dk", "dv")


def _export(t, name):
    # A tensor option (attn_mask, the rows, the cumulative lengths, the paged cache's indices) as DLPack.
    return _dlpack(t, names=(name,))[0]


_DESCALES = ("q_descale", "k_descale", "v_descale")


def _has_descale_tensors(o):
    return any(isinstance(o[name], _Tensor) for name in _DESCALES)


def _no_descale_tensors(o):
    # The op's schema takes descales as floats: a GPU descale tensor would be read on the host there.
    for name in _DESCALES:
        if isinstance(o[name], _Tensor):
            raise Error(f"{name} as a tensor is read by the kernels of an eager call only; under torch.compile or "
                        "autograd pass a float")


def _out_dtype(dtype):
    # FP8 inputs write a bf16 output, as FlashAttention-3's and cuDNN's FP8 forwards do.
    return torch.bfloat16 if dtype == torch.float8_e4m3fn else dtype


def _lse_shape(q: torch.Tensor, o: dict, keep_lse: bool):
    """The saved log-sum-exp's shape: FP32 [B, H, S] ([H, total_q] for a packed batch); (0,) where not kept."""
    if not keep_lse:
        return (0,)
    if _options.packed(o):
        return (q.shape[1], q.shape[0])
    return (q.shape[0], q.shape[2], q.shape[1]) if o["bshd"] else tuple(q.shape[:3])


def _launch(q, k, v, out, o, threads, keep_lse):
    """The forward of the call `o` describes on q, k, v into out (every layout: dense, rows, packed, paged), on
    torch's current stream; returns the log-sum-exp as a tensor where keep_lse, else None. The exports written
    out and the stream lookup inlined: this is every eager call's path beyond the fast one."""
    try:
        dq, dk, dv, do = _to_dlpack(q), _to_dlpack(k), _to_dlpack(v), _to_dlpack(out)
    except (RuntimeError, BufferError, TypeError) as e:  # a device or layout DLPack cannot describe
        raise _not_exported(e, ("q", "k", "v", "out"), (q, k, v, out)) from None
    index = q.get_device()
    stream = 0 if index < 0 else _raw_stream(index) if _raw_stream is not None else _stream_of(q)
    for name in _DESCALES:
        if isinstance(o[name], _Tensor):  # a GPU descale (attnprof._descale kept it): only the kernels read it
            o[name] = _export(o[name], name)
    lse = _options.forward(dq, dk, dv, do, o, stream, threads, keep_lse, _export)
    return None if lse is None else torch.from_dlpack(lse)


def _forward_impl(q, k, v, *args):
    # args: the options in the table's order, then return_lse; torch leaves a call's trailing defaults out.
    o = _options.of(args[:len(_options.NAMES)])
    keep_lse = len(args) > len(_options.NAMES) and _args.flag("return_lse", args[len(_options.NAMES)])
    out = torch.empty(q.shape, dtype=_out_dtype(q.dtype), device=q.device)
    with _labelled(o):
        lse = _launch(q, k, v, out, o, 0, keep_lse)
    return out, (q.new_empty((0,), dtype=torch.float32) if lse is None else lse)


def _forward_fake(q, k, v, *args):
    # Matches the real outputs: a new contiguous tensor of q's shape and device, q's dtype (bf16 for fp8), and the
    # log-sum-exp's FP32 shape (empty where not kept).
    o = dict(zip(_options.NAMES, tuple(args[:len(_options.NAMES)]) + _options.DEFAULTS[len(args):]))
    keep_lse = bool(args[len(_options.NAMES)]) if len(args) > len(_options.NAMES) else False
    return (q.new_empty(q.shape, dtype=_out_dtype(q.dtype)),
            q.new_empty(_lse_shape(q, o, keep_lse), dtype=torch.float32))


_attention_op = torch.library.custom_op(
    "attnprof::attention", _forward_impl, mutates_args=(), device_types=("cpu", "cuda"),
    schema=_options.schema("Tensor q, Tensor k, Tensor v", "(Tensor, Tensor)", "bool return_lse=False"))
_attention_op.register_fake(_forward_fake)


def _backward_impl(dout, q, k, v, out, lse, *args):
    o = _options.of(args)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    with _labelled(o):
        _options.backward(*_dlpack(dout, q, k, v, out, lse, dq, dk, dv, names=_BACKWARD_NAMES), o, _stream_of(q),
                          _export)
    return dq, dk, dv


def _backward_fake(dout, q, k, v, out, lse, *args):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


_backward_op = torch.library.custom_op(
    "attnprof::attention_backward", _backward_impl, mutates_args=(), device_types=("cpu", "cuda"),
    schema=_options.schema("Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse",
                           "(Tensor, Tensor, Tensor)"))
_backward_op.register_fake(_backward_fake)


def _setup_context(ctx, inputs, output):
    # Every tensor the backward reads is saved through save_for_backward, the mask, rows and cumulative lengths
    # too: autograd then checks their version counters, and a tensor rewritten in place between the forward and
    # backward() is refused ("modified by an inplace operation") rather than read as other values than the
    # forward's.
    q, k, v, *args = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, *(args[i] for i in _options.TENSOR_AT))
    ctx.args = args


def _attention_backward(ctx, dout, _dlse):
    q, k, v, out, lse, *tensors = ctx.saved_tensors
    args = list(ctx.args[:len(_options.NAMES)])
    if len(ctx.args) <= len(_options.NAMES) or not ctx.args[len(_options.NAMES)]:
        raise Error("torch.ops.attnprof.attention keeps what its backward reads only with return_lse=True: for "
                    "gradients call attnprof.attention (or the op with return_lse=True) on tensors that require grad")
    for i, t in zip(_options.TENSOR_AT, tensors):
        args[i] = t
    dq, dk, dv = torch.ops.attnprof.attention_backward(dout.contiguous(), q, k, v, out, lse, *args)
    return (dq, dk, dv) + (None,) * len(ctx.args)  # the options get no gradient (the mask neither)


torch.library.register_autograd("attnprof::attention", _attention_backward, setup_context=_setup_context)


def ops():
    return torch.ops.attnprof


def attention(q, k, v, out, threads, return_lse, o):
    """attnprof.attention on torch tensors, its arguments checked there and gathered in `o` (the options, as
    attnprof/_options.py lists them): the general path, which attention() takes where the fast path (_fast,
    tried there first) does not. Returns out, or (out, lse) where return_lse."""
    if not (isinstance(k, _Tensor) and isinstance(v, _Tensor) and (out is None or isinstance(out, _Tensor))):
        _refuse_mixed(k=k, v=v, out=out)
    paged = o["block_table"] is not None or o["seq_lens"] is not None
    attn_mask = o["attn_mask"]
    if attn_mask is not None and not paged:
        # A key-padding attn_mask as rows, on the mask's device (attnprof/_key_padding.py says when).
        _refuse_mixed(attn_mask=attn_mask)
        o["mask"], o["attn_mask"], o["q_rows"], o["kv_rows"] = _key_padding.lower(
            q, k, attn_mask, o["mask"], o["bshd"], o["backend"], o["q_rows"], o["kv_rows"])
        attn_mask = o["attn_mask"]
    for name in _options.TENSORS:
        t = o[name]
        if t is not None and not isinstance(t, _Tensor):
            _refuse_mixed(**{name: t})
    if attn_mask is not None and attn_mask.requires_grad:
        raise Error("attn_mask requires grad: attnprof's backward gives the mask no gradient (pass attn_mask.detach())")
    needs_grad = q.requires_grad or k.requires_grad or v.requires_grad
    if needs_grad and torch.is_grad_enabled():
        if paged:
            raise Error("a paged KV cache is inference only: call under torch.no_grad() (or detach q and the caches)")
        # Autograd: the op keeps the log-sum-exp, and its backward is attnprof's.
        if out is not None:
            raise Error("out= is not supported when gradients are needed: use the returned tensor")
        for name, t in (("q", q), ("k", k), ("v", v)):
            if t.is_meta:  # the op would run its fake: a result of no values, where a call without grad is refused
                raise _on_meta(name)
        _no_descale_tensors(o)
        out, lse = torch.ops.attnprof.attention(q, k, v, *_options.ordered(o), True)
        return (out, _user_lse(lse.detach())) if return_lse else out  # the log-sum-exp carries no gradient
    if _is_compiling() or (out is None and _profiling() and not _has_descale_tensors(o)):
        # Traced as one node of the graph (its fake gives the outputs' shapes), or recorded as the op by the profiler
        # (descales given as GPU tensors, which the op's schema cannot take, are launched directly: the profiler
        # then records the call's kernels without the op around them).
        if out is not None:
            raise Error("out= is not supported under torch.compile: use the returned tensor")
        _no_descale_tensors(o)
        out, lse = torch.ops.attnprof.attention(q, k, v, *_options.ordered(o), return_lse)
        return (out, _user_lse(lse)) if return_lse else out
    if out is not None and out.requires_grad and torch.is_grad_enabled():
        raise Error("out requires grad, and autograd does not record a write into out= (as torch's out= functions "
                    "refuse it): use the returned tensor, or torch.no_grad()")
    if needs_grad:  # under no_grad
        q, k, v = q.detach(), k.detach(), v.detach()  # views: DLPack refuses to export a tensor that needs grad
    if out is None:
        out = torch.empty(q.shape, dtype=_out_dtype(q.dtype), device=q.device)
    try:
        lse = _launch(q, k, v, out, o, threads, return_lse)
    except TypeError as e:
        del out
        from . import not_an_array

        raise Error(not_an_array(e)) from None
    except BaseException:
        del out  # a refused call leaves nothing allocated, even while the traceback lives
        raise
    return (out, _user_lse(lse)) if return_lse else out


def _user_lse(lse):
    """The log-sum-exp as attention(return_lse=True) documents it: -inf for a row that sees no key. The CUDA fused
    kernels keep +inf there (their backward takes exp(s - lse) = 0 from it), so it is mapped here, out of place:
    what a backward saved stays as the kernels wrote it."""
    return lse.masked_fill(torch.isposinf(lse), float("-inf")) if lse.is_cuda else lse


def _refuse_mixed(**tensors):
    for name, t in tensors.items():
        if t is not None and not isinstance(t, _Tensor):
            raise Error(f"q is a torch tensor but {name} is {type(t).__name__}: pass torch tensors throughout")
