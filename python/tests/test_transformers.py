"""attnprof.integrations.transformers: a tiny random-weight Llama (grouped-query heads, no downloads) on a
padded batch runs on attn_implementation="attnprof" and matches "sdpa": logits on the tokens that are not
padding, and every parameter's gradient of a loss over those tokens (attnprof's own backward). The padding
reaches attnprof as per-sequence rows (test_transformers_structure.py tests the structure case by case).

transformers is a test dependency (scripts/setup.sh installs it): a missing one fails here, never skips."""


import pytest
import torch

import attnprof
import attnprof.integrations.transformers as apt

try:
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError as e:  # pragma: no cover - the failure is the message
    raise ImportError(f"transformers is not installed ({e}): run scripts/setup.sh, which pip installs it") from e

# float32 on the CPU: the two paths differ by summation order only.
LOGITS_TOL = 2e-4
GRAD_TOL = 2e-3  # relative to each gradient's largest entry


def tiny_llama(attn_implementation):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         attention_dropout=0.0)
    config._attn_implementation = attn_implementation
    model = LlamaForCausalLM(config).float()
    model.train()
    return model


def batch():
    torch.manual_seed(1)
    ids = torch.randint(0, 128, (3, 12))
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, 9:] = 0   # right padding
    mask[2, :4] = 0   # left padding
    return ids, mask


def run(model, ids, mask):
    logits = model(input_ids=ids, attention_mask=mask).logits
    keep = mask.bool()
    loss = logits[keep].logsumexp(-1).mean() - logits[keep][:, 0].mean()
    loss.backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_register_names_the_implementation():
    assert apt.register() == "attnprof"
    assert "attnprof" in transformers.AttentionInterface._global_mapping
    from transformers.masking_utils import AttentionMaskInterface

    from attnprof.integrations import _hf_masks

    assert AttentionMaskInterface._global_mapping["attnprof"] is _hf_masks.attnprof_mask


def test_register_refuses_a_name_transformers_reads_as_flash_attention():
    # transformers (is_flash_attention_requested) would look for a FlashAttention kernel by such a name, not call us.
    with pytest.raises(attnprof.Error) as e:
        apt.register("ap_flash")
    assert str(e.value) == ("name 'ap_flash': transformers reads an attn_implementation naming flash as a "
                            "FlashAttention kernel to load, and would not call attnprof; pick a name without 'flash'")


def test_padded_llama_matches_sdpa_in_logits_and_gradients(monkeypatch):
    apt.register()
    calls = []
    real = attnprof.attention

    def counting(*args, **kwargs):
        calls.append(kwargs.get("attn_mask") is None and kwargs.get("kv_rows") is not None)
        return real(*args, **kwargs)

    monkeypatch.setattr(attnprof, "attention", counting)
    ids, mask = batch()
    ours = tiny_llama("attnprof")
    theirs = tiny_llama("sdpa")
    theirs.load_state_dict(ours.state_dict())
    got_logits, got_grads = run(ours, ids, mask)
    want_logits, want_grads = run(theirs, ids, mask)
    assert calls and all(calls), "every layer's attention ran on attnprof with the padded batch's rows, no mask tensor"
    keep = mask.bool()
    torch.testing.assert_close(got_logits[keep], want_logits[keep], atol=LOGITS_TOL, rtol=LOGITS_TOL)
    assert set(got_grads) == set(want_grads)
    for name, want in want_grads.items():
        err = (got_grads[name] - want).abs().max().item()
        assert err <= GRAD_TOL * max(want.abs().max().item(), 1e-6), f"{name}: max |diff| {err}"


def test_unpadded_batch_takes_the_causal_path():
    apt.register()
    ids = torch.randint(0, 128, (2, 10))
    ours, theirs = tiny_llama("attnprof"), tiny_llama("sdpa")
    theirs.load_state_dict(ours.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(ours(input_ids=ids).logits, theirs(input_ids=ids).logits, atol=LOGITS_TOL,
                                   rtol=LOGITS_TOL)
