"""What transformers' mask creation hands attnprof, as structure rather than an S x Skv tensor.

transformers builds each layer's mask through the function registered in AttentionMaskInterface, giving it the
pattern as a mask function (causal_mask_function, and_masks(sliding_window_overlay(W), causal), a packed batch's
remapping, or a model's own function) and the padding as a 2-D [B, past + S] boolean. attnprof's mask function
reads the pattern from those functions (never evaluating them) and returns, as FlashAttention's does:
- None: no padding mask given (the layer's causal or window structure is the module's);
- the 2-D padding mask, which the attention function lowers to per-sequence rows (see attnprof_mask for which of
  its columns are which keys). A mask of all ones (what tokenizers pass for a batch without padding) takes this
  path too, as full rows: telling it apart would read the mask on the host, which a CUDA call must not;
- PackedBatch: a padding-free batch whose documents restart the positions (position_ids);
- SDPA's own 4-D boolean for a pattern it does not recognise (a custom mask), which the attention function
  runs on a backend that takes a tensor mask (warned under backend="auto") or refuses under an explicit one.
Nothing here reads a CUDA tensor on the host: the lowering is torch ops on the mask's device. Everything here is
traced whole by torch.compile (fullgraph=True): the mask functions are read through their closures' cells, which
dynamo follows, and the check of a padding mask's rows is a custom op (padding_rows), so that a compiled model
refuses what the same model refuses uncompiled, with no graph break.
"""

from __future__ import annotations


import torch

import attnprof


class PackedBatch:
    """A padding-free batch: transformers found positions restarting inside a row (its packed_sequence_mask, the
    document index of every token). The attention function takes the documents from position_ids or from the
    collator's cu_seq_lens."""

    __slots__ = ("sequence_ids",)

    def __init__(self, sequence_ids: torch.Tensor):
        self.sequence_ids = sequence_ids


def checking() -> bool:
    """The checking mode (ATTNPROF_CHECK_INPUTS=1): CUDA masks and lengths are read on the host and checked."""
    return attnprof._key_padding.checking_inputs()  # the core's reading, the one Python has


def _nonlocals(fn) -> dict:
    """A closure's free variables by name, read from its cells (inspect.getclosurevars would do the same, but
    dynamo cannot trace it: a graph break in every compiled model's mask creation)."""
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    if code is None or cells is None:
        return {}
    return {name: cell.cell_contents for name, cell in zip(code.co_freevars, cells)}


def _name(fn) -> str:
    # Attributes read directly: under torch.compile, getattr(fn, "__module__", default) gives the default for a
    # function made inside the compiled code (a packed batch's mask function went unrecognised).
    try:
        module, qualname = fn.__module__, fn.__qualname__
    except AttributeError:
        return ""
    if not isinstance(module, str) or not isinstance(qualname, str):
        return ""
    return module + "." + qualname


_MASKING = "transformers.masking_utils."


def structure_of(fn):
    """The pattern of a transformers mask function as (causal, window, packed sequence ids), or None when it is
    not one attnprof computes from positions (a model's own function, chunked or blockwise attention).

    Recognised by transformers' own factories, as 5.17 and 5.25 build them: causal_mask_function,
    bidirectional_mask_function, and_masks(sliding_window_overlay(W), causal_mask_function), a packed batch's
    and_masks(..., packed_sequence_mask_function(ids)) and 5.25's remap_positions_for_packed_sequence around it.
    """
    parts = {"causal": None, "window": None, "packed": None}

    def walk(f) -> bool:
        name = _name(f)
        if name == _MASKING + "causal_mask_function":
            parts["causal"] = True if parts["causal"] is None else parts["causal"]
            return True
        if name == _MASKING + "bidirectional_mask_function":
            parts["causal"] = False if parts["causal"] is None else parts["causal"]
            return True
        if name == _MASKING + "and_masks.<locals>.and_mask":
            return all(walk(g) for g in _nonlocals(f).get("mask_functions", ()))
        if name == _MASKING + "sliding_window_overlay.<locals>.inner_mask":
            free = _nonlocals(f)
            parts["window"] = free.get("sliding_window")
            return parts["window"] is not None
        if name == _MASKING + "packed_sequence_mask_function.<locals>.inner_mask":
            parts["packed"] = _nonlocals(f).get("packed_sequence_mask")
            return parts["packed"] is not None
        if name == _MASKING + "remap_positions_for_packed_sequence.<locals>.inner_mask":
            free = _nonlocals(f)
            return "mask_function" in free and walk(free["mask_function"])
        return False

    if not walk(fn) or parts["causal"] is None:
        return None
    if parts["window"] is not None and not parts["causal"]:
        return None  # a bidirectional window: no structural form in attnprof
    return parts["causal"], parts["window"], parts["packed"]


