"""What transformers' mask creation hands attnprof, as structure rather than an S x Skv tensor.

transformers builds each layer's mask through the function registered in AttentionMaskInterface, giving it the
pattern as a mask function (causal_mask_function, and_masks(sliding_window_overlay(W), causal), a packed batch's
remapping, or a model's own function) and the padding as a 2-D [B, past + S] boolean. attnprof's mask function
reads the pattern from those functions (never evaluating them) and returns, as FlashAttention's does:
- None: no padding, every key real (the layer's causal or window structure is the module's);
- the 2-D padding mask sliced to the layer's keys, which the attention function lowers to per-sequence rows;
- PackedBatch: a padding-free batch whose documents restart the positions (position_ids);
- SDPA's own 4-D boolean for a pattern it does not recognise (a custom mask), which the attention function
  runs on a backend that takes a tensor mask (warned under backend="auto") or refuses under an explicit one.
Nothing here reads a CUDA tensor on the host: the lowering is torch ops on the mask's device.
"""

from __future__ import annotations

import inspect

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
    try:
        return inspect.getclosurevars(fn).nonlocals
    except (TypeError, ValueError):
        return {}


def _name(fn) -> str:
    return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', '')}"


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
        free = _nonlocals(f)
        if name == _MASKING + "and_masks.<locals>.and_mask":
            return all(walk(g) for g in free.get("mask_functions", ()))
        if name == _MASKING + "sliding_window_overlay.<locals>.inner_mask" and "sliding_window" in free:
            parts["window"] = free["sliding_window"]
            return True
        if name == _MASKING + "packed_sequence_mask_function.<locals>.inner_mask":
            parts["packed"] = free.get("packed_sequence_mask")
            return parts["packed"] is not None
        if name == _MASKING + "remap_positions_for_packed_sequence.<locals>.inner_mask":
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
        # As FlashAttention's mask: the columns of this layer's keys (a sliding layer's cache keeps the last
        # kv_length), fewer than kv_length where a static cache has empty slots past the mask.
        mask = attention_mask[:, -kv_length:]
        if mask.dtype != torch.bool:
            mask = mask.bool()
        return mask
    if isinstance(q_offset, int) and q_offset + q_length == kv_offset + kv_length:
        return None  # every key is a real one, up to the last query
    device = kwargs.get("device", "cpu")
    if isinstance(q_offset, int):
        return torch.ones(batch_size, q_offset + q_length - kv_offset, dtype=torch.bool, device=device)
    if q_length == 1:
        # A static cache without a padding mask, decoding: the keys written so far, on the device.
        keys = torch.arange(kv_offset, kv_offset + kv_length, device=device)
        return (keys < q_offset + 1).expand(batch_size, -1)
    kwargs["allow_is_causal_skip"] = False
    return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                     kv_offset=kv_offset, mask_function=fn, attention_mask=attention_mask, **kwargs)


def runs(mask: torch.Tensor, what: str) -> torch.Tensor:
    """Each row's run of Trues of a boolean [B, L] as int32 [B, 2] (begin, end) rows, with torch ops on the
    mask's device: (first True, first True + count); (0, 0) for a row with none. A row with padding between
    real tokens is refused in one line on the CPU and in the checking mode (read on the host there), except
    while torch.compile traces the call (a branch on the values would break its graph)."""
    count = mask.sum(-1, dtype=torch.int32)
    first = mask.to(torch.uint8).argmax(-1).to(torch.int32)
    if (mask.device.type == "cpu" or checking()) and not torch.compiler.is_compiling():
        last = mask.shape[-1] - 1 - mask.flip(-1).to(torch.uint8).argmax(-1).to(torch.int32)
        holes = (count > 0) & (last - first + 1 != count)
        if bool(holes.any()):
            b = int(holes.nonzero()[0, 0])
            row = mask[b].cpu()
            gap = int(first[b]) + int(row[int(first[b]):].logical_not().nonzero()[0, 0])
            raise attnprof.Error(f"{what} row {b} has padding between real tokens (position {gap} is padding, "
                                 f"{int(first[b])} and {int(last[b])} are real): attnprof reads key padding as one "
                                 "run of real tokens per row; pass a 4-D mask for any other pattern")
    return torch.stack((first, first + count), -1)


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
