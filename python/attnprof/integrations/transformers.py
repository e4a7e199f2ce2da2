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
from attnprof import _args, _core

NAME = "attnprof"


def register(name: str = NAME, backend: str = "auto", threads: int = 0, *, replace: bool = False) -> str:
    """Registers attnprof with transformers' AttentionInterface and AttentionMaskInterface as `name`.

    The mask function is SDPA's (a boolean mask, or None when causal or full
    attention needs no tensor). Returns the name to pass as attn_implementation.
    Its arguments are checked here, as a call would check them: a backend no
    build has, or a thread count out of range, is refused now rather than at
    the model's first forward. A name transformers (or another library)
    already has, such as "sdpa" or "eager", would be replaced for every model
    in the process: it is refused unless replace=True; attnprof's own name
    registers again.
    """
    name = _args.text("name", name)
    if not name:
        raise attnprof.Error("name is empty: give the name to pass as attn_implementation")
    backend = _args.text("backend", backend)
    threads = _args.whole("threads", threads)
    replace = _args.flag("replace", replace)
    _core.check_call_args(backend=backend, threads=threads)

    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    # What registering would replace: under another name than attnprof's own, an attention function not
    # attnprof's or a mask function not SDPA's (transformers' built-ins, another library's).
    attention, masks = AttentionInterface(), AttentionMaskInterface()
    theirs = name in attention and not getattr(attention[name], "_attnprof", False)
    theirs |= name in masks and masks[name] is not sdpa_mask
    if name != NAME and (name == "eager" or theirs) and not replace:
        raise attnprof.Error(f"name {name!r} is an attention transformers already has: registering attnprof as "
                             f"{name!r} would replace it for every model in this process; pick another name, or "
                             "pass replace=True")

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

    attnprof_attention_forward._attnprof = True
    AttentionInterface.register(name, attnprof_attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
