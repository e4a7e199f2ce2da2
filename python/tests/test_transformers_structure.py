"""attnprof.integrations.transformers passes structure, not a mask tensor (issue 50 item 2, issue 51 item 3).

Tiny random-weight models built from configs (hidden 64, 2 layers, vocab 128; no downloads) run on the CPU
through the registration with an explicit backend="flash", against transformers' own attention on the same
weights: a right-padded training step (logits on real tokens, every weight's gradient) for Llama and Qwen2
shapes, a padding-free packed batch (DataCollatorWithFlattening's position_ids and cu_seq_lens) equal to each
document run alone, Gemma-2 (soft cap, a window shorter than the sequence) against eager, and generate() on
left-padded prompts (greedy tokens equal to SDPA's in float32, dynamic and static caches). Every call is checked
to reach attnprof as rows or cumulative lengths, never as an attn_mask tensor. Then the bad inputs, one line each.
"""

import warnings

import pytest
import torch

import attnprof
import attnprof.integrations.transformers as apt
from attnprof.integrations import _hf_masks

try:
    from transformers import (AttentionInterface, DataCollatorWithFlattening, Gemma2Config, Gemma2ForCausalLM,
                              LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM)
except ImportError as e:  # pragma: no cover - the failure is the message
    raise ImportError(f"transformers is not installed ({e}): run scripts/setup.sh, which pip installs it") from e


# float32 on the CPU: the paths differ by summation order only.
LOGITS_TOL = 2e-4
GRAD_TOL = 2e-3  # relative to each gradient's largest entry
SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, attention_dropout=0.0)


def build(kind, attn_implementation, **extra):
    torch.manual_seed(0)
    if kind == "llama":
        config = LlamaConfig(**SMALL, **extra)
        cls = LlamaForCausalLM
    elif kind == "qwen2":
        config = Qwen2Config(**SMALL, **extra)
        cls = Qwen2ForCausalLM
    else:
        config = Gemma2Config(**SMALL, **{**dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=4,
                                                 attn_logit_softcapping=50.0, final_logit_softcapping=None), **extra})
        cls = Gemma2ForCausalLM
    config._attn_implementation = attn_implementation
    return cls(config).float()


def pair(kind, theirs="sdpa", **extra):
    ours = build(kind, "attnprof", **extra)
    other = build(kind, theirs, **extra)
    other.load_state_dict(ours.state_dict())
    return ours, other


@pytest.fixture
def calls(monkeypatch):
    """Registers attnprof with backend="flash" and records the keywords of every attnprof.attention call."""
    apt.register(backend="flash")
    seen = []
    real = attnprof.attention

    def recording(*args, **kwargs):
        seen.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(attnprof, "attention", recording)
    yield seen
    apt.register()


def right_padded():
    torch.manual_seed(1)
    ids = torch.randint(1, 128, (3, 12))
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, 9:] = 0
    mask[2, 5:] = 0
    return ids, mask


def train_step(model, ids, mask):
    model.train()
    logits = model(input_ids=ids, attention_mask=mask).logits
    keep = mask.bool()
    loss = logits[keep].logsumexp(-1).mean() - logits[keep][:, 0].mean()
    loss.backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def assert_same_step(ours, theirs, ids, mask):
    got_logits, got_grads = train_step(ours, ids, mask)
    want_logits, want_grads = train_step(theirs, ids, mask)
    keep = mask.bool()
    torch.testing.assert_close(got_logits[keep], want_logits[keep], atol=LOGITS_TOL, rtol=LOGITS_TOL)
    assert set(got_grads) == set(want_grads)
    for name, want in want_grads.items():
        err = (got_grads[name] - want).abs().max().item()
        assert err <= GRAD_TOL * max(want.abs().max().item(), 1e-6), f"{name}: max |diff| {err}"


