"""Attention as bench/train_step.py's two sides call it: attnprof.attention and
PyTorch's SDPA, each in the signature of transformers' attention registry, so
that transformers' LlamaForCausalLM and our own model (bench/llama_model.py)
call them alike. Both take unpadded causal batches only and refuse anything
else in one line (Refused). attention_op names the ops whose time is
attention's in a profiled step (train_step's _attention_share).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class Refused(Exception):
    """A one-line refusal: main prints it as `train_step: error: ...` and exits 2."""



# ---- Attention functions, in the signature transformers' attention registry calls:
# (module, query [B, H, S, D], key, value [B, Hkv, S, D], attention_mask, dropout=, scaling=, **kwargs)
# -> (attn_output [B, S, H, D], None). Our own model calls them the same way.

def _check_causal_only(module, query, key, attention_mask, dropout, kwargs) -> None:
    if attention_mask is not None and not _plain_causal(attention_mask, query.shape[2], key.shape[2]):
        raise Refused(f"attention_mask {tuple(attention_mask.shape)} {attention_mask.dtype} is not plain causal: this "
                      "benchmark takes unpadded batches only (padded masks are another issue's work)")
    is_causal = kwargs.get("is_causal")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    if not is_causal:
        raise Refused("non-causal attention asked (is_causal=False): this benchmark takes causal decoders only")
    if kwargs.get("sliding_window") is not None:
        raise Refused(f"sliding_window={kwargs['sliding_window']} asked: this benchmark takes full causal attention only")
    if dropout:
        raise Refused(f"attention dropout {dropout} asked: attnprof has no dropout; set attention_dropout=0")


def _plain_causal(mask, q_len: int, kv_len: int) -> bool:
    """Whether a 4-D mask (bool: True keeps; float: 0 keeps) is the top-left causal mask, broadcast over B and H."""
    if not isinstance(mask, torch.Tensor) or mask.dim() != 4 or tuple(mask.shape[-2:]) != (q_len, kv_len):
        return False
    keep = mask if mask.dtype == torch.bool else mask == 0
    causal = torch.ones(q_len, kv_len, dtype=torch.bool, device=mask.device).tril()
    return bool((keep == causal).all())


def make_attnprof_attention(backend: str):
    import attnprof

    def attnprof_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        _check_causal_only(module, query, key, attention_mask, dropout, kwargs)
        attnprof_attention.calls += 1
        # [B, S, H, D] views in and out (layout="bshd"): the output is the
        # [B, S, H, D] tensor the caller reshapes, with no transpose copy.
        # Grouped K/V heads are read as they are (no repeat).
        out = attnprof.attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), backend=backend,
                                 mask="causal", scale=scaling, layout="bshd")
        return out, None

    attnprof_attention.calls = 0
    return attnprof_attention


_SDPA_GQA = [None]  # whether this torch's SDPA takes enable_gqa (torch >= 2.5), found on the first call


def sdpa_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """Our own model's SDPA side, as transformers' sdpa_attention_forward calls it for an unpadded causal batch."""
    _check_causal_only(module, query, key, attention_mask, dropout, kwargs)
    group = query.shape[1] // key.shape[1]
    if group > 1 and _SDPA_GQA[0] is not False:
        try:
            out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling, enable_gqa=True)
            _SDPA_GQA[0] = True
            return out.transpose(1, 2).contiguous(), None
        except TypeError:
            _SDPA_GQA[0] = False
    if group > 1:
        key, value = key.repeat_interleave(group, 1), value.repeat_interleave(group, 1)
    out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


# The ops of either side in a torch.profiler trace (attnprof::attention_train: traces made before the forward ops
# became one).
ATTNPROF_OPS = ("attnprof::attention", "attnprof::attention_backward", "attnprof::attention_train")
SDPA_OP_PREFIXES = ("aten::scaled_dot_product_attention", "aten::_scaled_dot_product_")


def attention_op(name: str) -> bool:
    return name in ATTNPROF_OPS or name.startswith(SDPA_OP_PREFIXES)
