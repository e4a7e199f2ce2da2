"""Drop-in entry points: the functions models already call, with their signatures and defaults, on attnprof.

    from attnprof import scaled_dot_product_attention          # for torch.nn.functional's
    from attnprof import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache   # for flash_attn's

Each maps its arguments onto attnprof.attention (return_lse=True for a log-sum-exp) and nothing else: the
same layouts, the same default mask as its source (no mask for all four), the same band. What attnprof does
not compute (dropout, ALiBi, a window that reaches past the diagonal, appending to a cache, rotary embeddings)
is refused in one line naming the argument (attnprof.Error), never ignored.

Each takes one keyword beyond its source's, backend= ("auto" unless named), which attnprof.attention takes.
"""

from __future__ import annotations

import sys

from . import _args, _options
from ._args import ArgumentTypeError
from ._core import Error

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache", "scaled_dot_product_attention"]


# attnprof.attention, set by attnprof/__init__.py once it is defined (that module imports this one first). Set at
# import, never at a call: a first call traced by torch.compile would set it inside the trace, and the graph,
# guarded on its being unset, would be compiled again at the next call.
_front = None


def _attention(*args, **kwargs):
    return _front(*args, **kwargs)


def _refuse(fn: str, name: str, value, why: str):
    raise Error(f"{fn}: {name}={_shown(value)} is not computed by attnprof: {why}")


def _shown(value) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "dtype"):
        return f"<{type(value).__name__} {list(shape)}>"
    return repr(value)


def _no_dropout(fn: str, dropout_p):
    if dropout_p.__class__ is float and dropout_p == 0.0:  # the common value, checked without a call
        return
    p = _args.real("dropout_p", dropout_p, optional=False)
    if p != 0.0:
        _refuse(fn, "dropout_p", dropout_p, "attnprof has no dropout; pass 0.0 (as in eval mode)")


def _no_alibi(fn: str, alibi_slopes):
    if alibi_slopes is not None:
        _refuse(fn, "alibi_slopes", alibi_slopes, "attnprof has no ALiBi bias; add it as an additive attn_mask "
                                                  "through attnprof.attention")


def _softcap(fn: str, softcap):
    # flash_attn: 0.0 is no cap; attnprof: None is no cap, and c > 0 caps at c the same way (tanh(s / c) * c).
    if softcap.__class__ is float and softcap == 0.0:
        return None
    c = _args.real("softcap", softcap, optional=False)
    if c < 0:
        raise Error(f"{fn}: softcap={softcap!r} must be 0.0 (no cap) or positive")
    return None if c == 0 else c


def _length(x, dim: int):
    shape = getattr(x, "shape", None)
    return int(shape[dim]) if shape is not None and len(shape) > abs(dim) else None


def _band(fn: str, causal, window_size, seqlen_q, seqlen_k):
    """flash_attn's (causal, window_size) as attnprof's (mask, window), exactly.

    flash_attn: query i sees keys j with i + Sk - Sq - left <= j <= i + Sk - Sq + right (its diagonal at the
    bottom right), a negative side unbounded; mha_fwd first makes a side of at least seqlen_k unbounded and
    then causal=True sets right to 0. attnprof's sliding window of w keys sees i + Sk - Sq - w < j <= i + Sk - Sq:
    flash_attn's (left, 0) is attnprof's window left + 1, and (-1, 0) its causal_bottom_right. With one query a
    sequence the diagonal is the last key, so right (and causal) changes nothing: flash_attn drops causal there too.
    """
    if causal is not True and causal is not False:
        causal = _args.flag("causal", causal)
    if window_size.__class__ is tuple and window_size == (-1, -1):  # the default, checked without a call
        return ("causal_bottom_right", None) if causal else ("none", None)
    if isinstance(window_size, str):
        raise ArgumentTypeError(f"{fn}: window_size must be (left, right), got {window_size!r}")
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise ArgumentTypeError(f"{fn}: window_size must be (left, right), got {window_size!r}") from None
    given = (left, right)
    left = _args.whole("window_size[0]", left, _args.INT64)
    right = _args.whole("window_size[1]", right, _args.INT64)
    if seqlen_k is not None:
        left = -1 if left >= seqlen_k else left
        right = -1 if right >= seqlen_k else right
    left, right = max(left, -1), max(right, -1)
    if causal:
        right = 0
    elif seqlen_q == 1 and right != 0:
        right = -1 if left == -1 else 0
    if right != 0 and not right == left == -1:
        _refuse(fn, "window_size", given,
                f"{'a right window' if right > 0 else 'a window with no right bound'} (keys after the diagonal "
                f"{'up to ' + str(right) if right > 0 else 'without a bound'}, with causal={causal}): attnprof's "
                "windows end at the bottom-right diagonal, (w, 0) or causal=True; a bidirectional window is not "
                "computed")
    return _options.band(None, (left, right))  # the band as attention(window=(left, right)) maps it


