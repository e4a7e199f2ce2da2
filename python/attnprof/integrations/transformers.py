"""transformers models on attnprof: one call registers ``attn_implementation="attnprof"``.

    import attnprof.integrations.transformers as apt
    apt.register()                     # or register(backend="flash")
    model = LlamaForCausalLM.from_pretrained(..., attn_implementation="attnprof")

What reaches attnprof is structure, as FlashAttention's transformers path reads it, never an S x Skv mask: the
mask function registered beside the attention (_hf_masks.attnprof_mask) returns None for a batch without
padding, the 2-D padding mask, or a packed batch's marker; the attention function reads the padding as
per-sequence rows (attention(q_rows=, kv_rows=), lowered on the device), the layer's sliding window
(module.sliding_window, or the sliding_window keyword Gemma-2 passes), its soft cap (softcap, or the config's
attn_logit_softcapping), scaling and is_causal, and a padding-free packed batch (the collator's cu_seq_lens_q/k
and max_length_q/k, or position_ids restarting at each document) as attnprof's packed call. transformers' causal
is FlashAttention's per-sequence bottom-right causal. A 4-D mask with another pattern (a model's own mask
function, or one the caller built) runs under backend="auto" on a backend that takes a tensor mask, with a
warning naming it once per process; an explicit backend that cannot take it refuses it by name.

A padding mask is one run of real tokens per row (left and/or right padding). One with padding between real
tokens is refused in one line where its values can be read: on the CPU and in the checking mode
(ATTNPROF_CHECK_INPUTS=1). CUDA's default path reads nothing on the host (its rows are made by torch ops on the
device), so there such a mask is neither refused nor run as a general mask: choosing would need a host read.

Under torch.compile all of this is traced whole (fullgraph=True holds: no graph break from attnprof), and the
same code runs when the graph runs: the padding's rows are made and checked by one custom op
(attnprof_hf::padding_rows), the collator's cumulative lengths by another (attnprof_hf::cu_seqlens_agreeing), so a
compiled model takes and refuses exactly what it does uncompiled. A decoding step's padding on a static cache keeps
one width (the cache's) at every step, so a compiled step is not compiled again and a CUDA graph of it replays.

Query [B, H, S, D], key and value [B, Hkv, Skv, D] (grouped-query heads are read as they are, never repeated);
the output goes back as [B, S, H, D]. Tensors that require grad go through attnprof's own backward. Dropout,
position biases and attention outputs are refused with attnprof.Error.
"""

from __future__ import annotations

import warnings

import attnprof
from attnprof import _args, _core

from . import _hf_masks

NAME = "attnprof"

# The reasons already warned about in this process (a custom mask's fallback is named once per reason).
_warned: set[str] = set()


def register(name: str = NAME, backend: str = "auto", threads: int = 0, *, replace: bool = False) -> str:
    """Registers attnprof with transformers' AttentionInterface and AttentionMaskInterface as `name`.

    The mask function is attnprof's (_hf_masks.attnprof_mask: structure, not a tensor). Returns the name to pass
    as attn_implementation. Its arguments are checked here, as a call would check them: a backend no build
    has, or a thread count out of range, is refused now rather than at the model's first forward. A name
    transformers (or another library) already has, such as "sdpa" or "eager", would be replaced for every model
    in the process: it is refused unless replace=True; attnprof's own name registers again.
    """
    name = _args.text("name", name)
    if not name:
        raise attnprof.Error("name is empty: give the name to pass as attn_implementation")
    backend = _args.text("backend", backend)
    threads = _args.whole("threads", threads)
    replace = _args.flag("replace", replace)
    _core.check_call_args(backend=backend, threads=threads)

    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    try:  # transformers takes a name with "flash" in it for a FlashAttention kernel it then looks for, and fails
        from transformers.utils.generic import is_flash_attention_requested
    except ImportError:
        is_flash_attention_requested = None
    if is_flash_attention_requested is not None and is_flash_attention_requested(
            requested_attention_implementation=name):
        raise attnprof.Error(f"name {name!r}: transformers reads an attn_implementation naming flash as a "
                             "FlashAttention kernel to load, and would not call attnprof; pick a name without 'flash'")

    # What registering would replace: under another name than attnprof's own, an attention function or a mask
    # function not attnprof's (transformers' built-ins, another library's).
    attention, masks = AttentionInterface(), AttentionMaskInterface()
    theirs = name in attention and not getattr(attention[name], "_attnprof", False)
    theirs |= name in masks and masks[name] is not _hf_masks.attnprof_mask
    if name != NAME and (name == "eager" or theirs) and not replace:
        raise attnprof.Error(f"name {name!r} is an attention transformers already has: registering attnprof as "
                             f"{name!r} would replace it for every model in this process; pick another name, or "
                             "pass replace=True")

    def attnprof_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                                   scaling: float | None = None, is_causal: bool | None = None, **kwargs):
        out = _forward(module, query, key, value, attention_mask, dropout, scaling, is_causal, backend, threads,
                       kwargs)
        return out, None

    attnprof_attention_forward._attnprof = True
    AttentionInterface.register(name, attnprof_attention_forward)
    AttentionMaskInterface.register(name, _hf_masks.attnprof_mask)
    return name


