"""The PyTorch side, imported only once a torch tensor arrives: torch.ops.attnprof.attention
(a torch.library custom op with a fake implementation, so torch.compile traces it whole), the
training pair attention_train / attention_backward (the first's autograd is the second, attnprof's
own backward) and the eager path of attnprof.attention on torch tensors."""

from __future__ import annotations

import contextlib
from typing import Optional

import torch
import torch.utils.dlpack

from . import _args, _core, _key_padding
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
# graph), as the environment it mostly comes from is one: marked once here, never inside traced code.
torch.compiler.assume_constant_result(_key_padding.checking_inputs)
_Tensor = torch.Tensor
# Under torch.profiler the eager call goes through torch.ops.attnprof.attention,
# so the trace holds the op with its shapes (attnprof analyze reads it).
_profiling = torch.autograd._profiler_enabled


def _labelled(backend, mask, window, attn_mask):
    """Under torch.profiler (not while compiling), a range around the op naming what its string
    arguments cannot keep in a trace (torch records them empty): `attnprof analyze` reads the
    mask and backend from it (src/analysis/attention_calls.cpp). A no-op otherwise."""
    if _is_compiling() or not _profiling():  # is_compiling first: dynamo cannot trace _profiling()
        return contextlib.nullcontext()
    name = mask or ("causal" if attn_mask is None else "boolean" if attn_mask.dtype == torch.bool else "bias")
    return torch.profiler.record_function(f"attnprof.attention backend={backend} mask={name} window={window or 0}")


# DLPack capsules through torch's C exporter: ten times cheaper per tensor than
# Tensor.__dlpack__ (a Python method with its own checks, about 5 us), and the
# same borrowed view of the same memory.
_to_dlpack = torch.utils.dlpack.to_dlpack


def _load_fast():
    """attnprof._torch_call.attention, the fast path for torch tensors (src/bindings/torch_call.cpp),
    where it was built against this very torch; else None. With the reason, for fast_path."""
    try:
        from . import _torch_call
    except ImportError as e:
        return None, f"the DLPack path (attnprof._torch_call is not importable: {e})"
    if _torch_call.TORCH_VERSION != torch.__version__:
        return None, (f"the DLPack path (attnprof._torch_call was built against torch {_torch_call.TORCH_VERSION}, "
                      f"this is {torch.__version__}: rebuild attnprof)")
    return _torch_call.attention, f"attnprof._torch_call (built against torch {_torch_call.TORCH_VERSION})"


_fast_attention, fast_path = _load_fast()
_fast = _fast_attention  # None: every call takes the DLPack path (_use_fast)


def _use_fast(on: bool):
    """Off: every call takes the DLPack path, as before the extension (bench/python_overhead.py compares)."""
    global _fast
    _fast = _fast_attention if on else None


def _on_meta(name) -> Error:
    return Error(f"{name} is on the meta device, which holds no data: attnprof.attention computes on CPU and CUDA "
                 "tensors (torch.ops.attnprof's ops on meta tensors give only the output's shape)")


def _not_exported(e, names, tensors) -> Error:
    """The refusal of tensors DLPack could not export: a tensor on the meta device by name (it holds no data),
    else nanobind's or torch's reason."""
    for name, t in zip(names, tensors):
        if isinstance(t, _Tensor) and t.is_meta:
            return _on_meta(name)
    from . import not_an_array

    return Error(not_an_array(e))


def _dlpack(*tensors, names):
    try:
        return tuple(map(_to_dlpack, tensors))
    except (RuntimeError, BufferError, TypeError) as e:  # a device or layout DLPack cannot describe
        raise _not_exported(e, names, tensors) from None


_BACKWARD_NAMES = ("dout", "q", "k", "v", "out", "lse", "dq", "dk", "dv")
_VARLEN_NAMES = ("q", "k", "v", "out", "cu_seqlens_q", "cu_seqlens_k")


def _optional(t, name):
    # An optional tensor argument (attn_mask, block_table, seq_lens, the rows) as DLPack, or None.
    return None if t is None else _dlpack(t, names=(name,))[0]