def assert_structure_only(calls):
    assert calls, "attention ran on attnprof"
    for kw in calls:
        assert kw.get("attn_mask") is None, "no mask tensor reaches attnprof"
        assert kw["backend"] == "flash"


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_right_padded_training_matches_sdpa_through_rows(calls, kind):
    ours, theirs = pair(kind)
    ids, mask = right_padded()
    assert_same_step(ours, theirs, ids, mask)
    assert_structure_only(calls)
    rows = calls[0]["kv_rows"]
    assert rows.dtype == torch.int32 and rows.tolist() == [[0, 12], [0, 9], [0, 5]]
    assert calls[0]["q_rows"] is rows and calls[0]["mask"] == "causal-bottom-right"


DOCS = (5, 4, 3)


def documents():
    torch.manual_seed(2)
    return [torch.randint(1, 128, (n,)) for n in DOCS]


@pytest.mark.parametrize("flash_kwargs", [False, True], ids=["position_ids", "cu_seq_lens"])
def test_packed_batch_equals_each_document_alone(calls, flash_kwargs):
    ours = build("llama", "attnprof")
    ours.eval()
    docs = documents()
    collate = DataCollatorWithFlattening(return_flash_attn_kwargs=flash_kwargs)
    batch = collate([{"input_ids": d.tolist()} for d in docs])
    batch.pop("labels")
    with torch.no_grad():
        # No cache: transformers reads a padding-free batch from position_ids only where there is none (training).
        packed = ours(**batch, use_cache=False).logits[0]
        alone = [ours(input_ids=d[None]).logits[0] for d in docs]
    torch.testing.assert_close(packed, torch.cat(alone), atol=LOGITS_TOL, rtol=LOGITS_TOL)
    assert_structure_only(calls)
    layer_calls = calls[:2]
    for kw in layer_calls:
        assert kw["cu_seqlens_q"] is not None and kw["mask"] == "causal"
    if flash_kwargs:
        assert layer_calls[0]["cu_seqlens_q"].tolist() == [0, 5, 9, 12]
    else:
        # The fixed-shape form (no host read): the documents' starts, then empty sequences up to total + 1.
        assert layer_calls[0]["cu_seqlens_q"].tolist() == [0, 5, 9] + [12] * 10


def test_packed_training_gradients_equal_each_document_alone(calls):
    ours = build("llama", "attnprof")
    docs = documents()
    batch = DataCollatorWithFlattening()([{"input_ids": d.tolist()} for d in docs])
    ours(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits.square().mean() \
        .backward()
    got = {n: p.grad.clone() for n, p in ours.named_parameters()}
    ours.zero_grad()
    (torch.cat([ours(input_ids=d[None]).logits[0] for d in docs]).square().mean()).backward()
    assert_structure_only(calls)
    assert all(kw["cu_seqlens_q"] is not None for kw in calls[:2])
    for name, p in ours.named_parameters():
        err = (got[name] - p.grad).abs().max().item()
        assert err <= GRAD_TOL * max(p.grad.abs().max().item(), 1e-6), f"{name}: max |diff| {err}"


HOST_READS = ("item", "tolist", "numpy", "cpu", "nonzero", "__bool__", "__int__", "__float__", "__index__")


def forbid_host_reads(monkeypatch):
    """Every way Python reads a tensor's values on the host raises (on CUDA each would synchronise the stream, or
    read what the caller's stream has not yet written)."""
    def refuse(name):
        def read(*args, **kwargs):
            raise AssertionError(f"{name} read a tensor on the host")
        return read

    for name in HOST_READS:
        monkeypatch.setattr(torch.Tensor, name, refuse(f"Tensor.{name}"))
    monkeypatch.setattr(torch, "nonzero", refuse("torch.nonzero"))


def test_packed_batch_reads_nothing_on_the_host(monkeypatch):
    """issue 56 item 5: a padding-free batch from position_ids alone (the documents' positions restarting) reaches
    attnprof as cumulative lengths made on the positions' device and the longest as an int, with no value read on
    the host; the collator's maxima given as tensors are not read either (None: attnprof takes the longest)."""
    from transformers.masking_utils import find_packed_sequence_indices

    apt.register(backend="flash")
    forward = AttentionInterface()["attnprof"]
    module = torch.nn.Module()
    q, k, v = torch.randn(1, 4, 12, 8), torch.randn(1, 2, 12, 8), torch.randn(1, 2, 12, 8)
    position_ids = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 1, 2]])
    packed = _hf_masks.PackedBatch(find_packed_sequence_indices(position_ids))
    cu = torch.tensor([0, 5, 9, 12], dtype=torch.int32)
    seen = []

    def recording(q, k, v, **kwargs):
        seen.append(kwargs)
        return torch.zeros(q.shape[:-1] + v.shape[-1:])

    monkeypatch.setattr(attnprof, "attention", recording)
    with monkeypatch.context() as m:
        forbid_host_reads(m)
        forward(module, q, k, v, packed, position_ids=position_ids)
        forward(module, q, k, v, packed)  # the documents from the mask function's sequence ids alone
        forward(module, q, k, v, None, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=torch.tensor(5),
                max_length_k=torch.tensor(5))
    apt.register()
    for kw in seen[:2]:
        assert kw["cu_seqlens_q"].dtype == torch.int32 and kw["cu_seqlens_q"].tolist() == [0, 5, 9] + [12] * 10
        assert kw["max_seqlen_q"] == 12 and type(kw["max_seqlen_q"]) is int and kw["mask"] == "causal"
    assert seen[2]["cu_seqlens_q"].tolist() == [0, 5, 9, 12] and seen[2]["max_seqlen_q"] is None