def attnprof_mask(batch_size: int | None = None, q_length: int | None = None, kv_length: int | None = None,
                  q_offset=0, kv_offset: int = 0, mask_function=None, attention_mask: torch.Tensor | None = None,
                  **kwargs):
    """attnprof's entry in AttentionMaskInterface (see the module's docstring for what it returns).

    Takes transformers' arguments by keyword (5.17 and 5.25 pass q_length and q_offset; earlier 5.x passed
    cache_position, the queries' positions, which stands in for them here)."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    if q_length is None and kwargs.get("cache_position") is not None:
        q_length, q_offset = kwargs["cache_position"].shape[0], kwargs["cache_position"][0]
    fn = mask_function if mask_function is not None else causal_mask_function
    found = structure_of(fn)
    if found is None:
        # A pattern attnprof does not compute from positions: SDPA's tensor, for a backend that takes one (never
        # None, which would read as causal: SDPA's skip looks at the padding, not at the function).
        kwargs["allow_is_causal_skip"] = False
        return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                         kv_offset=kv_offset, mask_function=fn, attention_mask=attention_mask, **kwargs)
    _, _, packed = found
    if packed is not None:
        return PackedBatch(packed)
    if attention_mask is not None:
        mask = attention_mask if attention_mask.dtype == torch.bool else attention_mask.bool()
        if q_length == 1:
            return _decode_keys(mask, kv_length)
        # Its columns are positions from 0 (transformers' 2-D mask, every token seen so far): the queries are its
        # last q_length columns, and the layer's keys its last ones too, or, where a static cache has slots not
        # yet written (fewer columns than keys), its first ones. Columns past the last key are not the layer's.
        end = kv_offset + kv_length
        return mask[:, :end] if mask.shape[-1] > end else mask
    if isinstance(q_offset, int) and q_offset + q_length == kv_offset + kv_length:
        return None  # every key is a real one, up to the last query
    device = kwargs.get("device", "cpu")
    if q_length == 1:
        # Decoding on a static cache without a padding mask: the keys written so far, in decoding's form (below),
        # on the device (q_offset is a tensor there).
        keys = torch.arange(kv_offset, kv_offset + kv_length, device=device)
        return (keys < q_offset + 1).expand(batch_size, -1)
    if isinstance(q_offset, int):
        return torch.ones(batch_size, q_offset + q_length, dtype=torch.bool, device=device)
    kwargs["allow_is_causal_skip"] = False
    return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                     kv_offset=kv_offset, mask_function=fn, attention_mask=attention_mask, **kwargs)


def _decode_keys(mask: torch.Tensor, kv_length: int) -> torch.Tensor:
    """A decoding step's padding as exactly kv_length columns, the keys kv_offset .. kv_offset + kv_length - 1 of
    transformers' mask sizes, the last of them the query's own: the mask's last kv_length columns, or, where a
    static cache has slots not yet written, all of them and False for those slots. The attention function reads
    them as the layer's last keys (a cache may hand the layer more keys than the mask sizes count, which are
    outside its window: Gemma-2's dynamic cache with sliding_window=1 keeps them all). The width is the same
    at every step of a static cache (a compiled decoding step keeps its shapes), and the form is its own image
    (a model that builds its mask again from this one gets the same)."""
    width = mask.shape[-1]
    if width < kv_length:
        return torch.nn.functional.pad(mask, (0, kv_length - width))
    return mask[:, width - kv_length:] if width > kv_length else mask


def runs(mask: torch.Tensor, what: str, offset: int = 0) -> torch.Tensor:
    """Each row's run of Trues of a boolean [B, L] as int32 [B, 2] (begin, end) rows, with torch ops on the
    mask's device: (first True, first True + count); (0, 0) for a row with none. A row with padding between
    real tokens has no rows: it is refused in one line (offset: the position of the mask's column 0, for the
    message) where its values can be read, on the CPU and in the checking mode (ATTNPROF_CHECK_INPUTS=1, read in
    the stream's order); CUDA's default path reads nothing on the host, so there nothing is refused.

    The same function runs compiled and uncompiled, at the call's time: torch.compile traces it as one custom op
    (padding_rows), so the check neither breaks the graph nor is dropped from it, and a compiled model refuses
    exactly what the same model refuses uncompiled."""
    if torch.compiler.is_compiling():
        return torch.ops.attnprof_hf.padding_rows(mask, what, offset)
    return _runs(mask, what, offset)


def _runs(mask, what, offset):
    count = mask.sum(-1, dtype=torch.int32)
    first = mask.to(torch.uint8).argmax(-1).to(torch.int32)
    if mask.device.type == "cpu" or checking():
        last = mask.shape[-1] - 1 - mask.flip(-1).to(torch.uint8).argmax(-1).to(torch.int32)
        holes = (count > 0) & (last - first + 1 != count)
        if bool(holes.any()):
            b = int(holes.nonzero()[0, 0])
            row = mask[b].cpu()
            begin = int(first[b])
            gap = begin + int(row[begin:].logical_not().nonzero()[0, 0])
            raise attnprof.Error(f"{what} row {b} has padding between real tokens (position {offset + gap} is "
                                 f"padding, {offset + begin} and {offset + int(last[b])} are real): attnprof reads "
                                 "key padding as one run of real tokens per row; pass a 4-D mask for any other "
                                 "pattern")
    return torch.stack((first, first + count), -1)


@torch.library.custom_op("attnprof_hf::padding_rows", mutates_args=())
def _padding_rows(mask: torch.Tensor, what: str, offset: int) -> torch.Tensor:
    """runs() as one node of a compiled graph: computed (and checked) when the graph runs."""
    return _runs(mask, what, offset)


@_padding_rows.register_fake
def _padding_rows_fake(mask, what, offset):
    return mask.new_empty((mask.shape[0], 2), dtype=torch.int32)


def document_starts(position_ids: torch.Tensor) -> torch.Tensor:
    """Where each packed document starts in the flattened [B * S] tokens: a row's first token, and every token
    whose position does not follow the one before it (DataCollatorWithFlattening restarts them at 0)."""
    starts = torch.ones_like(position_ids, dtype=torch.bool)
    starts[:, 1:] = position_ids[:, 1:] != position_ids[:, :-1] + 1
    return starts.reshape(-1)


def cu_seqlens_of(starts: torch.Tensor) -> torch.Tensor:
    """int32 cumulative lengths of [total + 1] entries from a flattened start flag, on its device without a host
    read: the documents' starts in order, then total for every entry past the last document (empty sequences,
    so that the shape does not depend on the values)."""
    total = starts.shape[0]
    index = torch.arange(total, device=starts.device, dtype=torch.int32)
    ends = torch.where(starts, index, torch.full_like(index, total)).sort().values
    return torch.cat((ends, ends.new_full((1,), total)))


def exact_cu_seqlens(starts: torch.Tensor) -> list[int]:
    """The documents' cumulative lengths read on the host (the CPU, or the checking mode): for the messages."""
    s = starts.cpu()
    return s.nonzero().reshape(-1).tolist() + [s.shape[0]]