def _numbers(window, scale, softcap):
    """An op's numbers through attnprof's one path: torch's schema passes a bool on as an int or a float."""
    return (_args.whole("window", window, _args.INT64, optional=True), _args.real("scale", scale),
            _args.real("softcap", softcap))


def _descales(q_descale, k_descale, v_descale):
    return tuple(_args.real(n, d) for n, d in (("q_descale", q_descale), ("k_descale", k_descale),
                                                 ("v_descale", v_descale)))


def _descale_arg(d, name):
    # A descale as the binding takes it: a number, or a GPU tensor (attnprof._descale kept it) as DLPack,
    # which only the kernels read.
    return d if d is None or d.__class__ is float else _optional(d, name)


def _out_dtype(dtype):
    # FP8 inputs write a bf16 output, as FlashAttention-3's and cuDNN's FP8 forwards do.
    return torch.bfloat16 if dtype == torch.float8_e4m3fn else dtype


def _run(q, k, v, out, backend, mask, window, scale, bshd, threads=0, softcap=None, attn_mask=None,
         block_table=None, seq_lens=None, q_descale=None, k_descale=None, v_descale=None, q_rows=None, kv_rows=None):
    # The exports written out (no tuple, no map), the stream lookup inlined:
    # this is every eager call's path.
    try:
        dq, dk, dv, do = _to_dlpack(q), _to_dlpack(k), _to_dlpack(v), _to_dlpack(out)
    except (RuntimeError, BufferError, TypeError) as e:  # a device or layout DLPack cannot describe
        raise _not_exported(e, ("q", "k", "v", "out"), (q, k, v, out)) from None
    index = q.get_device()
    stream = 0 if index < 0 else _raw_stream(index) if _raw_stream is not None else _stream_of(q)
    if attn_mask is None and block_table is None and seq_lens is None and q_descale is None and k_descale is None \
            and v_descale is None and q_rows is None and kv_rows is None:
        _core.attention(dq, dk, dv, do, backend=backend, mask=mask, window=window, scale=scale, stream=stream,
                        threads=threads, bshd=bshd, softcap=softcap)
    else:
        _core.attention(dq, dk, dv, do, backend=backend, mask=mask, window=window, scale=scale, stream=stream,
                        threads=threads, bshd=bshd, softcap=softcap, attn_mask=_optional(attn_mask, "attn_mask"),
                        block_table=_optional(block_table, "block_table"), seq_lens=_optional(seq_lens, "seq_lens"),
                        q_descale=_descale_arg(q_descale, "q_descale"),
                        k_descale=_descale_arg(k_descale, "k_descale"),
                        v_descale=_descale_arg(v_descale, "v_descale"),
                        q_rows=_optional(q_rows, "q_rows"), kv_rows=_optional(kv_rows, "kv_rows"))


@torch.library.custom_op("attnprof::attention", mutates_args=(), device_types=("cpu", "cuda"))
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str = "auto", mask: str = "causal",
                  window: Optional[int] = None, scale: Optional[float] = None, bshd: bool = False,
                  softcap: Optional[float] = None, attn_mask: Optional[torch.Tensor] = None,
                  block_table: Optional[torch.Tensor] = None,
                  seq_lens: Optional[torch.Tensor] = None, q_descale: Optional[float] = None,
                  k_descale: Optional[float] = None, v_descale: Optional[float] = None,
                  q_rows: Optional[torch.Tensor] = None, kv_rows: Optional[torch.Tensor] = None) -> torch.Tensor:
    """softmax(scale * q k^T + mask) v by an attnprof backend; out has q's shape ([B, H, S, D], or [B, S, H, D] when bshd).

    mask "" with attn_mask: the tensor alone; block_table and seq_lens: k and v are paged caches;
    float8_e4m3fn inputs take their descales and give a bfloat16 out."""
    window, scale, softcap = _numbers(window, scale, softcap)
    q_descale, k_descale, v_descale = _descales(q_descale, k_descale, v_descale)
    out = torch.empty(q.shape, dtype=_out_dtype(q.dtype), device=q.device)
    _run(q, k, v, out, backend, mask, window, scale, bshd, softcap=softcap, attn_mask=attn_mask,
         block_table=block_table, seq_lens=seq_lens, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
         q_rows=q_rows, kv_rows=kv_rows)
    return out


