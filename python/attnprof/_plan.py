"""attnprof.plan: a call planned once on example arrays, run many times.

The plan resolves the backend (auto included), checks that it can take the
call, and does what the backend can do ahead of the runs (on CUDA flash: the
split-KV decode's sizing and workspace) once; Plan.run then checks the arrays
against the plan and launches, with nothing allocated but `out` when it is
not given (src/bindings/plan_bindings.cpp, include/attnprof/plan.h).
"""
from __future__ import annotations

import sys as _sys

from . import _args, _core, _options
from ._core import Error


def _is_torch(x) -> bool:
    torch = _sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _not_an_array(e: TypeError) -> Error:
    return Error("attnprof.plan takes CPU or CUDA arrays that export DLPack (torch tensors, numpy arrays), "
                 f"writable for out: {str(e).splitlines()[0]}")


def _exported(dl, t, name):
    """An optional torch tensor as DLPack (`dl`: torch's to_dlpack), or None; one line naming it otherwise."""
    if t is None:
        return None
    try:
        return dl(t)
    except (RuntimeError, BufferError, TypeError, AttributeError) as e:
        raise Error(f"{name} cannot be read as an array (DLPack): {str(e).splitlines()[0]}") from None


class Plan:
    """One call's plan (attnprof.plan makes it): .run(q, k, v, out=None, ...) on arrays of the planned shapes.

    backend: the backend every run uses (auto's pick, kept); layout: dense, padded, packed or paged;
    explain(): why that backend and what it runs; release(): gives the plan's workspace back now (runs are
    refused after, and a CUDA graph that captured a run must not be replayed)."""

    __slots__ = ("_plan", "_torch", "_to_dlpack", "_stream", "_handle")

    def __init__(self, plan, torch_module):
        self._plan = plan
        self._handle = plan._handle()  # what attnprof._torch_call.plan_run takes: valid while self._plan lives
        self._torch = torch_module  # attnprof._torch for torch arrays, else None
        if torch_module is not None:
            self._to_dlpack = torch_module._to_dlpack
            raw = torch_module._raw_stream
            self._stream = raw if raw is not None else None
        else:
            self._to_dlpack = None
            self._stream = None

    @property
    def backend(self) -> str:
        return self._plan.backend

    @property
    def layout(self) -> str:
        return self._plan.layout

    @property
    def workspace_bytes(self) -> int:
        return self._plan.workspace_bytes

    def explain(self) -> str:
        return self._plan.explain()

    def release(self) -> None:
        self._plan.release()

    def __repr__(self) -> str:
        try:
            return f"attnprof.Plan({self._plan.explain()})"
        except Error as e:
            return f"attnprof.Plan(released: {e})"

    def run(self, q, k, v, out=None, *, block_table=None, seq_lens=None, cu_seqlens_q=None, cu_seqlens_k=None,
            q_rows=None, kv_rows=None):
        """The planned call on q, k and v (the plan's shapes, dtypes and device) into `out` (allocated when
        None), queued on torch's current stream for CUDA tensors; returns out. The index arrays are those
        the plan was made with (block_table and seq_lens for a paged plan, q_rows/kv_rows for a padded one,
        cu_seqlens for a packed one), read by the kernels only on a GPU, so that they may be rewritten in
        place between runs (and between replays of a CUDA graph that captured a run)."""
        t = self._torch
        if t is None:
            if out is None:
                from . import _empty_like

                out = _empty_like(q)
            else:
                from . import _writable_out

                _writable_out(out)
            try:
                self._plan.run(q, k, v, out, 0, block_table, seq_lens, q_rows, kv_rows, cu_seqlens_q, cu_seqlens_k)
            except TypeError as e:
                raise _not_an_array(e) from None
            return out
        fast = t._fast_plan_run
        if fast is not None:  # attnprof._torch_call: the tensors read as at::Tensor, no DLPack capsule
            done = fast(self._handle, q, k, v, out, block_table, seq_lens, q_rows, kv_rows, cu_seqlens_q,
                        cu_seqlens_k)
            if done is not None:
                return done
        for name, a in (("q", q), ("k", k), ("v", v), ("out", out)):
            if a is not None and not isinstance(a, t._Tensor):
                raise Error(f"this plan was made for torch tensors, and {name} is {type(a).__name__}: pass torch "
                            "tensors to its runs (or make a plan from arrays of that kind)")
        if t.torch.is_grad_enabled() and any(a is not None and a.requires_grad for a in (q, k, v, out)):
            # As attnprof.plan refuses them: a run would give an output no gradient reaches q, k or v through.
            raise Error("plan.run runs inference only: q, k, v and out must not require grad (use "
                        "attnprof.attention for autograd, or torch.no_grad())")
        dl = self._to_dlpack
        try:
            if out is None:
                out = t.torch.empty(q.shape, dtype=t._out_dtype(q.dtype), device=q.device)
            dq, dk, dv, do = dl(q), dl(k), dl(v), dl(out)
        except (RuntimeError, BufferError, TypeError) as e:
            raise t._not_exported(e, ("q", "k", "v", "out"), (q, k, v, out), _not_an_array) from None
        index = q.get_device()
        stream = 0 if index < 0 else self._stream(index) if self._stream is not None else t._stream_of(q)
        if block_table is None and seq_lens is None and q_rows is None and kv_rows is None \
                and cu_seqlens_q is None and cu_seqlens_k is None:
            self._plan.run(dq, dk, dv, do, stream)
        else:
            self._plan.run(dq, dk, dv, do, stream, _exported(dl, block_table, "block_table"),
                           _exported(dl, seq_lens, "seq_lens"), _exported(dl, q_rows, "q_rows"),
                           _exported(dl, kv_rows, "kv_rows"), _exported(dl, cu_seqlens_q, "cu_seqlens_q"),
                           _exported(dl, cu_seqlens_k, "cu_seqlens_k"))
        return out