def _layer_window(module, kwargs):
    """The layer's sliding window in keys (the current one included, as transformers counts it), or None."""
    window = kwargs.get("sliding_window")
    if window is None:
        window = getattr(module, "sliding_window", None)
    if window is None:
        return None
    window = _args.whole("sliding_window", window, _args.INT64)
    if window <= 0:
        raise attnprof.Error(f"sliding_window is {window}: a window of zero keys or fewer sees nothing; give the "
                             "keys each query sees (the current one included), or None for none")
    return window


def _layer_softcap(module, kwargs):
    softcap = kwargs.get("softcap")
    if softcap is None:
        softcap = getattr(getattr(module, "config", None), "attn_logit_softcapping", None)
    return softcap


def _forward(module, query, key, value, attention_mask, dropout, scaling, is_causal, backend, threads, kwargs):
    if dropout:
        raise attnprof.Error(f"attnprof attention has no dropout (got {dropout}): set attention_dropout=0")
    if kwargs.get("position_bias") is not None:
        raise attnprof.Error("attnprof attention takes no position_bias: fold it into a float attention mask")
    if kwargs.get("output_attentions", False):
        raise attnprof.Error("attnprof attention does not return attention weights (output_attentions=False)")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    window = _layer_window(module, kwargs)
    softcap = _layer_softcap(module, kwargs)
    if window is not None and not causal:
        raise attnprof.Error(f"a bidirectional sliding window ({window} keys) has no structural form in attnprof: "
                             "use a causal layer, or pass the pattern as a 4-D mask")
    # transformers' causal is each sequence's bottom-right causal (a sliding window the same way).
    structural = "sliding-window" if window is not None else "causal-bottom-right" if causal else "none"
    common = dict(backend=backend, window=window, scale=scaling, threads=threads, softcap=softcap)

    packed = isinstance(attention_mask, _hf_masks.PackedBatch)
    if packed or kwargs.get("cu_seq_lens_q") is not None or kwargs.get("cu_seq_lens_k") is not None:
        return _packed(query, key, value, attention_mask if packed else None, structural, common, kwargs)
    # q, k and v as [B, S, H, D] views (transformers' projections are laid out so): the output is the layout
    # transformers wants back, with no transpose copied.
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    if attention_mask is None:
        mask = structural
        if mask == "causal-bottom-right" and query.shape[2] == key.shape[2]:
            mask = "causal"  # the same band, on the path every backend takes
        return attnprof.attention(q, k, v, mask=mask, layout="bshd", **common)
    if attention_mask.ndim == 2:
        q_rows, kv_rows = _rows(attention_mask, query.shape[2], key.shape[2])
        return attnprof.attention(q, k, v, mask=structural, layout="bshd", q_rows=q_rows, kv_rows=kv_rows, **common)
    return _custom(q, k, v, attention_mask, common)


def _rows(mask, seq, kv_seq):
    """q_rows and kv_rows ([B, 2] int32, on the mask's device) of a 2-D padding mask (attnprof_mask's forms).

    Its columns are positions in order, the last of them the last query's: the queries are its last seq columns.
    The keys are its last kv_seq columns where it has as many or more (a sliding layer keeps the last keys); where
    it has fewer, a decoding step's mask (one query) is the layer's last keys (a cache may hand the layer keys
    before the mask's first column: outside its window, never seen), and a longer step's is the layer's first keys
    (a static cache's slots written so far, the rest empty)."""
    if mask.dtype != _hf_masks.torch.bool:
        mask = mask.bool()  # transformers' 1-and-0 padding mask
    width = mask.shape[-1]
    if width < seq:
        raise attnprof.Error(f"attention_mask has {width} columns, fewer than the {seq} queries: its last "
                             f"{seq} columns are the queries' own positions")
    skipped = width - kv_seq if width > kv_seq else 0  # columns before the layer's first key
    kv_rows = _hf_masks.runs(mask[:, skipped:] if skipped else mask, "attention_mask", skipped)
    if width < kv_seq and seq == 1:
        kv_rows = kv_rows + (kv_seq - width)  # the mask's columns are the last keys
    if seq == 1:
        return None, kv_rows
    if seq == kv_seq and width >= kv_seq:
        return kv_rows, kv_rows  # the same columns
    return _hf_masks.runs(mask[:, -seq:], "attention_mask's query columns", width - seq), kv_rows


