"""The options of one attention call in one table, and the one path from them into attnprof._core.

The table is what torch.ops.attnprof's two ops take after their tensors (attnprof/_torch.py makes their schemas
from it), what attnprof.attention hands its torch and numpy paths, and what the calls into the library are made
of: each binding of attnprof._core takes the options its own signature names (read from nanobind's signature), so
an option added to the table and to the bindings reaches every layout (dense, padded rows, packed, paged) and the
forward, the forward that keeps the log-sum-exp and the backward with no list to keep in step. An option set to
other than its default on a call whose binding does not take it is refused by name, never dropped. Nothing here
imports torch.
"""

from __future__ import annotations

import re

from . import _args, _core
from ._core import Error

# (name, schema type, default), in the ops' order after q, k, v (the first fourteen as the inference op took them
# before, so that positional calls and `attnprof analyze`'s argument indices hold). The one place an option is
# listed for the torch ops and the calls into the library.
OPTIONS = (
    ("backend", "str", "auto"),
    ("mask", "str", "causal"),
    ("window", "int?", None),
    ("scale", "float?", None),
    ("bshd", "bool", False),
    ("softcap", "float?", None),
    ("attn_mask", "Tensor?", None),
    ("block_table", "Tensor?", None),
    ("seq_lens", "Tensor?", None),
    ("q_descale", "float?", None),
    ("k_descale", "float?", None),
    ("v_descale", "float?", None),
    ("q_rows", "Tensor?", None),
    ("kv_rows", "Tensor?", None),
    ("cu_seqlens_q", "Tensor?", None),
    ("cu_seqlens_k", "Tensor?", None),
    ("max_seqlen_q", "int?", None),
    ("max_seqlen_k", "int?", None),
    ("deterministic", "bool", False),
)
NAMES = tuple(name for name, _, _ in OPTIONS)
DEFAULTS = tuple(default for _, _, default in OPTIONS)
TENSORS = tuple(name for name, kind, _ in OPTIONS if kind == "Tensor?")
TENSOR_AT = tuple(NAMES.index(name) for name in TENSORS)
_KIND = {name: kind for name, kind, _ in OPTIONS}


def schema(tensors: str, returns: str, extra: str = "") -> str:
    """An op's schema: its leading tensors, every option with its default, `extra` after them."""

    def shown(default):
        return f'"{default}"' if isinstance(default, str) else repr(default)

    options = ", ".join(f"{kind} {name}={shown(default)}" for name, kind, default in OPTIONS)
    return f"({tensors}, {options}{', ' + extra if extra else ''}) -> {returns}"


def of(values) -> dict:
    """The options as a dict from an op's arguments after its tensors (a prefix of the table's order: torch passes
    a call's trailing defaults on as absent), each number checked by attnprof's one path (_args): torch's schema
    passes a bool on as an int or a float."""
    values = tuple(values) + DEFAULTS[len(values):]
    o = dict(zip(NAMES, values))
    for name, kind, _ in OPTIONS:
        v = o[name]
        if v is None or kind in ("str", "Tensor?"):
            continue
        if kind == "int?":
            o[name] = _args.whole(name, v, _args.INT64, optional=True)
        elif kind == "float?":
            o[name] = _args.real(name, v)
        else:
            o[name] = _args.flag(name, v)
    return o


def ordered(o: dict) -> tuple:
    """The options of `o` in the ops' order (the table's)."""
    return tuple(o[name] for name in NAMES)


def band(mask, window):
    """attention()'s window=(left, right) as the core's (mask, window): keys from `left` before the diagonal to
    `right` after it, -1 unbounded. The diagonal is the bottom-right one (mask None or "causal_bottom_right", as
    flash_attn's and the sliding window's), or with mask="causal" the top-left one. The core's masks end at the
    diagonal, so a band reaching past it (right > 0, or right -1 with a bounded left) is refused by name, and
    its sliding window is bottom-right aligned, so a bounded left from the top-left diagonal is too."""
    if isinstance(window, str) or not hasattr(window, "__len__") or len(window) != 2:
        raise _args.ArgumentTypeError(f"window must be a number of keys or (left, right), got {window!r}")
    left = _args.whole("window[0]", window[0], _args.INT64)
    right = _args.whole("window[1]", window[1], _args.INT64)
    if left < -1 or right < -1:
        raise Error(f"window=({left}, {right}): each side is a number of keys, or -1 for unbounded")
    if mask not in (None, "", "causal", "causal_bottom_right", "causal-bottom-right"):
        raise Error(f"mask={mask!r} with window=(left, right): the band is the mask; mask names only its diagonal, "
                    "'causal' (top-left) or 'causal_bottom_right' (bottom-right, the default)")
    top_left = mask == "causal"
    if left == -1 and right == -1:
        return "none", None
    if right != 0:
        past = f"up to {right} keys" if right > 0 else "every key"
        raise Error(f"window=({left}, {right}) reaches {past} past the diagonal: a bidirectional band is not computed "
                    "by attnprof's core (its masks end at the diagonal: right 0, or (-1, -1) for none)")
    if left == -1:
        return ("causal" if top_left else "causal_bottom_right"), None
    if top_left:
        raise Error(f"window=({left}, 0) with mask='causal': attnprof's sliding window ends at the bottom-right "
                    "diagonal; pass mask=None for it (the same band where queries and keys are as many)")
    return "sliding_window", left + 1