def test_gemma2_soft_cap_and_window_match_eager(calls):
    ours, theirs = pair("gemma2", theirs="eager")
    ids, mask = right_padded()  # 12 tokens, a window of 4
    assert_same_step(ours, theirs, ids, mask)
    assert_structure_only(calls)
    masks = {(kw["mask"], kw["window"], kw["softcap"]) for kw in calls}
    assert ("sliding-window", 4, 50.0) in masks and ("causal-bottom-right", None, 50.0) in masks


def test_gemma2_window_unpadded_matches_eager(calls):
    ours, theirs = pair("gemma2", theirs="eager")
    ids = torch.randint(0, 128, (2, 11))
    with torch.no_grad():
        torch.testing.assert_close(ours(input_ids=ids).logits, theirs(input_ids=ids).logits, atol=LOGITS_TOL,
                                   rtol=LOGITS_TOL)
    assert {kw["mask"] for kw in calls} == {"sliding-window", "causal"}


def left_padded_prompts():
    torch.manual_seed(3)
    ids = torch.randint(1, 128, (3, 8))
    mask = torch.ones(3, 8, dtype=torch.long)
    mask[1, :3] = 0
    mask[2, :6] = 0
    ids[mask == 0] = 0
    return ids, mask


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_generate_left_padded_greedy_tokens_equal_sdpa(calls, cache):
    ours, theirs = pair("llama")
    ids, mask = left_padded_prompts()
    args = dict(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    if cache == "static":
        args["cache_implementation"] = "static"
    with torch.no_grad():
        got = ours.generate(**args)
        want = theirs.generate(**args)
    assert torch.equal(got, want)
    assert_structure_only(calls)
    decode = [kw for kw in calls if kw.get("q_rows") is None and kw.get("kv_rows") is not None]
    assert len(decode) == 2 * 5, "each of the 5 decode steps (2 layers) is a 1-query call with kv_rows"
    assert decode[0]["kv_rows"].tolist() == [[0, 9], [3, 9], [6, 9]]
    assert calls[0]["q_rows"].tolist() == [[0, 8], [3, 8], [6, 8]]


@pytest.mark.parametrize("window", [1, 3])
def test_gemma2_decoding_reads_the_mask_by_its_keys_positions(calls, window):
    """A dynamic cache's sliding layer with sliding_window=1 keeps every key (transformers slices its cache with
    [-window + 1:], all of it at 1) while the mask's sizes count one, the query's own: the mask's one column is
    the last key, never the first (a pad). Eager with a cache broadcasts that one column over every key, so the
    reference is eager over the whole sequence without a cache (the same tokens and positions)."""
    from transformers import DynamicCache

    ours, theirs = pair("gemma2", theirs="eager", sliding_window=window)
    ours.eval()
    theirs.eval()
    ids, mask = left_padded_prompts()
    with torch.no_grad():
        cache = DynamicCache(config=ours.config)
        first = ours(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True).logits
        token = first[:, -1].argmax(-1, keepdim=True)
        longer = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        step = ours(input_ids=token, attention_mask=longer, past_key_values=cache, use_cache=True).logits
        want = theirs(input_ids=torch.cat([ids, token], 1), attention_mask=longer).logits[:, -1:]
    torch.testing.assert_close(step, want, atol=LOGITS_TOL, rtol=LOGITS_TOL)
    sliding = [kw for kw in calls if kw["mask"] == "sliding-window" and kw["q_rows"] is None]
    assert len(sliding) == 1  # layer 0 slides; layer 1 is global
    if window == 1:
        assert sliding[0]["kv_rows"].tolist() == [[8, 9]] * 3, "the query's own key, the ninth"


def test_decoding_masks_keep_their_width_on_a_static_cache():
    """Each decoding step's padding on a static cache has the cache's width (a compiled step keeps its shapes),
    its unwritten slots False, and the mask made again from it is the same (Llama builds its mask from the one
    generate() prepared)."""
    from transformers.masking_utils import causal_mask_function

    prompt = torch.tensor([[True] * 6, [False] * 2 + [True] * 4])
    for past in range(6, 9):
        padding = torch.cat([prompt, torch.ones(2, past - 6 + 1, dtype=torch.bool)], 1)  # the tokens so far
        sizes = dict(batch_size=2, q_length=1, kv_length=12, q_offset=torch.tensor(past),
                     mask_function=causal_mask_function)
        got = _hf_masks.attnprof_mask(attention_mask=padding, **sizes)
        assert got.shape == (2, 12)
        assert got.tolist() == [row + [False] * (11 - past) for row in padding.tolist()]
        assert torch.equal(_hf_masks.attnprof_mask(attention_mask=got, **sizes), got)


def test_mask_function_returns_structure():
    from transformers.masking_utils import causal_mask_function, sliding_window_causal_mask_function

    pad = torch.tensor([[True] * 6, [False, False] + [True] * 4])
    assert _hf_masks.attnprof_mask(batch_size=2, q_length=6, kv_length=6, mask_function=causal_mask_function) is None
    got = _hf_masks.attnprof_mask(batch_size=2, q_length=6, kv_length=6, attention_mask=pad,
                                  mask_function=sliding_window_causal_mask_function(3))
    assert torch.equal(got, pad)
    assert _hf_masks.structure_of(sliding_window_causal_mask_function(3)) == (True, 3, None)
    custom = _hf_masks.attnprof_mask(batch_size=2, q_length=6, kv_length=6, mask_function=lambda b, h, q, k: q >= k)
    assert custom is not None and custom.shape == (2, 1, 6, 6)


def test_custom_4d_mask_warns_once_under_auto_and_runs_on_an_explicit_backend_that_takes_it(monkeypatch):
    apt.register()
    forward = AttentionInterface()["attnprof"]
    module = torch.nn.Module()
    module.is_causal = True
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    custom = torch.rand(1, 1, 5, 5) > 0.3
    custom[..., 0] = True
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=custom).transpose(1, 2)
    apt._warned.clear()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out, _ = forward(module, q, k, v, custom)
        forward(module, q, k, v, custom)
    named = [str(w.message) for w in seen if "custom mask" in str(w.message)]
    assert len(named) == 1 and "runs on 'flash', a backend that takes a tensor mask" in named[0], named
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    # flash on the CPU reads any boolean mask: an explicit backend that takes it runs it, with no warning.
    apt.register(backend="flash")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out, _ = AttentionInterface()["attnprof"](module, q, k, v, custom)
    assert not seen
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    # One that cannot (flash on CUDA reads a boolean mask only as key padding) is refused by name, in one line.
    refusal = "flash on CUDA reads a boolean mask only as key padding ([B, 1, 1, Skv]) and this one is not"

    def refusing(*args, **kwargs):
        raise attnprof.Error(refusal)

    monkeypatch.setattr(attnprof, "attention", refusing)
    try:
        with pytest.raises(attnprof.Error, match="^backend 'flash' cannot run this model's 4-D attention mask") as e:
            AttentionInterface()["attnprof"](module, q, k, v, custom)
        assert str(e.value).endswith(refusal)
    finally:
        apt.register()