def _torch():
    torch = sys.modules.get("torch")
    if torch is None:
        import torch
    return torch


# ---- torch.nn.functional.scaled_dot_product_attention


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
                                 enable_gqa=False, backend: str = "auto"):
    """torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
    is_causal=False, *, scale=None, enable_gqa=False) on attnprof (scale and enable_gqa keyword-only, as torch's).

    query [B, H, L, E], key and value [B, Hkv, S, E] (or each without B: [H, L, E]). No mask by default;
    is_causal=True is the top-left causal mask (query i sees keys j <= i), as torch's; attn_mask is torch's:
    boolean (True attends) or an additive float, broadcastable to [B, H, L, S] (a float mask of another dtype
    than query's is cast to query's, as torch accepts it). scale None is 1 / sqrt(E). enable_gqa=True lets
    Hkv divide H (query head h reads key head h // (H / Hkv), as torch's); without it the heads must match or
    key have one head (torch broadcasts it). A row that sees no key is zero on flash, as torch's own SDPA
    gives it; the textbook composites (naive, naive_inplace) give NaN there. Gradients flow to query, key and value
    (attnprof's own backward), never to attn_mask.

    Refused by name: dropout_p other than 0.0; attn_mask with is_causal=True (torch refuses it too); H and
    Hkv that differ without enable_gqa=True (Hkv 1 aside).
    """
    fn = "scaled_dot_product_attention"
    _no_dropout(fn, dropout_p)
    is_causal = _args.flag("is_causal", is_causal)
    enable_gqa = _args.flag("enable_gqa", enable_gqa)
    if is_causal and attn_mask is not None:
        raise Error(f"{fn}: attn_mask with is_causal=True: pass one of them (torch refuses both: "
                    "'Explicit attn_mask should not be set when is_causal=True')")
    unbatched = getattr(query, "ndim", None) == 3
    if unbatched:
        # torch takes [H, L, E] as one batch: attnprof's [1, H, L, E] views of the same memory.
        query, key, value = query[None], _batched(fn, "key", key), _batched(fn, "value", value)
    heads, kv_heads = _length(query, 1), _length(key, 1)
    if not enable_gqa and heads is not None and kv_heads is not None and heads != kv_heads and kv_heads != 1:
        raise Error(f"{fn}: query has {heads} heads and key {kv_heads}: pass enable_gqa=True for grouped-query "
                    "attention (torch refuses it too)")
    if attn_mask is not None:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(attn_mask, torch.Tensor) and attn_mask.is_floating_point() \
                and attn_mask.dtype != query.dtype:
            attn_mask = attn_mask.to(query.dtype)  # a copy of the mask: attnprof reads a float mask in q's dtype
    # No mask name beside a tensor: the tensor is the whole mask (a key-padding shape is not made rows, which
    # would zero the padded queries' outputs where torch computes them).
    mask = None if attn_mask is not None else "causal" if is_causal else "none"
    out = _attention(query, key, value, backend=backend, mask=mask, scale=scale, attn_mask=attn_mask)
    return out[0] if unbatched else out


