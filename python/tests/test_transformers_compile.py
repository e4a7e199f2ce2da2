"""The transformers registration under torch.compile (issue 56 item 5, issue 57 item 4).

Tiny random-weight models (test_transformers_structure.py's) compiled with fullgraph=True, so that any graph break
(attnprof's or transformers') fails the test, through a backend that keeps each graph dynamo captured and runs it
as aot_eager does (AOT autograd over attnprof's fake kernels; inductor's code generation takes minutes on a small
CPU and adds nothing to what reaches attnprof). Each graph's attnprof ops are read node by node: a padded batch
reaches attnprof as rows (q_rows/kv_rows, made by the padding_rows op) and never as a mask tensor, the way it does
uncompiled; the results equal transformers' own attention. A mask attnprof cannot read as rows (padding between
real tokens) is refused compiled as uncompiled, in the same words.
"""

import os
import subprocess
import sys

import pytest
import torch

import attnprof
import attnprof.integrations.transformers as apt
from test_transformers_structure import (LOGITS_TOL, assert_same_step, build, left_padded_prompts, pair,
                                         right_padded)


class Captured:
    """A torch.compile backend: keeps each graph, runs it with aot_eager."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    def ops(self, namespace):
        """Every call of an op of `namespace` in the captured graphs, as {argument name: value} (fx nodes for
        tensors computed in the graph)."""
        found = []
        for gm in self.graphs:
            for node in gm.graph.nodes:
                target = node.target
                if node.op != "call_function" or not isinstance(target, (torch._ops.OpOverload,
                                                                         torch._ops.OpOverloadPacket)):
                    continue
                overload = target if isinstance(target, torch._ops.OpOverload) else target.default
                if overload._schema.name.split("::")[0] != namespace:
                    continue
                args = dict(zip((a.name for a in overload._schema.arguments), node.args))
                args.update(node.kwargs)
                args["op"] = overload._schema.name
                found.append(args)
        return found


@pytest.fixture
def flash():
    apt.register(backend="flash")
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    apt.register()


def compiled(model):
    """The model with its forward compiled in place (its parameters keep their names), and the backend."""
    backend = Captured()
    model.forward = torch.compile(model.forward, fullgraph=True, backend=backend)
    return model, backend


def assert_rows_only(backend, layers=2):
    """Every attnprof call in the graphs takes rows and no mask tensor; the rows come from padding_rows."""
    calls = backend.ops("attnprof")
    assert len(calls) >= layers, calls
    for call in calls:
        assert call.get("attn_mask") is None, f"{call['op']} got a mask tensor"
        assert isinstance(call.get("kv_rows"), torch.fx.Node), f"{call['op']} got no kv_rows"
        assert call.get("backend") == "flash"
    assert backend.ops("attnprof_hf"), "the padding's rows are made (and checked) by attnprof_hf::padding_rows"
    return calls


def test_compiled_padded_training_keeps_rows_and_matches_sdpa(flash):
    ours, theirs = pair("llama")
    model, backend = compiled(ours)
    ids, mask = right_padded()
    assert_same_step(model, theirs, ids, mask)
    calls = assert_rows_only(backend)
    assert all(c["mask"] == "causal-bottom-right" and c["q_rows"] is c["kv_rows"] for c in calls)


def test_compiled_gemma2_keeps_window_soft_cap_and_rows(flash):
    ours, theirs = pair("gemma2", theirs="eager")
    ours.eval()
    theirs.eval()
    model, backend = compiled(ours)
    ids, mask = right_padded()
    with torch.no_grad():
        got, want = model(input_ids=ids, attention_mask=mask).logits, theirs(input_ids=ids, attention_mask=mask).logits
    keep = mask.bool()
    torch.testing.assert_close(got[keep], want[keep], atol=LOGITS_TOL, rtol=LOGITS_TOL)
    calls = assert_rows_only(backend)
    assert {(c["mask"], c["window"], c["softcap"]) for c in calls} == {("sliding-window", 4, 50.0),
                                                                       ("causal-bottom-right", None, 50.0)}


def test_padding_with_holes_is_refused_compiled_as_uncompiled(flash):
    ours = build("llama", "attnprof")
    ours.eval()
    ids, mask = right_padded()
    mask[0, 4] = 0
    words = "attention_mask row 0 has padding between real tokens (position 4 is padding, 0 and 11 are real)"
    with torch.no_grad():
        with pytest.raises(attnprof.Error) as eager:
            ours(input_ids=ids, attention_mask=mask)
        model, backend = compiled(build("llama", "attnprof").eval())
        with pytest.raises(attnprof.Error) as traced:
            model(input_ids=ids, attention_mask=mask)
        assert backend.graphs, "the model compiled: the refusal came from the compiled graph, when it ran"
        # The same mask without its hole runs in the same graph.
        mask[0, 4] = 1
        model(input_ids=ids, attention_mask=mask)
    assert str(eager.value).startswith(words) and str(traced.value) == str(eager.value)
    assert len(backend.graphs) == 1


def test_compiled_static_cache_generate_decodes_in_one_graph(flash):
    ours, theirs = pair("llama")
    ours.eval()
    ours, backend = compiled(ours)
    ids, mask = left_padded_prompts()
    args = dict(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0,
                cache_implementation="static")
    with torch.no_grad():
        got = ours.generate(**args)
        want = theirs.generate(**args)
        eager = build("llama", "eager")
        eager.load_state_dict(theirs.state_dict())
        want_eager = eager.generate(**args)
    assert torch.equal(got, want) and torch.equal(got, want_eager)
    # The prefill and one decoding step's graph: the decoding steps' padding keeps its shape (the static cache's
    # length), so no step compiles again (a CUDA graph of it replays every step).
    assert len(backend.graphs) == 2, [gm.graph for gm in backend.graphs]
    calls = assert_rows_only(backend)
    decode = [c for c in calls if c.get("q_rows") is None]
    assert len(decode) == 2, "the decoding step's two layers read one query against each sequence's keys"


@pytest.mark.parametrize("flash_kwargs", [False, True], ids=["position_ids", "cu_seq_lens"])
def test_compiled_packed_batch_equals_each_document_alone(flash, flash_kwargs):
    from transformers import DataCollatorWithFlattening

    from test_transformers_structure import documents

    ours = build("llama", "attnprof")
    ours.eval()
    model, backend = compiled(build("llama", "attnprof").eval())
    docs = documents()
    batch = DataCollatorWithFlattening(return_flash_attn_kwargs=flash_kwargs)([{"input_ids": d.tolist()}
                                                                              for d in docs])
    batch.pop("labels")
    with torch.no_grad():
        packed = model(**batch, use_cache=False).logits[0]
        alone = [ours(input_ids=d[None]).logits[0] for d in docs]
    torch.testing.assert_close(packed, torch.cat(alone), atol=LOGITS_TOL, rtol=LOGITS_TOL)
    calls = backend.ops("attnprof")
    assert len(calls) == 2 and all(isinstance(c["cu_seqlens_q"], torch.fx.Node) for c in calls)
    longest = 5 if flash_kwargs else 12  # the collator's, or a row's length (no document spans two rows)
    assert all(c["max_seqlen_q"] == longest and c["max_seqlen_k"] == longest for c in calls)
    if flash_kwargs:
        # The collator's lengths are checked against position_ids when the graph runs (the CPU reads them).
        checked = backend.ops("attnprof_hf")
        assert [c["name"] for c in checked] == ["cu_seq_lens_q", "cu_seq_lens_k"] * 2, checked


def test_cumulative_lengths_disagreeing_with_position_ids_are_refused_compiled_as_uncompiled(flash):
    from transformers import DataCollatorWithFlattening

    from test_transformers_structure import documents

    batch = DataCollatorWithFlattening(return_flash_attn_kwargs=True)([{"input_ids": d.tolist()}
                                                                      for d in documents()])
    batch.pop("labels")
    batch["cu_seq_lens_q"] = batch["cu_seq_lens_k"] = torch.tensor([0, 6, 9, 12], dtype=torch.int32)
    with torch.no_grad():
        with pytest.raises(attnprof.Error) as eager:
            build("llama", "attnprof").eval()(**batch, use_cache=False)
        model, backend = compiled(build("llama", "attnprof").eval())
        with pytest.raises(attnprof.Error) as traced:
            model(**batch, use_cache=False)
    assert backend.graphs and str(traced.value) == str(eager.value)
    assert str(eager.value).startswith("cu_seq_lens_q [0, 6, 9, 12] disagrees with position_ids")


_FIRST_CALL_COMPILED = r"""
import attnprof  # before torch, as isort orders the two
import attnprof.integrations.transformers as apt
import torch
import transformers

