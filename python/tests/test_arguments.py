"""Every argument checked where it is given (issue 49 items 10 to 14, issue 48 item 2): one path for the type of
every number (a bool is not one), the library's one check of each value naming its field, a registration that
checks its arguments when it registers, no call that leaves the process's thread counts changed, and bindings
that take keywords rather than a dozen positionals."""

import os

import numpy as np
import pytest
import torch

import attnprof
from attnprof import _core

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL_TRAIN = os.path.join(HERE, "..", "..", "tests", "fixtures", "models", "cpu_sdpa_train.pt.trace.json.gz")

# A problem small enough that a refusal that fails to come costs little.
TINY = dict(batch=1, heads=1, seq=16, head_dim=16, device="cpu")


def arrays(shape=(1, 2, 16, 32)):
    rng = np.random.default_rng(0)
    return tuple(rng.standard_normal(shape).astype(np.float32) for _ in range(3))


def tensors(shape=(1, 2, 16, 32)):
    torch.manual_seed(0)
    return tuple(torch.randn(shape) for _ in range(3))


def refused(call, argument, *, wrong_type=False, says=None):
    """call() raises one attnprof.Error of one line naming `argument` (and a TypeError too for a wrong type),
    never blaming the arrays or showing nanobind's list of signatures."""
    with pytest.raises(attnprof.Error) as info:
        call()
    text = str(info.value)
    assert "\n" not in text, f"more than one line: {text!r}"
    assert argument in text, f"{argument} is not named: {text!r}"
    assert "DLPack" not in text and "incompatible function arguments" not in text, text
    assert "--" not in text, f"a library message names a flag: {text!r}"
    if wrong_type:
        assert isinstance(info.value, TypeError), f"{type(info.value).__mro__} for a value of the wrong type"
    if says is not None:
        assert says in text, f"{says!r} not in {text!r}"
    return text


# ---- item 10: a bool is not a number, for every numeric argument, on every path

ATTENTION_NUMBERS = {
    "scale": {},
    "softcap": {},
    "window": {"mask": "sliding_window"},
    "threads": {},
}


@pytest.mark.parametrize("argument", list(ATTENTION_NUMBERS))
@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("value", [True, False])
def test_a_bool_is_refused_for_every_numeric_argument_of_attention(argument, kind, value):
    q, k, v = arrays() if kind == "numpy" else tensors()
    kwargs = dict(ATTENTION_NUMBERS[argument], **{argument: value})
    refused(lambda: attnprof.attention(q, k, v, backend="flash", **kwargs), argument, wrong_type=True)


def test_a_bool_is_refused_for_descales_and_packed_maxima():
    q, k, v = (torch.randn(16, 2, 32) for _ in range(3))
    cu = torch.tensor([0, 16], dtype=torch.int32)
    refused(lambda: attnprof.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=True), "max_seqlen_q",
            wrong_type=True)
    refused(lambda: attnprof.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, softcap=True), "softcap",
            wrong_type=True)
    q, k, v = tensors()
    refused(lambda: attnprof.attention(q, k, v, q_descale=True), "q_descale", wrong_type=True)


@pytest.mark.parametrize("argument", ["scale", "softcap", "batch", "window", "kv_seq"])
def test_a_bool_is_refused_for_every_numeric_field_of_a_problem(argument):
    kwargs = dict(TINY, **{argument: True})
    if argument == "window":
        kwargs["mask"] = "sliding_window"
    refused(lambda: attnprof.explain(**kwargs), argument, wrong_type=True)


def test_a_bool_is_refused_for_the_runs_numbers():
    refused(lambda: attnprof.compare(**TINY, trace_dir=None, softcap=True), "softcap", wrong_type=True)
    refused(lambda: attnprof.compare(**dict(TINY, seq=32), dtype="fp8", trace_dir=None, fp8_descale=True),
            "fp8_descale", wrong_type=True)
    refused(lambda: attnprof.profile("flash", **TINY, trace_dir=None, row_limit=True), "row_limit", wrong_type=True)
    refused(lambda: attnprof.analyze(MODEL_TRAIN, top=True), "top", wrong_type=True)
    refused(lambda: attnprof.analyze(MODEL_TRAIN, ceiling_tflops=True), "ceiling_tflops", wrong_type=True)


# ---- the soft cap's and the scale's ranges: one check, in the library, naming the field


@pytest.mark.parametrize("cap", [3.4e38, 1e39, 1e300, 1e-300, 1e-46, float("inf"), float("nan"), -1.0, 0.0])
def test_a_soft_cap_out_of_range_is_refused_by_name(cap):
    q, k, v = arrays()
    refused(lambda: attnprof.attention(q, k, v, backend="flash", softcap=cap), "softcap")
    t = tensors()
    refused(lambda: attnprof.attention(*t, backend="flash", softcap=cap), "softcap")
    refused(lambda: attnprof.explain(**TINY, softcap=cap), "softcap")


def test_soft_caps_at_the_ends_of_the_range_are_taken():
    q, k, v = arrays()
    for cap in (2.0**-60, 2.0**60, 30.0):
        out = attnprof.attention(q, k, v, backend="math", softcap=cap)
        assert np.isfinite(out).all(), cap


@pytest.mark.parametrize("scale", [1e-300, 1e-40, float("inf"), float("nan"), 0.0])
def test_a_scale_a_float_cannot_hold_is_refused_by_name(scale):
    q, k, v = arrays()
    refused(lambda: attnprof.attention(q, k, v, backend="math", scale=scale), "scale")
    refused(lambda: attnprof.explain(**TINY, scale=scale), "scale")