def agreeing(cu: torch.Tensor, starts: torch.Tensor, name: str, source: str, batch: int) -> torch.Tensor:
    """The collator's cumulative lengths `name` as int32, refused in one line where they name other documents
    than `source` says (position_ids, or with none the packed mask transformers made; starts: document_starts)
    and can be read: on the CPU and in the checking mode. As runs(): the same check compiled (one custom op,
    cu_seqlens_agreeing) and uncompiled, when the call runs."""
    if torch.compiler.is_compiling():
        return torch.ops.attnprof_hf.cu_seqlens_agreeing(cu, starts, name, source, batch)
    _check_agree(cu, starts, name, source, batch)
    return cu.to(torch.int32)


def _check_agree(cu, starts, name, source, batch):
    if cu.device.type != "cpu" and not checking():
        return
    want = exact_cu_seqlens(starts)
    got = [int(x) for x in cu.reshape(-1).cpu().tolist()]
    if got == want:
        return
    shown = lambda xs: str(xs if len(xs) <= 8 else xs[:8] + ["..."])  # noqa: E731
    if source != "position_ids":
        raise attnprof.Error(f"{name} {shown(got)} disagrees with the packed mask transformers made "
                             f"(packed_sequence_mask), whose documents start at {shown(want)}: pass the "
                             "collator's cu_seq_lens with its own position_ids")
    if len(want) - 1 == batch:  # one document a row: positions 0, 1, ... as a model numbers them by default
        raise attnprof.Error(f"{name} {shown(got)} names {len(got) - 1} documents but position_ids never "
                             "restart within a row (a model numbers each row 0, 1, ... when no position_ids are "
                             "passed): pass the collator's position_ids with its cu_seq_lens")
    raise attnprof.Error(f"{name} {shown(got)} disagrees with position_ids, whose documents start at "
                         f"{shown(want)}: pass the collator's cu_seq_lens with its own position_ids")


@torch.library.custom_op("attnprof_hf::cu_seqlens_agreeing", mutates_args=())
def _cu_seqlens_agreeing(cu: torch.Tensor, starts: torch.Tensor, name: str, source: str,
                         batch: int) -> torch.Tensor:
    """agreeing() as one node of a compiled graph (a copy: an op's output is its own)."""
    _check_agree(cu, starts, name, source, batch)
    return cu.to(torch.int32, copy=True)


@_cu_seqlens_agreeing.register_fake
def _cu_seqlens_agreeing_fake(cu, starts, name, source, batch):
    return cu.new_empty(cu.shape, dtype=torch.int32)