# ---- Bad input: one line each, nothing computed.

def one_line(e):
    assert "\n" not in str(e.value)


def test_padding_with_holes_is_refused(calls):
    ours = build("llama", "attnprof")
    ids, mask = right_padded()
    mask[0, 4] = 0
    with pytest.raises(attnprof.Error, match="attention_mask row 0 has padding between real tokens") as e:
        ours(input_ids=ids, attention_mask=mask)
    one_line(e)


def test_lengths_beyond_the_tensors_are_refused(calls):
    forward = AttentionInterface()["attnprof"]
    module = torch.nn.Module()
    q, k, v = (torch.randn(2, 2, 6, 8) for _ in range(3))
    with pytest.raises(attnprof.Error, match="attention_mask has 5 columns, fewer than the 6 queries") as e:
        forward(module, q, k, v, torch.ones(2, 5, dtype=torch.bool))
    one_line(e)
    cu = torch.tensor([0, 4, 15], dtype=torch.int32)
    with pytest.raises(attnprof.Error, match="cu_seqlens_q") as e:
        forward(module, q[:1], k[:1], v[:1], None, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=11,
                max_length_k=11)
    one_line(e)


@pytest.mark.parametrize("window", [0, -3])
def test_window_of_zero_or_less_is_refused(calls, window):
    forward = AttentionInterface()["attnprof"]
    module = torch.nn.Module()
    q, k, v = (torch.randn(1, 2, 6, 8) for _ in range(3))
    with pytest.raises(attnprof.Error, match=f"^sliding_window is {window}: a window of zero keys or fewer") as e:
        forward(module, q, k, v, None, sliding_window=window)
    one_line(e)