torch._dynamo.config.error_on_recompile = True  # a second compile of one graph fails the child
q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
for call in (lambda q, k, v: attnprof.attention(q, k, v, mask="none"),
             lambda q, k, v: attnprof.scaled_dot_product_attention(q, k, v)):
    f = torch.compile(call, fullgraph=True, backend="eager")
    with torch.no_grad():
        assert torch.equal(f(q, k, v), f(q, k, v))
torch.manual_seed(0)
cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                               num_key_value_heads=2, vocab_size=64)
model = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation=apt.register(), dtype=torch.float32)
ids = torch.randint(1, 64, (2, 9))
pad = torch.ones(2, 9, dtype=torch.long)
pad[0, :3] = 0
f = torch.compile(model.eval(), fullgraph=True, backend="eager")
with torch.no_grad():
    assert torch.equal(f(ids, attention_mask=pad).logits, f(ids, attention_mask=pad).logits)
print("one graph each")
"""


def test_a_first_call_made_compiled_is_compiled_once():
    """attnprof's lazily set state (the torch front, the drop-ins' front) is set before a trace reads it: a fresh
    process whose first attnprof call is traced by torch.compile compiles each graph once (it compiled the first
    graph twice, guarded on that state being unset), attnprof imported before torch."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", _FIRST_CALL_COMPILED], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("one graph each"), r.stderr[-3000:]