def _batched(fn: str, name: str, x):
    if getattr(x, "ndim", None) != 3:
        raise Error(f"{fn}: query is [H, L, E] (3-d) but {name} has shape {list(getattr(x, 'shape', []))}: pass "
                    "3-d key and value with a 3-d query")
    return x[None]


# ---- flash_attn (FlashAttention 2's Python interface)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False, *, backend: str = "auto"):
    """flash_attn.flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False) on attnprof.

    q [B, Sq, H, D], k and v [B, Sk, Hkv, D] (attnprof's layout="bshd"), Hkv dividing H. No mask by default;
    causal=True aligns the diagonal to the bottom right (query i sees keys j <= i + Sk - Sq: a row with none is
    zero on flash); window_size=(left, right) as flash_attn's, query i seeing keys from i + Sk - Sq - left to
    i + Sk - Sq + right, -1 unbounded: (left, 0) or causal=True with (left, -1) is attnprof's sliding window of
    left + 1 keys, (-1, 0) is causal. softmax_scale None is 1 / sqrt(D); softcap 0.0 is no cap, c > 0 is
    tanh(s / c) * c on the scaled scores. deterministic sums dQ in a fixed order in the backward (on a GPU).
    Gradients flow through attnprof's own backward.

    return_attn_probs=True returns (out, softmax_lse, None): the natural log-sum-exp of each query row's scaled
    scores, float32 [B, H, Sq] as flash_attn's, from attention(return_lse=True) (flash, efficient, cudnn);
    -inf for a row that sees no key (flash_attn writes +inf there, -inf where it splits the keys); it carries
    no gradient. The third item, flash_attn's dropout mask, is None (no dropout).

    Refused by name: dropout_p other than 0.0, alibi_slopes, a window that reaches past the diagonal
    (right > 0, or right -1 with left >= 0, without causal), softcap below 0.
    """
    fn = "flash_attn_func"
    _no_dropout(fn, dropout_p)
    _no_alibi(fn, alibi_slopes)
    mask, window = _band(fn, causal, window_size, _length(q, 1), _length(k, 1))
    softcap = _softcap(fn, softcap)
    deterministic = _args.flag("deterministic", deterministic)
    lse = _args.flag("return_attn_probs", return_attn_probs)
    result = _attention(q, k, v, backend=backend, mask=mask, window=window, scale=softmax_scale, layout="bshd",
                        deterministic=deterministic, softcap=softcap, return_lse=lse)
    return (*result, None) if lse else result


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, *,
                           backend: str = "auto"):
    """flash_attn.flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
    dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
    deterministic=False, return_attn_probs=False, block_table=None) on attnprof.

    A packed batch: q [total_q, H, D], k and v [total_k, Hkv, D], cu_seqlens_q and cu_seqlens_k int32
    [batch + 1] cumulative lengths from 0 on q's device, max_seqlen_q and max_seqlen_k at least every length
    (ints, as flash_attn takes them: the kernels are sized by them, nothing is read back to the host on
    flash). Each sequence attends to its own keys with flash_attn_func's band at its own bottom-right
    diagonal (no mask by default; causal, window_size, softcap and softmax_scale as there; a side of the
    window of at least max_seqlen_k is unbounded, as flash_attn_varlen_func makes it).

    return_attn_probs=True returns (out, softmax_lse, None), softmax_lse float32 [H, total_q] as flash_attn's
    varlen lse (-inf on a row that sees no key, no gradient).

    Refused by name: dropout_p other than 0.0, alibi_slopes, a window past the diagonal, softcap below 0,
    block_table (a paged packed batch: attnprof's packed call reads no block table; flash_attn_with_kvcache
    takes a paged cache).
    """
    fn = "flash_attn_varlen_func"
    _no_dropout(fn, dropout_p)
    _no_alibi(fn, alibi_slopes)
    if block_table is not None:
        _refuse(fn, "block_table", block_table, "attnprof's packed call reads no block table (a paged cache goes "
                                                "through flash_attn_with_kvcache(block_table=...))")
    max_seqlen_q = _args.whole("max_seqlen_q", max_seqlen_q, _args.INT64, optional=True)
    max_seqlen_k = _args.whole("max_seqlen_k", max_seqlen_k, _args.INT64, optional=True)
    mask, window = _band(fn, causal, window_size, max_seqlen_q, max_seqlen_k)
    softcap = _softcap(fn, softcap)
    deterministic = _args.flag("deterministic", deterministic)
    lse = _args.flag("return_attn_probs", return_attn_probs)
    result = _attention(q, k, v, backend=backend, mask=mask, window=window, scale=softmax_scale,
                        deterministic=deterministic, softcap=softcap, cu_seqlens_q=cu_seqlens_q,
                        cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                        return_lse=lse)
    return (*result, None) if lse else result


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False, *,
                            backend: str = "auto"):
    """flash_attn.flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
    cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None, softmax_scale=None,
    causal=False, window_size=(-1, -1), softcap=0.0, rotary_interleaved=True, alibi_slopes=None, num_splits=0,
    return_softmax_lse=False) on attnprof, inference only.

    q [B, Sq, H, D]. k_cache and v_cache [B, S_cache, Hkv, D], or with block_table (int32 [B, blocks_per_seq])
    flash_attn's paged cache [num_blocks, page_block_size, Hkv, D], read in place as attnprof's paged cache
    [num_pages, Hkv, page_size, D] through a transposed view (page_block_size a power of two). cache_seqlens
    (int32 [B] on q's device, or an int) is each sequence's key count, None the whole cache (the whole table
    when paged); cache_leftpad (int32 [B]) the first key of each sequence, so sequence b reads keys
    cache_leftpad[b] .. cache_seqlens[b] - 1 (attnprof's kv_rows, read on the device: no host read).
    No mask by default; causal and window_size as flash_attn_func's, each sequence's diagonal at its last key
    (a decode step's query sees its whole cache). softcap and softmax_scale as there. num_splits is a hint in
    flash_attn (0 its heuristic): any whole number is taken and attnprof sizes its own split.

    return_softmax_lse=True returns (out, softmax_lse), softmax_lse float32 [B, H, Sq] (-inf on a row that
    sees no key), from attention(return_lse=True): a contiguous cache only.

    Refused by name: k and v (appending to the cache: write the new keys into k_cache and v_cache and pass the
    longer cache_seqlens), rotary_cos and rotary_sin (rotate q and k first), cache_batch_idx (index the caches
    first), cache_leftpad with block_table (flash_attn refuses it too), alibi_slopes, a window past the
    diagonal, softcap below 0, return_softmax_lse=True with block_table (attnprof's paged forward keeps no
    log-sum-exp: it needs the C++ paged path to write one), a cache_seqlens or cache_leftpad that is not
    int32 [B].
    """
    fn = "flash_attn_with_kvcache"
    if k is not None or v is not None:
        name = "k" if k is not None else "v"
        _refuse(fn, name, k if k is not None else v,
                "attnprof does not append to the cache; write the new keys and values into k_cache and v_cache "
                "(k_cache[b, n:n + s] = k[b]) and pass the longer cache_seqlens")
    for name, value in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        if value is not None:
            _refuse(fn, name, value, "attnprof applies no rotary embedding; rotate q and k before the call")
    if cache_batch_idx is not None:
        _refuse(fn, "cache_batch_idx", cache_batch_idx,
                "attnprof reads sequence b's cache at batch b; index the caches first (k_cache[cache_batch_idx])")
    _no_alibi(fn, alibi_slopes)
    _args.flag("rotary_interleaved", rotary_interleaved)  # meaningful only with rotary_cos, refused above
    _args.whole("num_splits", num_splits)  # a hint: attnprof sizes its own split
    return_lse = _args.flag("return_softmax_lse", return_softmax_lse)
    softcap = _softcap(fn, softcap)
    torch = _torch()
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or t.ndim != 4:
            raise Error(f"{fn}: {name} must be a 4-d torch tensor, got {_shown(t)}")
    batch = q.shape[0]
    paged = block_table is not None
    if paged:
        if cache_leftpad is not None:
            _refuse(fn, "cache_leftpad", cache_leftpad, "not with block_table (flash_attn refuses the pair too)")
        if not isinstance(block_table, torch.Tensor) or block_table.ndim != 2:
            raise Error(f"{fn}: block_table must be int32 [B, blocks_per_seq], got {_shown(block_table)}")
        seqlen_k = block_table.shape[1] * k_cache.shape[1]
    else:
        seqlen_k = k_cache.shape[1]
    ends = _lengths(fn, "cache_seqlens", cache_seqlens, batch, q.device, torch)
    begins = _lengths(fn, "cache_leftpad", cache_leftpad, batch, q.device, torch)
    mask, window = _band(fn, causal, window_size, q.shape[1], seqlen_k)
    if paged and return_lse:
        _refuse(fn, "return_softmax_lse", True, "with block_table: attnprof's paged forward keeps no log-sum-exp "
                                                "(it needs the C++ paged path to write one)")
    try:
        with torch.no_grad():  # inference only, as flash_attn_with_kvcache
            return _kvcache_call(fn, q, k_cache, v_cache, paged, block_table, begins, ends, batch, seqlen_k, mask,
                                 window, softmax_scale, softcap, return_lse, backend, torch)
    except Error as e:
        # The library names its own arguments: say which of the caller's they came from.
        text = str(e)
        if text.startswith("kv_rows"):
            raise Error(f"{fn}: (cache_leftpad, cache_seqlens) are attnprof's kv_rows: {text}") from None
        if text.startswith("seq_lens"):
            raise Error(f"{fn}: cache_seqlens is attnprof's seq_lens: {text}") from None
        raise