def test_cumulative_lengths_disagreeing_with_position_ids_are_refused(calls):
    ours = build("llama", "attnprof")
    docs = documents()
    batch = DataCollatorWithFlattening(return_flash_attn_kwargs=True)([{"input_ids": d.tolist()} for d in docs])
    batch.pop("labels")
    batch["cu_seq_lens_q"] = batch["cu_seq_lens_k"] = torch.tensor([0, 6, 9, 12], dtype=torch.int32)
    with pytest.raises(attnprof.Error, match=r"^cu_seq_lens_q \[0, 6, 9, 12\] disagrees with position_ids, whose "
                                             r"documents start at \[0, 5, 9, 12\]") as e:
        ours(**batch, use_cache=False)
    one_line(e)


def test_cumulative_lengths_without_position_ids_name_what_they_disagree_with(calls):
    """cu_seq_lens with no position_ids of the collator: the message names the model's own numbering (positions
    that never restart) or the packed mask transformers made, never position_ids the caller did not pass."""
    ours = build("llama", "attnprof")
    docs = documents()
    ids = torch.cat(docs)[None]
    cu = torch.tensor([0, 6, 9, 12], dtype=torch.int32)
    with pytest.raises(attnprof.Error, match=r"^cu_seq_lens_q \[0, 6, 9, 12\] names 3 documents but position_ids "
                                             r"never restart within a row \(a model numbers each row 0, 1, \.\.\. "
                                             r"when no position_ids are passed\)") as e:
        ours(input_ids=ids, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=6, max_length_k=6, use_cache=False)
    one_line(e)
    forward = AttentionInterface()["attnprof"]
    q, k, v = (torch.randn(1, 2, 12, 8) for _ in range(3))
    packed = _hf_masks.PackedBatch(torch.tensor([[0] * 5 + [1] * 4 + [2] * 3]))
    with pytest.raises(attnprof.Error, match=r"^cu_seq_lens_q \[0, 6, 9, 12\] disagrees with the packed mask "
                                             r"transformers made \(packed_sequence_mask\), whose documents start at "
                                             r"\[0, 5, 9, 12\]") as e:
        forward(torch.nn.Module(), q, k, v, packed, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=6,
                max_length_k=6)
    assert "position_ids, whose" not in str(e.value)
    one_line(e)
