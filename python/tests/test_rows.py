"""Per-sequence rows through attention(): q_rows/kv_rows, and mask= with a key-padding attn_mask lowered to them,
against each sequence run alone (SDPA on its own rows) and padded with zeros; gradients too."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attnprof
from attnprof import Error


def alone(q, k, v, q_rows, kv_rows, causal):
    """Each sequence on its own rows by SDPA (top-left causal of its own rows), zeros elsewhere."""
    out = torch.zeros_like(q)
    for b in range(q.shape[0]):
        q0, q1 = (0, q.shape[2]) if q_rows is None else q_rows[b].tolist()
        k0, k1 = kv_rows[b].tolist()
        if q1 > q0 and k1 > k0:
            out[b, :, q0:q1] = F.scaled_dot_product_attention(q[b:b + 1, :, q0:q1], k[b:b + 1, :, k0:k1],
                                                              v[b:b + 1, :, k0:k1], is_causal=causal,
                                                              enable_gqa=True)[0]
    return out


def key_padding(lens, pads, kv_seq):
    keys = torch.arange(kv_seq)
    return torch.stack([(keys >= p) & (keys < p + n) for n, p in zip(lens, pads)])


@pytest.mark.parametrize("pads", [[0, 0, 0], [0, 5, 30], [2, 0, 11]], ids=["right", "left", "both"])
def test_causal_with_a_key_padding_mask_is_each_sequence_alone(pads):
    torch.manual_seed(0)
    S, lens = 40, [40, 30, 7]
    q = torch.randn(3, 4, S, 32, requires_grad=True)
    k = torch.randn(3, 2, S, 32, requires_grad=True)
    v = torch.randn(3, 2, S, 32, requires_grad=True)
    kp = key_padding(lens, pads, S)
    out = attnprof.attention(q, k, v, mask="causal", attn_mask=kp, backend="auto")
    rows = torch.tensor([[p, p + n] for n, p in zip(lens, pads)], dtype=torch.int32)
    want = alone(q, k, v, rows, rows, causal=True)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), g)
    ref = torch.autograd.grad(want, (q, k, v), g)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_decode_kv_rows_are_each_sequence_alone():
    torch.manual_seed(1)
    q, k, v = torch.randn(3, 4, 1, 32), torch.randn(3, 4, 50, 32), torch.randn(3, 4, 50, 32)
    kv_rows = torch.tensor([[0, 50], [20, 50], [49, 50]], dtype=torch.int32)
    out = attnprof.attention(q, k, v, mask="causal-bottom-right", kv_rows=kv_rows)
    torch.testing.assert_close(out, alone(q, k, v, None, kv_rows, causal=False), atol=1e-5, rtol=1e-5)


def test_bad_rows_are_refused_in_one_line():
    q, k, v = torch.randn(2, 2, 8, 32), torch.randn(2, 2, 8, 32), torch.randn(2, 2, 8, 32)
    cases = [
        (dict(kv_rows=torch.tensor([[0, 8], [5, 9000]], dtype=torch.int32)), "kv_rows[1] = (5, 9000) is outside 0 .. 8"),
        (dict(q_rows=torch.tensor([[0, 8], [6, 2]], dtype=torch.int32)), "q_rows[1] = (6, 2) begins after it ends"),
        (dict(q_rows=torch.tensor([[0, 8], [0, 8]], dtype=torch.int64)), "q_rows must be int32"),
        (dict(q_rows=torch.tensor([[0, 8, 1], [0, 8, 1]], dtype=torch.int32)), "q_rows must be int32 [B, 2]"),
        (dict(mask="causal", attn_mask=torch.tensor([[1, 0, 1, 1, 1, 1, 1, 1], [1] * 8], dtype=torch.bool)),
         "attn_mask row 0 is not one run of Trues"),
        (dict(kv_rows=torch.tensor([[0, 8], [0, 8]], dtype=torch.int32), attn_mask=torch.ones(2, 1, 1, 8,
                                                                                                 dtype=torch.bool)),
         "kv_rows with attn_mask"),
    ]
    for kwargs, want in cases:
        kwargs.setdefault("mask", None)
        with pytest.raises(Error) as e:
            attnprof.attention(q, k, v, backend="flash", **kwargs)
        assert want in str(e.value) and "\n" not in str(e.value), str(e.value)
    cu = torch.tensor([0, 8, 16], dtype=torch.int32)
    with pytest.raises(Error, match="kv_rows with a packed batch"):
        attnprof.attention(torch.randn(16, 2, 32), torch.randn(16, 2, 32), torch.randn(16, 2, 32), cu_seqlens_q=cu,
                           cu_seqlens_k=cu, max_seqlen_q=8, max_seqlen_k=8,
                           kv_rows=torch.tensor([[0, 8], [0, 8]], dtype=torch.int32))


# ---- issue 57 item 3: a tensor the backward reads, rewritten after the forward ----

@pytest.mark.parametrize("which", ["q_rows", "kv_rows", "float attn_mask"])
def test_a_tensor_rewritten_between_forward_and_backward_is_refused(which):
    """The rows and a float mask are saved with their version counters, as PyTorch's own ops save what their
    backward reads: rewritten in place after the forward, backward() refuses rather than reading other values."""
    torch.manual_seed(2)
    q, k, v = (torch.randn(2, 2, 8, 16, requires_grad=True) for _ in range(3))
    rows = torch.tensor([[0, 8], [0, 5]], dtype=torch.int32)
    if which == "float attn_mask":
        bias = torch.zeros(2, 1, 8, 8)
        out = attnprof.attention(q, k, v, backend="flash", attn_mask=bias)
        bias[..., 1:] = -1e9  # another mask than the forward's
    else:
        out = attnprof.attention(q, k, v, backend="flash", mask="none", **{which: rows})
        rows[1, 1] = 3  # other rows than the forward's
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_tensors_left_alone_after_the_forward_still_give_their_gradients():
    torch.manual_seed(3)
    q, k, v = (torch.randn(2, 2, 8, 16, requires_grad=True) for _ in range(3))
    rows = torch.tensor([[0, 8], [0, 5]], dtype=torch.int32)
    bias = torch.randn(2, 1, 8, 8)
    for kwargs in (dict(mask="none", kv_rows=rows, q_rows=rows), dict(attn_mask=bias)):
        g = torch.autograd.grad(attnprof.attention(q, k, v, backend="flash", **kwargs).sum(), (q, k, v))
        want = alone(q, k, v, rows, rows, causal=False) if "kv_rows" in kwargs else \
            F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        for got, ref in zip(g, torch.autograd.grad(want.sum(), (q, k, v))):
            torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


# ---- issue 57 item 8: rows in every shape the documentation and the core take ----

@pytest.mark.parametrize("form", ["[B, 1] key ends", "[1, 1, B, 1] key ends", "[1, 1, B, 2] pairs"])
def test_kv_rows_as_key_ends_and_in_the_cores_shape_are_taken(form):
    torch.manual_seed(4)
    q, k, v = torch.randn(3, 4, 1, 32), torch.randn(3, 2, 20, 32), torch.randn(3, 2, 20, 32)
    ends = torch.tensor([20, 7, 1], dtype=torch.int32)
    pairs = torch.stack((torch.zeros_like(ends), ends), 1)
    given = {"[B, 1] key ends": ends[:, None], "[1, 1, B, 1] key ends": ends.view(1, 1, 3, 1),
             "[1, 1, B, 2] pairs": pairs.view(1, 1, 3, 2)}[form]
    want = attnprof.attention(q, k, v, backend="flash", mask="causal-bottom-right", kv_rows=pairs)
    got = attnprof.attention(q, k, v, backend="flash", mask="causal-bottom-right", kv_rows=given)
    assert torch.equal(got, want)
    torch.testing.assert_close(got, alone(q, k, v, None, pairs, causal=False), atol=1e-5, rtol=1e-5)


def test_q_rows_in_the_cores_shape_are_taken_and_key_ends_only_for_keys():
    torch.manual_seed(5)
    q, k, v = (torch.randn(2, 2, 8, 16) for _ in range(3))
    rows = torch.tensor([[0, 8], [2, 6]], dtype=torch.int32)
    want = attnprof.attention(q, k, v, backend="flash", mask="causal", q_rows=rows, kv_rows=rows)
    got = attnprof.attention(q, k, v, backend="flash", mask="causal", q_rows=rows.view(1, 1, 2, 2), kv_rows=rows)
    assert torch.equal(got, want)
    with pytest.raises(Error, match=r"^q_rows must be int32 \[B, 2\] = \[2, 2\].*got \[2, 1\]$"):
        attnprof.attention(q, k, v, backend="flash", q_rows=rows[:, 1:])


def test_numpy_key_padding_beside_a_mask_name_is_lowered_as_torch_tensors_are():
    torch.manual_seed(6)
    q, k, v = (torch.randn(3, 2, 12, 16) for _ in range(3))
    kp = key_padding([12, 9, 4], [0, 3, 0], 12)
    for mask in ("causal", "none"):
        want = attnprof.attention(q, k, v, backend="flash", mask=mask, attn_mask=kp)
        for m in (kp.numpy(), kp[:, None, None, :].numpy()):
            got = attnprof.attention(q.numpy(), k.numpy(), v.numpy(), backend="flash", mask=mask, attn_mask=m)
            np.testing.assert_array_equal(got, want.numpy())
    holed = kp.numpy().copy()
    holed[0, 5] = False
    with pytest.raises(Error, match=r"^attn_mask row 0 is not one run of Trues \(a key-padding mask with mask= is "):
        attnprof.attention(q.numpy(), k.numpy(), v.numpy(), backend="flash", mask="causal", attn_mask=holed)


# ---- issue 56: a key-padding attn_mask with no mask name, as SDPA is called ----

@pytest.mark.parametrize("kv_seq", [12, 20])
def test_key_padding_without_a_mask_name_is_lowered_to_key_rows_and_is_sdpas_answer(kv_seq):
    """flash takes SDPA's call with key padding as mask "none" plus kv_rows alone (flash on CUDA reads no mask
    tensor): every query row, a padded one too, attends its sequence's valid keys, and a sequence with none is
    zeros, as SDPA gives them; forward and gradients."""
    from attnprof import _key_padding

    torch.manual_seed(7)
    q = torch.randn(3, 4, 12, 16, requires_grad=True)
    k, v = (torch.randn(3, 2, kv_seq, 16, requires_grad=True) for _ in range(2))
    pad = key_padding([kv_seq, 5, 0], [0, 2, 0], kv_seq)[:, None, None, :]
    mask, attn_mask, q_rows, kv_rows = _key_padding.lower(q, k, pad, "", False, "flash", None, None)
    assert (mask, attn_mask, q_rows) == ("none", None, None)
    assert kv_rows.tolist() == [[0, kv_seq], [2, 7], [0, 0]]
    out = attnprof.attention(q, k, v, backend="flash", attn_mask=pad)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=pad, enable_gqa=True)
    assert torch.equal(want[2], torch.zeros_like(want[2]))  # SDPA's fully masked rows
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    g = torch.randn_like(out)
    for got, ref in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(want, (q, k, v), g)):
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


def test_a_holed_boolean_mask_without_a_mask_name_stays_the_whole_mask_on_the_cpu():
    from attnprof import _key_padding

    torch.manual_seed(8)
    q, k, v = (torch.randn(2, 2, 8, 16) for _ in range(3))
    pad = key_padding([8, 6], [0, 0], 8)
    pad[0, 3] = False
    pad = pad[:, None, None, :]
    assert _key_padding.lower(q, k, pad, "", False, "flash", None, None)[1] is pad  # not lowered
    for backend in ("flash", "naive"):
        out = attnprof.attention(q, k, v, backend=backend, attn_mask=pad)
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=pad), atol=1e-5, rtol=1e-5)
    # Other backends take the tensor as it is; so does a 2-D mask, which SDPA reads as [S, Skv].
    assert _key_padding.lower(q, k, pad, "", False, "naive", None, None)[1] is pad
    square = torch.ones(8, 8, dtype=torch.bool).tril()
    assert _key_padding.lower(q, k, square, "", False, "flash", None, None)[1] is square


# ---- issue 56: the checking mode's environment variable, read once, as the core reads it ----

@pytest.mark.parametrize("value,on", [(None, False), ("", False), ("0", False), ("1", True), ("2", True),
                                      ("yes", True)])
def test_the_checking_mode_is_the_cores_reading_everywhere_in_python(value, on):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "ATTNPROF_CHECK_INPUTS"}
    if value is not None:
        env["ATTNPROF_CHECK_INPUTS"] = value
    code = ("import attnprof\nfrom attnprof import _core, _key_padding\n"
            "from attnprof.integrations import _hf_masks\n"
            "print(_core.checking_inputs(), _key_padding.checking_inputs(), _hf_masks.checking())\n"
            "previous = _core._exchange_checking_inputs(1 - int(_core.checking_inputs()))\n"
            "print(_core.checking_inputs(), _key_padding.checking_inputs(), _hf_masks.checking())\n")
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert got.split("\n")[:2] == [f"{on} {on} {on}", f"{not on} {not on} {not on}"], got


def test_no_python_file_reads_the_checking_modes_variable_itself():
    import pathlib

    package = pathlib.Path(attnprof.__file__).parent
    readers = [str(p.relative_to(package)) for p in package.rglob("*.py")
               if "environ" in p.read_text() and "ATTNPROF_CHECK_INPUTS\"" in p.read_text()]
    assert readers == [], f"read the mode through attnprof._key_padding.checking_inputs(), not os.environ: {readers}"


def test_key_padding_without_a_mask_name_compiles_whole():
    """torch.compile traces SDPA's call with key padding in one graph: the checking mode is read as a constant of
    the trace, and on the CPU the tensor goes to flash, which reads it (no value check in the graph)."""
    torch.manual_seed(9)
    q, k, v = (torch.randn(2, 2, 8, 16) for _ in range(3))
    pad = key_padding([8, 5], [0, 1], 8)[:, None, None, :]
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v, m: attnprof.attention(q, k, v, backend="flash", attn_mask=m),
                             fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v, pad), F.scaled_dot_product_attention(q, k, v, attn_mask=pad),
                               atol=1e-5, rtol=1e-5)