def test_a_number_past_a_double_is_refused_by_name():
    q, k, v = arrays()
    refused(lambda: attnprof.attention(q, k, v, softcap=10**400), "softcap")
    refused(lambda: attnprof.attention(q, k, v, scale=-(10**400)), "scale")


# ---- item 14: names of the wrong type, and numbers past 64 bits, in one line naming the argument


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_a_name_of_the_wrong_type_is_refused_by_name(kind):
    q, k, v = arrays() if kind == "numpy" else tensors()
    for value in (None, 3):
        refused(lambda: attnprof.attention(q, k, v, backend=value), "backend", wrong_type=True)
        refused(lambda: attnprof.attention(q, k, v, layout=value), "layout", wrong_type=True)
    refused(lambda: attnprof.attention(q, k, v, deterministic="yes"), "deterministic", wrong_type=True)
    refused(lambda: attnprof.explain(**TINY, dtype=None), "dtype", wrong_type=True)
    refused(lambda: attnprof.explain(**TINY, pass_=3), "pass_", wrong_type=True)


def test_analyze_checks_top_and_backends_where_they_are_given():
    refused(lambda: attnprof.analyze(MODEL_TRAIN, top=2**70), "top")
    for top in (0, -5, 100001):
        refused(lambda: attnprof.analyze(MODEL_TRAIN, top=top), "top")
        refused(lambda: attnprof.diff(MODEL_TRAIN, MODEL_TRAIN, top=top), "top")
    # item 13: a name no backend has is refused before anything runs, in the library's words (no flag).
    refused(lambda: attnprof.analyze(MODEL_TRAIN, replay=True, device="cpu", backends=["nope"]), "backends",
            says="unknown backend 'nope'")
    refused(lambda: attnprof.analyze(MODEL_TRAIN, replay=True, device="cpu", backends=[3]), "backends",
            wrong_type=True)


def test_analyze_takes_one_backend_name_as_a_string():
    # "flash" was split into f, l, a, s, h, which named no backend, so nothing ran.
    a = attnprof.analyze(MODEL_TRAIN, replay=True, device="cpu", backends="flash")
    for p in a.traces[0].replay.problems:
        assert [r.backend for r in p.runs] == ["flash"], p.to_dict()


# ---- item 11: a registration checks its arguments when it registers


def test_register_checks_its_arguments_when_it_registers(monkeypatch):
    import transformers
    from transformers.masking_utils import AttentionMaskInterface

    import attnprof.integrations.transformers as apt

    # Registrations land in copies, so nothing here changes the process's transformers.
    attention = dict(transformers.AttentionInterface._global_mapping)
    masks = dict(AttentionMaskInterface._global_mapping)
    monkeypatch.setattr(transformers.AttentionInterface, "_global_mapping", attention)
    monkeypatch.setattr(AttentionMaskInterface, "_global_mapping", masks)
    sdpa, sdpa_mask = attention["sdpa"], masks["sdpa"]

    refused(lambda: apt.register(backend="bogus"), "backend", says="unknown backend 'bogus'")
    refused(lambda: apt.register(backend=None), "backend", wrong_type=True)
    refused(lambda: apt.register(threads=-5), "threads")
    refused(lambda: apt.register(threads=True), "threads", wrong_type=True)
    refused(lambda: apt.register(name=""), "name")
    refused(lambda: apt.register(name=None), "name", wrong_type=True)
    for builtin in ("sdpa", "eager", "flash_attention_2"):
        refused(lambda: apt.register(name=builtin), "name", says=builtin)
    assert attention["sdpa"] is sdpa and masks["sdpa"] is sdpa_mask, "a refused registration replaced sdpa"
    assert "attnprof_bogus" not in attention

    # attnprof's own name registers again (a second register() call), and an explicit flag replaces a built-in.
    assert apt.register() == "attnprof"
    assert apt.register(backend="flash") == "attnprof"
    assert apt.register(name="sdpa", replace=True) == "sdpa"
    assert attention["sdpa"] is not sdpa


# ---- item 12: no call leaves the process's thread counts changed


@pytest.fixture
def torch_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    yield 3
    torch.set_num_threads(before)


def test_no_call_leaves_the_thread_count_changed(torch_threads):
    q, k, v = arrays()
    t = tensors()
    mask = torch.ones(16, 16, dtype=torch.bool).tril()
    calls = {
        "numpy": lambda threads: attnprof.attention(q, k, v, backend="flash", threads=threads),
        "torch fast path": lambda threads: attnprof.attention(*t, backend="flash", threads=threads),
        "torch general path": lambda threads: attnprof.attention(*t, backend="math", attn_mask=mask, threads=threads),
        "explain": lambda threads: attnprof.explain(**TINY, threads=threads),
        "profile": lambda threads: attnprof.profile("flash", **TINY, trace_dir=None, schedule=(0, 0, 1, 1),
                                                    unprofiled_calls=0, threads=threads),
    }
    for name, call in calls.items():
        for threads in (1, 0, 2):
            call(threads)
            assert torch.get_num_threads() == torch_threads, f"{name} with threads={threads}"


# ---- issue 48 item 2: the bindings take keywords, not a dozen positionals


def test_the_bindings_take_keywords_after_the_arrays():
    q, k, v = arrays()
    out = np.empty_like(q)
    with pytest.raises(TypeError):
        _core.attention(q, k, v, out, "flash", "causal", None, None, 0, 0, False)
    _core.attention(q, k, v, out, backend="flash", mask="causal", threads=0)
    np.testing.assert_allclose(out, attnprof.attention(q, k, v, backend="flash"), rtol=0, atol=0)
    with pytest.raises(TypeError):
        _core.Problem(None, None, None, 16, None, 16, "fp32", "cpu", "causal", None, None)