@_attention_op.register_fake
def _attention_fake(q, k, v, backend="auto", mask="causal", window=None, scale=None, bshd=False, softcap=None,
                    attn_mask=None, block_table=None, seq_lens=None, q_descale=None, k_descale=None, v_descale=None,
                    q_rows=None, kv_rows=None):
    # Matches the real output: a new contiguous tensor of q's shape and device, q's dtype (bf16 for fp8).
    return q.new_empty(q.shape, dtype=_out_dtype(q.dtype))


# ---- Training: a forward that keeps the log-sum-exp, and the backward that reads it.

def _lse_shape(q: torch.Tensor, bshd: bool):
    return (q.shape[0], q.shape[2], q.shape[1]) if bshd else tuple(q.shape[:3])


@torch.library.custom_op("attnprof::attention_train", mutates_args=(), device_types=("cpu", "cuda"))
def _train_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str = "auto", mask: str = "causal",
              window: Optional[int] = None, scale: Optional[float] = None, bshd: bool = False,
              deterministic: bool = False, softcap: Optional[float] = None,
              attn_mask: Optional[torch.Tensor] = None, q_rows: Optional[torch.Tensor] = None,
              kv_rows: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward of a training step: (out, the FP32 log-sum-exp of each query row the backward reads)."""
    window, scale, softcap = _numbers(window, scale, softcap)
    out = torch.empty(q.shape, dtype=_out_dtype(q.dtype), device=q.device)
    views = _dlpack(q, k, v, out, names=("q", "k", "v", "out"))
    _, lse = _core.attention_train(*views, backend=backend, mask=mask, window=window, scale=scale,
                                   stream=_stream_of(q), bshd=bshd, deterministic=deterministic, softcap=softcap,
                                   attn_mask=_optional(attn_mask, "attn_mask"), q_rows=_optional(q_rows, "q_rows"),
                                   kv_rows=_optional(kv_rows, "kv_rows"))
    return out, torch.from_dlpack(lse)


@_train_op.register_fake
def _train_fake(q, k, v, backend="auto", mask="causal", window=None, scale=None, bshd=False, deterministic=False,
                softcap=None, attn_mask=None, q_rows=None, kv_rows=None):
    return q.new_empty(q.shape), q.new_empty(_lse_shape(q, bshd), dtype=torch.float32)


@torch.library.custom_op("attnprof::attention_backward", mutates_args=(), device_types=("cpu", "cuda"))
def _backward_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, backend: str = "auto", mask: str = "causal", window: Optional[int] = None,
                 scale: Optional[float] = None, bshd: bool = False,
                 deterministic: bool = False, softcap: Optional[float] = None,
                 attn_mask: Optional[torch.Tensor] = None, q_rows: Optional[torch.Tensor] = None,
                 kv_rows: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV of attention_train's call for the upstream gradient dout."""
    window, scale, softcap = _numbers(window, scale, softcap)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    _core.attention_backward(*_dlpack(dout, q, k, v, out, lse, dq, dk, dv, names=_BACKWARD_NAMES), backend=backend,
                             mask=mask, window=window, scale=scale, stream=_stream_of(q), bshd=bshd,
                             deterministic=deterministic, softcap=softcap, attn_mask=_optional(attn_mask, "attn_mask"),
                             q_rows=_optional(q_rows, "q_rows"), kv_rows=_optional(kv_rows, "kv_rows"))
    return dq, dk, dv


@_backward_op.register_fake
def _backward_fake(dout, q, k, v, out, lse, backend="auto", mask="causal", window=None, scale=None, bshd=False,
                   deterministic=False, softcap=None, attn_mask=None, q_rows=None, kv_rows=None):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_train(ctx, inputs, output):
    # Every tensor the backward reads is saved through save_for_backward, the mask and rows too: autograd then
    # checks their version counters, and a tensor rewritten in place between the forward and backward() is
    # refused ("modified by an inplace operation") rather than read as other values than the forward's.
    q, k, v, *args = inputs
    *args, attn_mask, q_rows, kv_rows = args  # attention_train's last arguments
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, attn_mask, q_rows, kv_rows)
    ctx.args = args