def _keywords(fn) -> frozenset:
    """The arguments a binding takes by name, from nanobind's signature of it (its plain options are made from the
    C++ table, src/bindings/call_options.h and def_call.h)."""
    return frozenset(re.findall(r"(\w+): ", fn.__nb_signature__[0][0]))


# The library's calls by (packed, keeps the log-sum-exp), and what each is called in a refusal.
_FORWARDS = {
    (False, False): (_core.attention, "attention"),
    (False, True): (_core.attention_train, "a forward that keeps the log-sum-exp (return_lse=True, or gradients)"),
    (True, False): (_core.attention_varlen, "a packed batch (cu_seqlens_q, cu_seqlens_k)"),
    (True, True): (_core.attention_varlen_train, "a packed forward that keeps the log-sum-exp (return_lse=True, or "
                                                 "gradients)"),
}
_BACKWARDS = {False: (_core.attention_backward, "the backward"),
              True: (_core.attention_varlen_backward, "a packed batch's backward")}
_TAKES = {fn: _keywords(fn) for fn, _ in (*_FORWARDS.values(), *_BACKWARDS.values())}
_INDIFFERENT = {"deterministic"}  # read by a backward only: a forward that does not take it ignores it
# Per binding, worked out once: the plain options it takes, the tensor options it takes, the options it refuses
# when set (every call's path: a dict of the first, the second exported where given, the third checked unset).
_SPLIT = {fn: (tuple(n for n in NAMES if n in takes and _KIND[n] != "Tensor?"),
               tuple(n for n in NAMES if n in takes and _KIND[n] == "Tensor?"),
               tuple(n for n in NAMES if n not in takes and n not in _INDIFFERENT))
          for fn, takes in _TAKES.items()}


def _keywords_for(fn, what: str, o: dict, export) -> dict:
    plain, tensors, refused = _SPLIT[fn]
    kw = {name: o[name] for name in plain}
    for name in tensors:
        t = o[name]
        if t is not None:
            kw[name] = export(t, name)
    for name in refused:
        value = o[name]
        if value is not None and value is not False:
            raise Error(f"{name} is not taken by {what}")
    return kw


def packed(o: dict) -> bool:
    return o["cu_seqlens_q"] is not None or o["cu_seqlens_k"] is not None


def forward(q, k, v, out, o: dict, stream: int, threads: int, keep_lse: bool, export=lambda a, _: a):
    """The forward of `o`'s call on q, k, v (arrays as the bindings take them) into out; returns the saved
    log-sum-exp where keep_lse (float32 [B, H, S], or [H, total_q] for a packed batch), else None. export turns a
    tensor option into what the binding takes (torch's DLPack capsule), naming it when it cannot."""
    fn, what = _FORWARDS[packed(o), keep_lse]
    try:
        result = fn(q, k, v, out, stream=stream, threads=threads, **_keywords_for(fn, what, o, export))
    except BaseException:
        del out  # a refused call leaves nothing allocated, even while the traceback (this frame's) lives
        raise
    return result[1] if keep_lse else None


def backward(dout, q, k, v, out, lse, dq, dk, dv, o: dict, stream: int, export=lambda a, _: a):
    """dQ, dK, dV of `o`'s call into dq, dk, dv, from the forward's out and log-sum-exp."""
    fn, what = _BACKWARDS[packed(o)]
    fn(dout, q, k, v, out, lse, dq, dk, dv, stream=stream, **_keywords_for(fn, what, o, export))
