"""A boolean key-padding attn_mask lowered to per-sequence rows (q_rows, kv_rows): decided and computed here, once,
for every front end (torch tensors on the CPU or CUDA, numpy arrays on the host), and the checking mode as Python
reads it. Nothing here imports torch: a torch tensor brings its own ops.

Two calls carry key padding as a tensor:
- beside a mask name (mask="causal", ...): attn_mask is a key-padding mask, bool [B, Skv] or [B, 1, 1, Skv], each
  row one run of Trues (right and/or left padding). It becomes kv_rows, and q_rows too when S == Skv (training's
  padding: a padded query row then sees nothing and is zeros). Any other shape of that form is refused naming the
  shape it must have.
- with no mask name, as SDPA is called, to flash: bool [B, 1, 1, Skv] (SDPA reads a 2-D mask as [S, Skv], so only
  the 4-D form is key padding). It becomes mask "none" with kv_rows alone, which is SDPA's answer: every query row,
  a padded one too, attends its sequence's valid keys, and a sequence with no valid key gives zeros (as SDPA does).
  flash on CUDA reads no mask tensor, so this is how it takes one; other backends take the tensor as it is, and so
  does flash on the CPU while torch.compile traces the call (it reads the tensor itself; a check of the values here
  would break the graph).

A row must be one run of Trues. Host memory is read and checked on every call (a holed row beside a mask name is
refused by name; with no mask name the tensor goes to the backend as the whole mask it is). A CUDA mask is not read
on the host (no synchronisation, attnprof/check_inputs.h) except in the checking mode, which refuses a holed row by
name; outside it a holed row is read as the run from its first True that holds as many keys as the row's Trues.
"""

from __future__ import annotations

from . import _core
from ._core import Error


def checking_inputs() -> bool:
    """The checking mode as the core reads it (src/core/check_inputs.cpp), Python's one reading of it:
    ATTNPROF_CHECK_INPUTS set to anything but "" or "0" (read once per process), or attention(check_inputs=...)'s
    setting on this thread."""
    return _core.checking_inputs()


class _Ops:
    """The few array ops the lowering needs, in the mask's own framework (torch or numpy)."""

    def __init__(self, xp, int32, device=None, host=True, compiling=False):
        self.xp, self.int32, self.device, self.host, self.compiling = xp, int32, device, host, compiling

    def arange(self, n):
        if self.device is None:
            return self.xp.arange(n, dtype=self.int32)
        return self.xp.arange(n, dtype=self.int32, device=self.device)

    def i32(self, x):
        return x.astype(self.int32) if self.device is None else x.to(self.int32)


def _ops_of(m):
    """The ops of m's framework, or None for an array attnprof does not lower (its backend reads it as given)."""
    module = type(m).__module__.split(".")[0]
    if module == "torch":
        import torch

        return _Ops(torch, torch.int32, m.device, m.device.type == "cpu", torch.compiler.is_compiling())
    if module == "numpy":
        import numpy

        return _Ops(numpy, numpy.int32)
    return None


def _is_bool(m) -> bool:
    dtype = getattr(m, "dtype", None)
    return dtype is not None and str(dtype) in ("bool", "torch.bool")


def _runs(m, ops):
    """Each row's run of Trues of a bool [B, L] as int32 [B, 2] (begin, end), and the first row that is not one
    run (or None) where the values are read on the host (host memory, or the checking mode); else None, unread."""
    xp, length = ops.xp, m.shape[1]
    keys = ops.arange(length)
    count = m.sum(1, dtype=ops.int32)
    first = ops.i32(xp.amin(xp.where(m, keys, length), 1))
    begin = xp.where(count > 0, first, 0)
    holed = None
    if ops.host or checking_inputs():  # torch.compile reads the mode as a constant (attnprof/_torch.py)
        last = ops.i32(xp.amax(xp.where(m, keys + 1, 0), 1))
        bad = ((last - begin) != count) & (count > 0)
        if bool(bad.any()):
            holed = int(bad.nonzero()[0][0])
    rows = ops.i32(xp.stack((begin, begin + count), 1))
    return rows, holed


def lower(q, k, attn_mask, mask: str, bshd: bool, backend: str, q_rows, kv_rows):
    """(mask, attn_mask, q_rows, kv_rows) for the call: a key-padding attn_mask lowered to rows where the module's
    docstring says, else the arguments as given (the library then reads or refuses the tensor)."""
    if attn_mask is None or not _is_bool(attn_mask) or len(getattr(q, "shape", ())) != 4 or \
            len(getattr(k, "shape", ())) != 4:
        return mask, attn_mask, q_rows, kv_rows  # not key padding, or q and k the library refuses by name
    shape = tuple(attn_mask.shape)
    padding_form = len(shape) == 2 or (len(shape) == 4 and shape[1] == 1 and shape[2] == 1)
    if not padding_form or (not mask and (backend != "flash" or len(shape) != 4)):
        return mask, attn_mask, q_rows, kv_rows
    ops = _ops_of(attn_mask)
    if ops is None or getattr(attn_mask, "is_meta", False):  # meta: refused by name as the tensor it is
        return mask, attn_mask, q_rows, kv_rows
    if not mask and ops.host and ops.compiling:
        # The CPU backend reads the tensor itself, and a check of its values here would break torch.compile's graph.
        return mask, attn_mask, q_rows, kv_rows
    batch = q.shape[0]
    seq, kv_seq = (q.shape[1], k.shape[1]) if bshd else (q.shape[2], k.shape[2])
    if shape[0] != batch or shape[-1] != kv_seq:
        if not mask:
            return mask, attn_mask, q_rows, kv_rows  # the tensor's own broadcasting decides, as SDPA's would
        raise Error(f"attn_mask {list(shape)} beside mask='{mask}' is not a key-padding mask of this batch: bool "
                    f"[B, Skv] = [{batch}, {kv_seq}] (or [B, 1, 1, Skv]); a mask of any other shape is the whole mask "
                    "(pass it with no mask name)")
    if q_rows is not None or kv_rows is not None:
        if not mask:
            return mask, attn_mask, q_rows, kv_rows  # the library refuses rows beside a tensor mask by name
        raise Error("q_rows/kv_rows with attn_mask: pass the rows or the key-padding mask, not both")
    rows, holed = _runs(attn_mask.reshape(shape[0], shape[-1]), ops)
    if holed is not None:
        if not mask and ops.host:
            return mask, attn_mask, q_rows, kv_rows  # a general boolean mask: the backend reads the tensor
        if mask:
            raise Error(f"attn_mask row {holed} is not one run of Trues (a key-padding mask with mask= is one run a "
                        "row: right and/or left padding)")
        raise Error(f"attn_mask row {holed} is not one run of Trues: {backend} on {attn_mask.device} reads a boolean "
                    "attn_mask only as key padding, one run a row (right and/or left padding); a backend that reads "
                    "mask tensors takes any other")
    if not mask:
        return "none", None, None, rows
    return mask, None, (rows if seq == kv_seq else None), rows
