"""attnprof.plan on the CPU: made once, run many times on fresh arrays, writing what attention() writes;
runs resolve no backend (auto keeps its pick); arrays of another shape or dtype, index arrays the plan was
not made with (or without), other lengths on a packed plan and a released plan are refused in one line."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import attnprof  # noqa: E402
from attnprof import _core  # noqa: E402


@pytest.fixture(autouse=True, params=["fast", "dlpack"])
def run_path(request):
    """Every test on both of Plan.run's ways in: attnprof._torch_call's (the tensors read as at::Tensor) and the
    DLPack path, which must answer alike, refusals word for word."""
    from attnprof import _torch

    if request.param == "fast" and _torch._fast_plan_run_loaded is None:
        pytest.skip(f"this attnprof was built without attnprof._torch_call: {_torch.fast_path}")
    _torch._use_fast(request.param == "fast")
    yield request.param
    _torch._use_fast(True)


def qkv(shape=(2, 4, 64, 32), kv_shape=(2, 2, 64, 32), dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(s, dtype=dtype, generator=g) for s in (shape, kv_shape, kv_shape))


def one_line(excinfo):
    text = str(excinfo.value)
    assert "\n" not in text, text
    return text


def test_plan_runs_many_times_as_attention_does():
    plan = attnprof.plan(*qkv(), backend="flash", threads=1)
    assert plan.backend == "flash" and plan.layout == "dense"
    for seed in range(1, 4):
        q, k, v = qkv(seed=seed)
        out = torch.full_like(q, float("nan"))
        assert plan.run(q, k, v, out) is out
        assert torch.equal(out, attnprof.attention(q, k, v, backend="flash", threads=1))
        assert torch.equal(plan.run(q, k, v), out)  # out allocated by the run


def test_plan_on_numpy_arrays_and_bshd_views():
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 32, 4, 16), dtype=np.float32) for _ in range(3))
    plan = attnprof.plan(q, k, v, backend="math", mask="none", layout="bshd", threads=1)
    for _ in range(2):
        q, k, v = (rng.standard_normal((1, 32, 4, 16), dtype=np.float32) for _ in range(3))
        got = plan.run(q, k, v)
        assert isinstance(got, np.ndarray) and got.shape == q.shape
        np.testing.assert_array_equal(got, attnprof.attention(q, k, v, backend="math", mask="none",
                                                               layout="bshd", threads=1))


def test_auto_keeps_its_backend_and_runs_resolve_nothing():
    q, k, v = qkv()
    plan = attnprof.plan(q, k, v, mask="none", threads=1)
    picked = plan.backend
    assert "picked by auto" in plan.explain()
    before = _core._backend_resolutions()
    for seed in range(1, 5):
        q, k, v = qkv(seed=seed)
        plan.run(q, k, v)
    assert _core._backend_resolutions() == before
    assert plan.backend == picked


def test_attention_is_a_front_over_a_cached_plan_of_the_same_pick():
    # attention() plans its call on the first sight of its layout (the call cache) and runs that plan after:
    # the same backend auto picks for attnprof.plan, the same bytes, no resolution on the repeated calls.
    _core._clear_cache()
    q, k, v = qkv()
    explicit = attnprof.plan(q, k, v, mask="none", threads=1)
    first = attnprof.attention(q, k, v, mask="none", threads=1)
    stats = _core._cache_stats()
    assert (stats["plans"], stats["misses"]) == (1, 1), stats
    before = _core._backend_resolutions()
    for seed in range(1, 4):
        q, k, v = qkv(seed=seed)
        assert torch.equal(attnprof.attention(q, k, v, mask="none", threads=1), explicit.run(q, k, v))
    assert _core._backend_resolutions() == before
    assert _core._cache_stats()["hits"] == 3
    assert torch.equal(first, explicit.run(*qkv()))


def test_runs_refuse_arrays_unlike_the_plans_in_one_line():
    q, k, v = qkv()
    plan = attnprof.plan(q, k, v, backend="flash", threads=1)
    with pytest.raises(attnprof.Error) as e:
        plan.run(*qkv(shape=(2, 4, 32, 32), kv_shape=(2, 2, 32, 32)))
    assert one_line(e) == "q is float32[2, 4, 32, 32] on cpu but the plan was made for float32[2, 4, 64, 32] on cpu"
    with pytest.raises(attnprof.Error) as e:
        plan.run(q, k.half(), v)
    assert "k is float16[2, 2, 64, 32] on cpu but the plan was made for float32[2, 2, 64, 32] on cpu" in one_line(e)
    with pytest.raises(attnprof.Error) as e:
        plan.run(q, k, v, torch.empty(2, 4, 64, 16))
    assert one_line(e).startswith("out is float32[2, 4, 64, 16]")
    with pytest.raises(attnprof.Error) as e:
        plan.run(q, k, v, kv_rows=torch.tensor([[0, 64], [0, 64]], dtype=torch.int32))
    assert "kv_rows given, but the plan's layout (dense) takes none" in one_line(e)
    plan.release()
    with pytest.raises(attnprof.Error) as e:
        plan.run(q, k, v)
    assert "this plan holds nothing" in one_line(e)
    with pytest.raises(attnprof.Error) as e:
        plan.explain()
    assert "this plan holds nothing" in one_line(e)


def test_plan_refuses_what_attention_refuses_in_its_words():
    q, k, v = qkv()
    with pytest.raises(attnprof.Error) as plan_e:
        attnprof.plan(q, k, v, backend="efficient", threads=1)
    with pytest.raises(attnprof.Error) as call_e:
        attnprof.attention(q, k, v, backend="efficient", threads=1)
    assert str(plan_e.value) == str(call_e.value)
    with pytest.raises(attnprof.Error) as e:
        attnprof.plan(q, k, v, backend="math", kv_rows=torch.tensor([[0, 64], [0, 40]], dtype=torch.int32))
    assert "math" in one_line(e)
    q.requires_grad_(True)
    with pytest.raises(attnprof.Error, match="inference only"):
        attnprof.plan(q, k, v, backend="flash")


def paged_case(batch=3, hkv=2, group=2, page=16, pages_per_seq=4, d=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    num_pages = batch * pages_per_seq + 3
    q = torch.randn(batch, hkv * group, 1, d, generator=g)
    k_cache = torch.randn(num_pages, hkv, page, d, generator=g)
    v_cache = torch.randn(num_pages, hkv, page, d, generator=g)
    table = torch.randperm(num_pages, generator=g)[: batch * pages_per_seq].view(batch, pages_per_seq)
    return q, k_cache, v_cache, table.to(torch.int32).contiguous()


def test_paged_plan_follows_tables_and_lengths_rewritten_in_place():
    q, k_cache, v_cache, table = paged_case()
    seq_lens = torch.tensor([64, 10, 33], dtype=torch.int32)
    plan = attnprof.plan(q, k_cache, v_cache, backend="flash", mask="causal_bottom_right", block_table=table,
                         seq_lens=seq_lens, threads=1)
    assert plan.layout == "paged" and "layout paged" in plan.explain()
    out = torch.empty_like(q)
    for step, lens in enumerate(([64, 10, 33], [1, 64, 17], [40, 40, 40])):
        seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        table.copy_(table.roll(step, dims=1))
        q.copy_(torch.randn_like(q))
        plan.run(q, k_cache, v_cache, out, block_table=table, seq_lens=seq_lens)
        want = attnprof.attention(q, k_cache, v_cache, backend="flash", mask="causal_bottom_right",
                                  block_table=table, seq_lens=seq_lens, threads=1)
        assert torch.equal(out, want), lens
    with pytest.raises(attnprof.Error) as e:
        plan.run(q, k_cache, v_cache, out, block_table=table)
    assert "seq_lens is missing: the plan was made for the paged layout" in one_line(e)
    with pytest.raises(attnprof.Error) as e:
        plan.run(q, k_cache[:, :, :8], v_cache[:, :, :8], out, block_table=table, seq_lens=seq_lens)
    assert one_line(e).startswith("k_cache is float32[15, 2, 8, 32] on cpu but the plan was made for")


def test_padded_plan_runs_as_attention_with_rows():
    q, k, v = qkv()
    kv_rows = torch.tensor([[0, 40], [9, 64]], dtype=torch.int32)
    plan = attnprof.plan(q, k, v, backend="flash", mask="causal_bottom_right", kv_rows=kv_rows, threads=1)
    assert plan.layout == "padded"
    for rows in ([[0, 40], [9, 64]], [[0, 64], [0, 1]]):
        kv_rows.copy_(torch.tensor(rows, dtype=torch.int32))
        got = plan.run(q, k, v, kv_rows=kv_rows)
        want = attnprof.attention(q, k, v, backend="flash", mask="causal_bottom_right", kv_rows=kv_rows, threads=1)
        assert torch.equal(got, want), rows


def test_packed_plan_runs_its_lengths_and_refuses_others():
    lens_q, lens_k = [20, 48, 7], [48, 12, 30]
    cu_q = torch.tensor(np.concatenate([[0], np.cumsum(lens_q)]), dtype=torch.int32)
    cu_k = torch.tensor(np.concatenate([[0], np.cumsum(lens_k)]), dtype=torch.int32)
    q = torch.randn(sum(lens_q), 4, 32)
    k, v = torch.randn(sum(lens_k), 2, 32), torch.randn(sum(lens_k), 2, 32)
    plan = attnprof.plan(q, k, v, backend="flash", cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, threads=1)
    assert plan.layout == "packed"
    for _ in range(2):
        q, k, v = torch.randn_like(q), torch.randn_like(k), torch.randn_like(v)
        got = plan.run(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
        want = attnprof.attention(q, k, v, backend="flash", cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, threads=1)
        assert torch.equal(got, want)
    other = cu_q.clone()
    other[1] = 21
    with pytest.raises(attnprof.Error) as e:
        plan.run(q, k, v, cu_seqlens_q=other, cu_seqlens_k=cu_k)
    assert one_line(e).startswith("cu_seqlens_q[1] is 21 but the plan was made for 20")
    with pytest.raises(attnprof.Error) as e:
        plan.run(q, k, v)
    assert "cu_seqlens_q is missing" in one_line(e)


def test_runs_take_the_torch_extensions_path(run_path, monkeypatch):
    """Plan.run on plain tensors goes through attnprof._torch_call.plan_run (not the DLPack exports), index arrays
    included; a tensor that needs autograd is left to the Python path, which refuses it as attnprof.plan does
    (under torch.no_grad it runs)."""
    from attnprof import _torch

    if run_path != "fast":
        pytest.skip("the fast path's own test (run on the fast parameter)")
    answers = []
    real = _torch._fast_plan_run

    def spy(*args):
        answers.append(real(*args))
        return answers[-1]

    monkeypatch.setattr(_torch, "_fast_plan_run", spy)
    q, k, v = qkv()
    plan = attnprof.plan(q, k, v, backend="flash", threads=1)
    out = torch.empty_like(q)
    assert plan.run(q, k, v, out) is out and answers[-1] is out
    rows = torch.tensor([[0, 40], [0, 64]], dtype=torch.int32)
    padded = attnprof.plan(q, k, v, backend="flash", threads=1, kv_rows=rows)
    got = padded.run(q, k, v, kv_rows=rows)
    assert answers[-1] is got
    assert torch.equal(got, attnprof.attention(q, k, v, backend="flash", threads=1, kv_rows=rows))
    with pytest.raises(attnprof.Error) as e:
        plan.run(q.clone().requires_grad_(), k, v)
    assert answers[-1] is None  # left to the Python path, which refuses it as attnprof.plan does
    assert "plan.run runs inference only" in one_line(e)
    with torch.no_grad():
        assert plan.run(q.clone().requires_grad_(), k, v) is answers[-1]


def test_runs_name_each_wrong_array_in_its_own_terms():
    """Issue 57 item 9 on the plan's path: rows of the wrong rank are described as rows (not as a block table),
    a tensor on the meta device as holding no data (not in DLPack's words), and a numpy array handed to a plan made
    on torch tensors as not an array it reads, each in one line, on both ways in."""
    q, k, v = qkv()
    rows = torch.tensor([[0, 40], [0, 64]], dtype=torch.int32)
    padded = attnprof.plan(q, k, v, backend="flash", threads=1, kv_rows=rows)
    with pytest.raises(attnprof.Error) as e:
        padded.run(q, k, v, kv_rows=torch.tensor([0, 40, 0, 64], dtype=torch.int32))
    text = one_line(e)
    assert text.startswith("kv_rows must be int32 [B, 2] = [2, 2], each sequence's (begin, end) rows"), text
    assert "pages_per_seq" not in text
    ends = torch.tensor([[40], [64]], dtype=torch.int32)  # key ends alone, as attention() takes them
    assert torch.equal(padded.run(q, k, v, kv_rows=ends), padded.run(q, k, v, kv_rows=rows))
    plan = attnprof.plan(q, k, v, backend="flash", threads=1)
    with pytest.raises(attnprof.Error) as e:
        plan.run(q.to("meta"), k, v)
    assert one_line(e).startswith("q is on the meta device, which holds no data")
    with pytest.raises(attnprof.Error) as e:
        plan.run(q.numpy(), k, v)
    assert one_line(e).startswith("this plan was made for torch tensors, and q is ndarray: pass torch tensors")
    with pytest.raises(attnprof.Error) as e:
        plan.run(q, k, v, out=q.numpy())
    assert one_line(e).startswith("this plan was made for torch tensors, and out is ndarray")


def test_runs_refuse_negated_views_and_an_out_that_needs_grad():
    """A lazily negated view (torch's negative bit) exports its memory without the sign: refused by name, never
    read as the opposite values. An out= that requires grad would get no gradient: refused, as torch's out= is."""
    q, k, v = qkv()
    plan = attnprof.plan(q, k, v, backend="flash", threads=1)
    negated = torch._neg_view(q)
    assert negated.is_neg()
    with pytest.raises(attnprof.Error) as e:
        plan.run(negated, k, v)
    assert one_line(e).startswith("q is a lazily negated view (torch's negative bit")
    assert one_line(e).endswith("pass q.resolve_neg()")
    assert torch.equal(plan.run(negated.resolve_neg(), k, v), plan.run(-q, k, v))
    with pytest.raises(attnprof.Error) as e:
        plan.run(q, k, v, out=torch.empty_like(q).requires_grad_())
    assert "q, k, v and out must not require grad" in one_line(e)
    with torch.no_grad():
        out = torch.empty_like(q).requires_grad_()
        assert plan.run(q, k, v, out=out) is out and torch.equal(out, plan.run(q, k, v))


def test_paged_runs_name_seq_lens_and_the_tables_shape_as_given():
    q, k_cache, v_cache, table = paged_case()
    seq_lens = torch.tensor([64, 10, 33], dtype=torch.int32)
    plan = attnprof.plan(q, k_cache, v_cache, backend="flash", mask="causal_bottom_right", block_table=table,
                         seq_lens=seq_lens, threads=1)
    for bad, entry in (([64, -1, 33], "seq_lens[1] = -1"), ([65, 10, 33], "seq_lens[0] = 65")):
        with pytest.raises(attnprof.Error) as e:
            plan.run(q, k_cache, v_cache, block_table=table, seq_lens=torch.tensor(bad, dtype=torch.int32))
        assert one_line(e) == entry + " is outside 0 .. 64 (the block table's 4 pages of 16 keys)"
    with pytest.raises(attnprof.Error) as e:
        plan.run(q, k_cache, v_cache, block_table=table[:, :3].contiguous(), seq_lens=seq_lens)
    assert one_line(e) == "block_table is int32[3, 3] on cpu but the plan was made for int32[3, 4] on cpu"
    with pytest.raises(attnprof.Error) as e:
        plan.run(q, k_cache, v_cache, block_table=table, seq_lens=seq_lens[:2])
    assert one_line(e) == "seq_lens is int32[2] on cpu but the plan was made for int32[3] on cpu"