def _train_backward(ctx, dout, _dlse):
    q, k, v, out, lse, attn_mask, q_rows, kv_rows = ctx.saved_tensors
    backend, mask, window, *_ = ctx.args  # attention_train's arguments after q, k, v
    with _labelled(backend, mask, window, attn_mask):
        dq, dk, dv = torch.ops.attnprof.attention_backward(dout.contiguous(), q, k, v, out, lse, *ctx.args, attn_mask,
                                                           q_rows, kv_rows)
    return (dq, dk, dv) + (None,) * (len(ctx.args) + 3)


torch.library.register_autograd("attnprof::attention_train", _train_backward, setup_context=_setup_train)


def _no_backward(ctx, grad):
    raise Error("torch.ops.attnprof.attention is the inference op: for gradients call attnprof.attention "
                "(or torch.ops.attnprof.attention_train) on tensors that require grad")


def _setup_context(ctx, inputs, output):
    pass


torch.library.register_autograd("attnprof::attention", _no_backward, setup_context=_setup_context)


def ops():
    return torch.ops.attnprof


def attention(q, k, v, out, backend, mask, window, scale, bshd, threads, deterministic, softcap, attn_mask,
              block_table, seq_lens, q_descale=None, k_descale=None, v_descale=None, q_rows=None, kv_rows=None):
    """attnprof.attention on torch tensors, its arguments checked there (positional: a
    repeated call's host time is what a model pays per layer): the general path, which
    attention() takes where the fast path (_fast, tried there first) does not."""
    if not (isinstance(k, _Tensor) and isinstance(v, _Tensor) and (out is None or isinstance(out, _Tensor))):
        _refuse_mixed(k=k, v=v, out=out)
    if attn_mask is not None and block_table is None and seq_lens is None:
        # A key-padding attn_mask as rows, on the mask's device (attnprof/_key_padding.py says when).
        _refuse_mixed(attn_mask=attn_mask)
        mask, attn_mask, q_rows, kv_rows = _key_padding.lower(q, k, attn_mask, mask, bshd, backend, q_rows, kv_rows)
    _refuse_mixed(q_rows=q_rows, kv_rows=kv_rows)
    extras = attn_mask is not None or block_table is not None or seq_lens is not None
    if extras:
        _refuse_mixed(attn_mask=attn_mask, block_table=block_table, seq_lens=seq_lens)
        if attn_mask is not None and attn_mask.requires_grad:
            raise Error("attn_mask requires grad: attnprof's backward gives the mask no gradient (pass "
                        "attn_mask.detach())")
    needs_grad = q.requires_grad or k.requires_grad or v.requires_grad
    if needs_grad and torch.is_grad_enabled():
        if block_table is not None or seq_lens is not None:
            raise Error("a paged KV cache is inference only: call under torch.no_grad() (or detach q and the caches)")
        # Autograd: the training op keeps the log-sum-exp, and its backward is attnprof's.
        if out is not None:
            raise Error("out= is not supported when gradients are needed: use the returned tensor")
        for name, t in (("q", q), ("k", k), ("v", v)):
            if t.is_meta:  # the op would run its fake: a result of no values, where a call without grad is refused
                raise _on_meta(name)
        with _labelled(backend, mask, window, attn_mask):
            return torch.ops.attnprof.attention_train(q, k, v, backend, mask, window, scale, bshd, deterministic,
                                                      softcap, attn_mask, q_rows, kv_rows)[0]
    if _is_compiling() or (out is None and _profiling()):
        # Traced as one node of the graph (its fake gives the output's shape), or recorded as
        # the op by the profiler.
        if out is not None:
            raise Error("out= is not supported under torch.compile: use the returned tensor")
        _no_descale_tensors(q_descale, k_descale, v_descale)
        with _labelled(backend, mask, window, attn_mask):
            return torch.ops.attnprof.attention(q, k, v, backend, mask, window, scale, bshd, softcap, attn_mask,
                                                block_table, seq_lens, q_descale, k_descale, v_descale, q_rows,
                                                kv_rows)
    if needs_grad:  # under no_grad
        q, k, v = q.detach(), k.detach(), v.detach()  # views: DLPack refuses to export a tensor that needs grad
    if out is None:
        out = torch.empty(q.shape, dtype=_out_dtype(q.dtype), device=q.device)
    try:
        _run(q, k, v, out, backend, mask, window, scale, bshd, threads, softcap, attn_mask, block_table, seq_lens,
             q_descale, k_descale, v_descale, q_rows, kv_rows)
    except TypeError as e:
        del out
        from . import not_an_array

        raise Error(not_an_array(e)) from None
    except BaseException:
        del out  # a refused call leaves nothing allocated, even while the traceback lives
        raise
    return out