def _kvcache_call(fn, q, k_cache, v_cache, paged, block_table, begins, ends, batch, seqlen_k, mask, window,
                  softmax_scale, softcap, return_lse, backend, torch):
    """The call itself, under no_grad: a paged cache through the transposed view, else kv_rows where needed."""
    if paged:
        if ends is None or isinstance(ends, int):
            ends = torch.full((batch,), seqlen_k if ends is None else ends, dtype=torch.int32, device=q.device)
        return _attention(q, k_cache.transpose(1, 2), v_cache.transpose(1, 2), backend=backend, mask=mask,
                          window=window, scale=softmax_scale, layout="bshd", softcap=softcap,
                          block_table=block_table, seq_lens=ends)
    kv_rows = None
    if begins is not None or not (ends is None or isinstance(ends, int) and ends == seqlen_k):
        # Each sequence's keys as kv_rows (begin, end) pairs, made on the device with torch ops.
        ends = seqlen_k if ends is None else ends
        if isinstance(ends, int):
            ends = torch.full((batch,), ends, dtype=torch.int32, device=q.device)
        if begins is None or isinstance(begins, int):
            begins = torch.full((batch,), begins or 0, dtype=torch.int32, device=q.device)
        kv_rows = torch.stack((begins, ends), 1)
    return _attention(q, k_cache, v_cache, backend=backend, mask=mask, window=window, scale=softmax_scale,
                      layout="bshd", softcap=softcap, kv_rows=kv_rows, return_lse=return_lse)


def _lengths(fn: str, name: str, value, batch: int, device, torch):
    """cache_seqlens / cache_leftpad: None, an int, or int32 [B] on q's device (never read on the host)."""
    if value is None:
        return None
    if not isinstance(value, torch.Tensor):
        return _args.whole(name, value)
    if value.dtype != torch.int32 or tuple(value.shape) != (batch,) or value.device != device:
        raise Error(f"{fn}: {name} must be an int or int32 [B] = [{batch}] on q's device ({device}), got "
                    f"{value.dtype} {list(value.shape)} on {value.device}")
    return value