def _packed(query, key, value, packed, structural, common, kwargs):
    """A padding-free batch: every row's documents as one packed call over [B * S, H, D] views."""
    import torch

    batch, heads, seq, dim = query.shape
    if key.shape[2] != seq:
        raise attnprof.Error(f"a packed batch has as many keys as queries (no cache), got {seq} queries and "
                             f"{key.shape[2]} keys")
    total = batch * seq
    position_ids = kwargs.get("position_ids")
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if (cu_q is None) != (cu_k is None):
        raise attnprof.Error("a packed batch needs both cu_seq_lens_q and cu_seq_lens_k (or neither, with "
                             "position_ids restarting at each document)")
    starts = None
    if position_ids is not None:
        if position_ids.shape[-1] != seq:
            raise attnprof.Error(f"position_ids has {position_ids.shape[-1]} positions but the batch has {seq} "
                                 "tokens a row")
        starts = _hf_masks.document_starts(position_ids.expand(batch, -1))
    elif packed is not None:
        ids = packed.sequence_ids.expand(batch, -1)
        starts = torch.ones_like(ids, dtype=torch.bool)
        starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
        starts = starts.reshape(-1)
    if cu_q is not None:
        # The collator's maxima are ints; one given as a tensor is not read here (that would be a host read on
        # CUDA): None, and attnprof takes the longest itself.
        max_q, max_k = (None if isinstance(m, torch.Tensor) else m
                        for m in (kwargs.get("max_length_q"), kwargs.get("max_length_k")))
        if starts is not None:
            # Checked against position_ids (or the packed mask) where they can be read (the CPU, the checking
            # mode), when the call runs.
            source = "position_ids" if position_ids is not None else "the packed mask"
            cu_q = _hf_masks.agreeing(cu_q, starts, "cu_seq_lens_q", source, batch)
            cu_k = _hf_masks.agreeing(cu_k, starts, "cu_seq_lens_k", source, batch)
    else:
        if starts is None:
            raise attnprof.Error("a packed batch needs cu_seq_lens_q and cu_seq_lens_k or position_ids")
        # From the positions with torch ops on their device (no host read: the count of documents stays on the
        # device), and the longest as an int without reading it: no document spans two rows.
        cu_q = cu_k = _hf_masks.cu_seqlens_of(starts)
        max_q = max_k = seq
    q = query.transpose(1, 2).reshape(total, heads, dim)
    k = key.transpose(1, 2).reshape(total, key.shape[1], dim)
    v = value.transpose(1, 2).reshape(total, value.shape[1], value.shape[3])
    mask = "causal" if structural == "causal-bottom-right" else structural  # equal lengths: the same band
    out = attnprof.attention(q, k, v, mask=mask, cu_seqlens_q=cu_q.to(torch.int32), cu_seqlens_k=cu_k.to(torch.int32),
                             max_seqlen_q=max_q, max_seqlen_k=max_k, **common)
    return out.view(batch, seq, heads, out.shape[-1])


def _custom(q, k, v, mask, common):
    """A 4-D mask attnprof cannot read as structure: a backend that takes a tensor mask runs it."""
    backend = common["backend"]
    if backend == "auto":
        reason = "a 4-D attention mask with no causal, window or padding structure (a custom mask)"
        if reason not in _warned:
            _warned.add(reason)
            picked = _picked_for_tensor_mask(q, k, bool(q.requires_grad or k.requires_grad or v.requires_grad))
            warnings.warn(f"attnprof: {reason} runs on {picked}, a backend that takes a tensor mask, not on "
                          "flash's structural path (warned once per process)", stacklevel=4)
        return attnprof.attention(q, k, v, attn_mask=mask.detach(), layout="bshd", **common)
    try:
        return attnprof.attention(q, k, v, attn_mask=mask.detach(), layout="bshd", **common)
    except attnprof.Error as e:
        raise attnprof.Error(f"backend {backend!r} cannot run this model's 4-D attention mask (a pattern with no "
                             f"causal, window or padding structure): {e}") from None


def _picked_for_tensor_mask(q, k, train: bool) -> str:
    """The backend auto picks for a tensor mask on this shape (attnprof.explain's answer), for the warning."""
    batch, seq, heads, dim = q.shape
    dtype = {"torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16"}.get(str(q.dtype), "fp32")
    try:
        e = attnprof.explain(batch=batch, heads=heads, kv_heads=k.shape[2], seq=seq, kv_seq=k.shape[1],
                             head_dim=dim, dtype=dtype, device=q.device.type, mask="boolean",
                             pass_="train" if train else "forward")
    except attnprof.Error:
        return "the backend auto picks"
    return repr(e.auto.backend) if e.auto is not None else "the backend auto picks"
