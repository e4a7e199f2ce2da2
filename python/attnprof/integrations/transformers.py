"""transformers models on attnprof: one call registers ``attn_implementation="attnprof"``.

    import attnprof.integrations.transformers as apt
    apt.register()                     # or register(backend="flash")
    model = LlamaForCausalLM.from_pretrained(..., attn_implementation="attnprof")

The attention function takes what transformers hands SDPA's: query [B, H, S, D],
key and value [B, Hkv, Skv, D] (grouped-query heads are read as they are, never
repeated), and the mask SDPA's mask function builds (registered for "attnprof"
too): None when the call is plainly causal (mask="causal") or plainly full
("none"), else a boolean [B, 1, S, Skv] tensor, padding included, which goes
to attnprof.attention as attn_mask=. Tensors that require grad go through
attnprof's own backward, so training a padded batch works on the backends
that have one (flash, efficient, cudnn; auto picks among them). Dropout,
position biases and attention outputs are refused with attnprof.Error.
"""

from __future__ import annotations

import attnprof

NAME = "attnprof"


def register(name: str = NAME, backend: str = "auto", threads: int = 0) -> str:
    """Registers attnprof with transformers' AttentionInterface and AttentionMaskInterface as `name`.

    The mask function is SDPA's (a boolean mask, or None when causal or full
    attention needs no tensor). Returns the name to pass as attn_implementation.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def attnprof_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                                   scaling: float | None = None, is_causal: bool | None = None, **kwargs):
        if dropout:
            raise attnprof.Error(f"attnprof attention has no dropout (got {dropout}): set attention_dropout=0")
        if kwargs.get("position_bias") is not None:
            raise attnprof.Error("attnprof attention takes no position_bias: fold it into a float attention mask")
        if kwargs.get("output_attentions", False):
            raise attnprof.Error("attnprof attention does not return attention weights (output_attentions=False)")
        # As transformers' SDPA path decides it: causal only without a mask
        # tensor, and never for a single query (decoding sees every cached key).
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        causal = query.shape[2] > 1 and attention_mask is None and causal
        if attention_mask is not None:
            out = attnprof.attention(query, key, value, backend=backend, attn_mask=attention_mask, scale=scaling,
                                     threads=threads, softcap=kwargs.get("softcap"))
        else:
            out = attnprof.attention(query, key, value, backend=backend, mask="causal" if causal else "none",
                                     scale=scaling, threads=threads, softcap=kwargs.get("softcap"))
        return out.transpose(1, 2).contiguous(), None

    AttentionInterface.register(name, attnprof_attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
