"""A call's plain options in one C++ table (src/bindings/call_options.h, issue 56: an option added touches at most
three files): every binding of attnprof._core takes them as keywords made from it (src/bindings/def_call.h: its
signature names each, so Python reads what each binding takes from the signature as before), Python's table
(attnprof/_options.py's OPTIONS) agrees with it, and the torch extension's fast path reads them by the names and
kinds _core hands it."""

import re

import numpy as np
import pytest

import attnprof
from attnprof import _core, _options

CORE = _core._call_options()  # (name, schema type, default), in the C++ table's order
NAMES = [name for name, _, _ in CORE]


def taken(fn):
    """The table's options a binding takes, in the table's order, from its signature."""
    return [name for name in NAMES if name in _options._keywords(fn)]


def test_the_cpp_table_and_pythons_agree():
    python = {name: (kind, default) for name, kind, default in _options.OPTIONS}
    for name, kind, default in CORE:
        assert name in python, f"{name} is in the C++ table but not in _options.OPTIONS"
        assert python[name][0] == kind, (name, python[name][0], kind)
        # mask "" is a call's default to the library (causal; with attn_mask the tensor alone); the ops name it.
        assert python[name][1] == (default if name != "mask" else "causal"), (name, python[name][1], default)
    # The same order: the ops' schemas take the options positionally in Python's.
    core_names = [name for name, _, _ in CORE]
    assert [n for n in _options.NAMES if n in core_names] == core_names
    # Every option of Python's table that is not a plain one is a keyword some binding's signature names (the
    # tensor options, descales, maxima): none is in neither.
    for name in _options.NAMES:
        if name not in core_names:
            assert any(name in takes for takes in _options._TAKES.values()), name


def test_each_binding_takes_the_tables_options_less_those_it_has_no_use_for():
    # Made from the table (def_call.h): each binding's signature names them, with the table's types and defaults.
    forward = [n for n in NAMES if n != "deterministic"]
    assert taken(_core.attention_train) == taken(_core.attention_backward) == NAMES
    assert taken(_core.attention) == taken(_core.plan) == taken(_core._attention_until) == forward
    assert taken(_core.attention_varlen) == [n for n in forward if n != "bshd"]
    assert taken(_core.attention_varlen_train) == taken(_core.attention_varlen_backward) == \
        [n for n in NAMES if n != "bshd"]
    assert taken(_core.Problem.__init__) == [n for n in NAMES if n not in ("backend", "bshd")]
    text, _, defaults = _core.attention_train.__nb_signature__[0]
    for name, kind, default in CORE:
        shown = {"str": "str", "int?": "int | None", "float?": "float | None", "bool": "bool"}[kind]
        found = re.search(rf"\b{name}: {re.escape(shown)} = \\(\d+)", text)
        assert found, (name, text)
        assert defaults[int(found.group(1))] == default, (name, defaults[int(found.group(1))], default)


def arrays():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 16, 16), dtype=np.float32) for _ in range(3))
    return q, k, v, np.empty_like(q)


def test_a_binding_refuses_an_option_it_does_not_take():
    # As nanobind refuses any keyword its signature does not name, or of another type.
    q, k, v, out = arrays()
    for bad in (dict(deterministic=True), dict(soft_cap=1.0), dict(softcap="1"), dict(bshd=1), dict(mask=None)):
        with pytest.raises(TypeError, match=r"^attention\(\): incompatible function arguments"):
            _core.attention(q, k, v, out, backend="flash", **bad)
    with pytest.raises(TypeError, match=r"incompatible function arguments"):
        _core.Problem(seq=16, head_dim=16, dtype="fp32", device="cpu", mask="causal", backend="flash")
    # Each option taken reaches the call: the same output as attention()'s.
    _core.attention(q, k, v, out, backend="flash", mask="none", scale=0.5, softcap=3.0, window=None, bshd=False)
    np.testing.assert_array_equal(out, attnprof.attention(q, k, v, backend="flash", mask="none", scale=0.5,
                                                          softcap=3.0))


def test_the_call_cache_keys_every_option():
    # Two calls differing in one option each are two entries (the key walks the table), the same call a hit.
    q, k, v, out = arrays()
    _core._clear_cache()
    calls = [dict(), dict(mask="none"), dict(window=4, mask="sliding_window"), dict(scale=0.5), dict(softcap=2.0),
             dict(bshd=True)]
    for kw in calls:
        _core.attention(q, k, v, out, backend="flash", **kw)
    assert _core._cache_stats()["entries"] == len(calls)
    for kw in calls:
        _core.attention(q, k, v, out, backend="flash", **kw)
    stats = _core._cache_stats()
    assert stats["entries"] == len(calls) and stats["hits"] == len(calls), stats
    _core._clear_cache()


def test_the_fast_path_reads_the_options_core_lists():
    torch = pytest.importorskip("torch")
    from attnprof import _torch

    if _torch._fast is None:
        pytest.skip(f"this attnprof was built without its torch extension: calls take {_torch.fast_path}")
    q, k, v = (torch.randn(1, 2, 16, 16) for _ in range(3))
    values = {"backend": "flash", "mask": "none", "window": None, "scale": 0.5, "bshd": False, "softcap": 3.0}
    assert set(taken(_core.attention)) == set(values)  # a new option of attention(): give it here too
    got = _torch._fast(q, k, v, None, 0, None, None, None, None, **values)
    assert got is not None  # taken, not handed to the general path
    want = attnprof.attention(q.numpy(), k.numpy(), v.numpy(), backend="flash", mask="none", scale=0.5, softcap=3.0)
    np.testing.assert_array_equal(got.numpy(), want)
    # Every option by name, each once: one left out (a caller that missed an option added) is refused.
    for name in values:
        with pytest.raises(TypeError, match="every option of attention"):
            _torch._fast(q, k, v, None, 0, None, None, None, None, **{n: x for n, x in values.items() if n != name})
    with pytest.raises(TypeError, match="every option of attention"):
        _torch._fast(q, k, v, None, 0, None, None, None, None, *values.values())


def test_attention_hands_the_fast_path_every_option(monkeypatch):
    # attnprof.attention passes the fast path what it takes (the names _core lists): it takes the call.
    torch = pytest.importorskip("torch")
    from attnprof import _torch

    if _torch._fast is None:
        pytest.skip(f"this attnprof was built without its torch extension: calls take {_torch.fast_path}")
    answers = []
    fast = _torch._fast

    def spy(*args, **kwargs):
        answers.append(fast(*args, **kwargs))
        return answers[-1]

    monkeypatch.setattr(_torch, "_fast", spy)
    q, k, v = (torch.randn(1, 16, 2, 16) for _ in range(3))
    attnprof.attention(q, k, v, backend="flash", mask="sliding_window", window=4, scale=0.5, softcap=3.0,
                       layout="bshd")
    assert len(answers) == 1 and answers[0] is not None