def plan(q, k, v, *, backend: str = "auto", mask: str | None = None, window: int | None = None,
         scale: float | None = None, layout: str = "bhsd", softcap: float | None = None, threads: int = 0,
         block_table=None, seq_lens=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q: int | None = None,
         max_seqlen_k: int | None = None, q_rows=None, kv_rows=None) -> Plan:
    """A plan of attnprof.attention(q, k, v, ...) on these example arrays, for many runs on arrays of the
    same shapes, dtypes and device: plan.run(q, k, v, out=None, block_table=..., seq_lens=..., ...).

    The arguments are attention()'s (the same defaults: mask None is causal, or for a packed batch
    causal too; window=(left, right) the same band); which index arrays are given picks the batch layout, and every run gives the same ones:
    dense (none), padded (q_rows and/or kv_rows), packed (cu_seqlens_q and cu_seqlens_k: on a GPU's flash
    each run's own, read by the kernels, with max_seqlen_q/_k as their bound; elsewhere the plan runs the
    lengths it was made with, and a run's must say the same) or paged (block_table and seq_lens; the plan
    is sized for the table's capacity, each run's seq_lens are its own). The backend, auto's
    pick included, is resolved and checked here, once; a call attention() would refuse is refused here,
    in the same words. Inference only (no autograd)."""
    backend = _args.text("backend", backend)
    bshd = _core.is_bshd(_args.text("layout", layout))
    threads = _args.whole("threads", threads)
    if isinstance(window, (tuple, list)):  # a band (left, right), as attention() takes one
        mask, window = _options.band(mask, window)
    window = _args.whole("window", window, _args.INT64, optional=True)
    scale = _args.real("scale", scale)
    softcap = _args.real("softcap", softcap)
    max_seqlen_q = _args.whole("max_seqlen_q", max_seqlen_q, _args.INT64, optional=True)
    max_seqlen_k = _args.whole("max_seqlen_k", max_seqlen_k, _args.INT64, optional=True)
    if mask is None:
        mask = "causal" if cu_seqlens_q is not None or cu_seqlens_k is not None else ""
    elif not isinstance(mask, str):
        raise _args.ArgumentTypeError(f"mask names a structural mask (a string), got {type(mask).__name__}")
    torch_module = None
    arrays = [q, k, v, block_table, seq_lens, q_rows, kv_rows, cu_seqlens_q, cu_seqlens_k]
    if _is_torch(q):
        from . import _torch as torch_module

        if any(a is not None and a.requires_grad for a in (q, k, v)) and torch_module.torch.is_grad_enabled():
            raise Error("attnprof.plan runs inference only: q, k and v require grad (use attnprof.attention for "
                        "autograd, or torch.no_grad())")
        out = torch_module.torch.empty(q.shape, dtype=torch_module._out_dtype(q.dtype), device=q.device)
        names = ("q", "k", "v", "block_table", "seq_lens", "q_rows", "kv_rows", "cu_seqlens_q", "cu_seqlens_k")
        arrays = [_exported(torch_module._to_dlpack, a, n) for a, n in zip(arrays, names)]
        out_arg = _exported(torch_module._to_dlpack, out, "out")
        stream = torch_module._stream_of(q)
    else:
        from . import _empty_like

        out_arg = _empty_like(q)
        stream = 0
    dq, dk, dv, bt, sl, qr, kr, cq, ck = arrays
    try:
        made = _core.plan(dq, dk, dv, out_arg, backend=backend, mask=mask, window=window, scale=scale,
                          stream=stream, threads=threads, bshd=bshd, softcap=softcap, block_table=bt, seq_lens=sl,
                          q_rows=qr, kv_rows=kr, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=max_seqlen_q,
                          max_seqlen_k=max_seqlen_k)
    except TypeError as e:
        raise _not_an_array(e) from None
    return Plan(made, torch_module)