def _no_descale_tensors(*descales):
    # The ops' schemas take descales as floats: a GPU descale tensor would be read on the host there.
    for name, d in zip(("q_descale", "k_descale", "v_descale"), descales):
        if isinstance(d, _Tensor):
            raise Error(f"{name} as a tensor is read by the kernels of an eager call only; under torch.compile or "
                        "the profiler pass a float")


def _refuse_mixed(**tensors):
    for name, t in tensors.items():
        if t is not None and not isinstance(t, _Tensor):
            raise Error(f"q is a torch tensor but {name} is {type(t).__name__}: pass torch tensors throughout")


# ---- Packed (variable-length) batches: flash_attn_varlen_func's arguments.
# q [total_q, H, D], k and v [total_k, Hkv, D], int32 cu_seqlens on q's device.

def _varlen_run(q, k, v, out, cu_q, cu_k, max_q, max_k, backend, mask, window, scale, threads=0, softcap=None,
                q_descale=None, k_descale=None, v_descale=None):
    _core.attention_varlen(*_dlpack(q, k, v, out, cu_q, cu_k, names=_VARLEN_NAMES), max_seqlen_q=max_q,
                           max_seqlen_k=max_k, backend=backend, mask=mask, window=window, scale=scale,
                           stream=_stream_of(q), threads=threads, softcap=softcap,
                           q_descale=_descale_arg(q_descale, "q_descale"),
                           k_descale=_descale_arg(k_descale, "k_descale"),
                           v_descale=_descale_arg(v_descale, "v_descale"))


@torch.library.custom_op("attnprof::attention_varlen", mutates_args=(), device_types=("cpu", "cuda"))
def _varlen_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
               cu_seqlens_k: torch.Tensor, max_seqlen_q: Optional[int] = None, max_seqlen_k: Optional[int] = None,
               backend: str = "auto", mask: str = "causal", window: Optional[int] = None,
               scale: Optional[float] = None, softcap: Optional[float] = None, q_descale: Optional[float] = None,
               k_descale: Optional[float] = None, v_descale: Optional[float] = None) -> torch.Tensor:
    """Attention over a packed batch; out has q's shape [total_q, H, D] (bf16 for float8_e4m3fn inputs,
    which take their descales)."""
    window, scale, softcap = _numbers(window, scale, softcap)
    q_descale, k_descale, v_descale = _descales(q_descale, k_descale, v_descale)
    out = torch.empty(q.shape, dtype=_out_dtype(q.dtype), device=q.device)
    _varlen_run(q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, backend, mask, window, scale,
                softcap=softcap, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    return out


@_varlen_op.register_fake
def _varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None, backend="auto",
                 mask="causal", window=None, scale=None, softcap=None, q_descale=None, k_descale=None, v_descale=None):
    return q.new_empty(q.shape, dtype=_out_dtype(q.dtype))


@torch.library.custom_op("attnprof::attention_varlen_train", mutates_args=(), device_types=("cpu", "cuda"))
def _varlen_train_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     cu_seqlens_k: torch.Tensor, max_seqlen_q: Optional[int] = None,
                     max_seqlen_k: Optional[int] = None, backend: str = "auto", mask: str = "causal",
                     window: Optional[int] = None, scale: Optional[float] = None, deterministic: bool = False,
                     softcap: Optional[float] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The packed training forward: (out, the FP32 [H, total_q] log-sum-exp the backward reads)."""
    window, scale, softcap = _numbers(window, scale, softcap)
    out = torch.empty(q.shape, dtype=_out_dtype(q.dtype), device=q.device)
    _, lse = _core.attention_varlen_train(*_dlpack(q, k, v, out, cu_seqlens_q, cu_seqlens_k, names=_VARLEN_NAMES),
                                          max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, backend=backend,
                                          mask=mask, window=window, scale=scale, stream=_stream_of(q),
                                          deterministic=deterministic, softcap=softcap)
    return out, torch.from_dlpack(lse)


@_varlen_train_op.register_fake
def _varlen_train_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None, backend="auto",
                       mask="causal", window=None, scale=None, deterministic=False, softcap=None):
    return q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


@torch.library.custom_op("attnprof::attention_varlen_backward", mutates_args=(), device_types=("cpu", "cuda"))
def _varlen_backward_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                        lse: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                        max_seqlen_q: Optional[int] = None, max_seqlen_k: Optional[int] = None,
                        backend: str = "auto", mask: str = "causal", window: Optional[int] = None,
                        scale: Optional[float] = None, deterministic: bool = False,
                        softcap: Optional[float] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV of attention_varlen_train's call for the upstream gradient dout."""
    window, scale, softcap = _numbers(window, scale, softcap)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    _core.attention_varlen_backward(*_dlpack(dout, q, k, v, out, lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
                                                             names=_BACKWARD_NAMES + ("cu_seqlens_q", "cu_seqlens_k")),
                                    max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, backend=backend, mask=mask,
                                    window=window, scale=scale, stream=_stream_of(q), deterministic=deterministic,
                                    softcap=softcap)
    return dq, dk, dv


@_varlen_backward_op.register_fake
def _varlen_backward_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None,
                          backend="auto", mask="causal", window=None, scale=None, deterministic=False, softcap=None):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_varlen_train(ctx, inputs, output):
    q, k, v, cu_q, cu_k, *args = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
    ctx.args = args


def _varlen_train_backward(ctx, dout, _dlse):
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    dq, dk, dv = torch.ops.attnprof.attention_varlen_backward(dout.contiguous(), q, k, v, out, lse, cu_q, cu_k,
                                                             *ctx.args)
    return (dq, dk, dv, None, None) + (None,) * len(ctx.args)


torch.library.register_autograd("attnprof::attention_varlen_train", _varlen_train_backward,
                                setup_context=_setup_varlen_train)
torch.library.register_autograd("attnprof::attention_varlen", _no_backward, setup_context=_setup_context)


def attention_varlen(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, backend, mask, window,
                     scale, out, threads, deterministic=False, softcap=None, descales=(None, None, None)):
    for name, t in (("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)) + (
            (("out", out),) if out is not None else ()):
        if not isinstance(t, torch.Tensor):
            raise Error(f"q is a torch tensor but {name} is {type(t).__name__}: pass torch tensors throughout")
    if (q.requires_grad or k.requires_grad or v.requires_grad) and torch.is_grad_enabled():
        if out is not None:
            raise Error("out= is not supported when gradients are needed: use the returned tensor")
        return torch.ops.attnprof.attention_varlen_train(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                                         max_seqlen_k, backend, mask, window, scale, deterministic,
                                                         softcap)[0]
    if _is_compiling():
        if out is not None:
            raise Error("out= is not supported under torch.compile: use the returned tensor")
        _no_descale_tensors(*descales)
        return torch.ops.attnprof.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                   backend, mask, window, scale, softcap, *descales)
    if q.requires_grad or k.requires_grad or v.requires_grad:  # under no_grad
        q, k, v = q.detach(), k.detach(), v.detach()
    if out is None:
        out = torch.empty(q.shape, dtype=_out_dtype(q.dtype), device=q.device)
    try:
        _varlen_run(q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, backend, mask, window,
                    scale, threads, softcap, *descales)
    except TypeError as e:
        del out
        from . import not_an_array

        raise Error(not_an_array(e)) from None
    except BaseException:
        del out
        raise
    return out
