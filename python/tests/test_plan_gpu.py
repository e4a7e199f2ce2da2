"""The serving contract on a GPU: a paged decode's (and a packed batch's) plan.run captured in a CUDA graph
(torch.cuda.graph) and replayed after its block table, lengths and queries are rewritten in place gives what the
eager call gives (attnprof.attention, and SDPA over each sequence's own pages in float64); a planned run allocates
nothing and reads nothing on the host; a run on another device is refused in one line. Skipped, with the reason,
without a GPU."""

import pytest

torch = pytest.importorskip("torch")

import attnprof  # noqa: E402
from attnprof import _core  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine (run on the GPU machine)"),
    pytest.mark.skipif(not attnprof.cuda_built(), reason="this attnprof build has no CUDA backends"),
]

BATCH, HKV, GROUP, PAGE, PAGES_PER_SEQ, D = 4, 2, 4, 16, 8, 128


def decode_case(seed=0):
    g = torch.Generator().manual_seed(seed)
    num_pages = BATCH * PAGES_PER_SEQ + 5
    q = torch.randn(BATCH, HKV * GROUP, 1, D, generator=g).to("cuda", torch.bfloat16)
    k_cache = torch.randn(num_pages, HKV, PAGE, D, generator=g).to("cuda", torch.bfloat16)
    v_cache = torch.randn(num_pages, HKV, PAGE, D, generator=g).to("cuda", torch.bfloat16)
    table = torch.randperm(num_pages, generator=g)[: BATCH * PAGES_PER_SEQ].view(BATCH, PAGES_PER_SEQ)
    return q, k_cache, v_cache, table.to("cuda", torch.int32).contiguous()


def reference(q, k_cache, v_cache, table, lens):
    """Each sequence over its own keys (its table's pages in order), float64 SDPA; the decode's one query
    sees every key (bottom-right causal)."""
    q, kc, vc, table = q.cpu().double(), k_cache.cpu().double(), v_cache.cpu().double(), table.cpu().long()
    out = torch.zeros(q.shape, dtype=torch.float64)
    for b, n in enumerate(lens):
        k = kc[table[b]].permute(1, 0, 2, 3).reshape(HKV, -1, D)[:, :n].repeat_interleave(GROUP, 0)
        v = vc[table[b]].permute(1, 0, 2, 3).reshape(HKV, -1, D)[:, :n].repeat_interleave(GROUP, 0)
        out[b] = torch.nn.functional.scaled_dot_product_attention(q[b], k, v)
    return out


def test_a_captured_paged_decode_replays_with_tables_and_lengths_rewritten_in_place():
    q, k_cache, v_cache, table = decode_case()
    seq_lens = torch.tensor([128, 5, 77, 64], dtype=torch.int32, device="cuda")
    plan = attnprof.plan(q, k_cache, v_cache, backend="flash", mask="causal_bottom_right", block_table=table,
                         seq_lens=seq_lens)
    assert plan.backend == "flash" and plan.layout == "paged"
    out = torch.empty_like(q)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as torch.cuda.graph asks
        for _ in range(2):
            plan.run(q, k_cache, v_cache, out, block_table=table, seq_lens=seq_lens)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    allocated = _core.allocated_bytes("cuda")
    with torch.cuda.graph(graph):
        plan.run(q, k_cache, v_cache, out, block_table=table, seq_lens=seq_lens)
    assert _core.allocated_bytes("cuda") == allocated  # the plan holds its workspace: nothing allocated
    g = torch.Generator().manual_seed(1)
    for lens in ([1, 128, 40, 97], [128, 128, 128, 128], [17, 0, 3, 64]):
        # Written in place by GPU ops on the current stream, as a serving engine's step does.
        seq_lens.copy_(torch.tensor(lens, dtype=torch.int32), non_blocking=True)
        table.copy_(table.roll(1, dims=0))
        q.copy_(torch.randn(q.shape, generator=g).to("cuda", torch.bfloat16))
        graph.replay()
        eager = attnprof.attention(q, k_cache, v_cache, backend="flash", mask="causal_bottom_right",
                                   block_table=table, seq_lens=seq_lens)
        torch.cuda.synchronize()
        torch.testing.assert_close(out, eager, atol=0, rtol=0, msg=str(lens))
        want = reference(q, k_cache, v_cache, table, lens)
        torch.testing.assert_close(out.cpu().double(), want, atol=2e-2, rtol=2e-2, msg=str(lens))


def test_a_cuda_plan_refuses_a_run_on_another_device_in_one_line():
    q, k_cache, v_cache, table = decode_case()
    seq_lens = torch.full((BATCH,), 64, dtype=torch.int32, device="cuda")
    plan = attnprof.plan(q, k_cache, v_cache, backend="flash", block_table=table, seq_lens=seq_lens)
    with pytest.raises(attnprof.Error) as e:
        plan.run(q.cpu(), k_cache, v_cache, block_table=table, seq_lens=seq_lens)
    text = str(e.value)
    assert "\n" not in text and text.startswith("q is bfloat16[4, 8, 1, 128] on cpu but the plan was made for "
                                                "bfloat16[4, 8, 1, 128] on cuda:0"), text
    plan.release()
    with pytest.raises(attnprof.Error, match="this plan holds nothing"):
        plan.run(q, k_cache, v_cache, block_table=table, seq_lens=seq_lens)


def test_a_dense_cuda_plan_matches_attention_on_the_current_stream():
    q, k, v = (torch.randn(2, 8, 256, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    plan = attnprof.plan(q, k, v, backend="flash")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        got = plan.run(q, k, v)
        want = attnprof.attention(q, k, v, backend="flash")
    side.synchronize()
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_a_captured_packed_call_replays_with_cu_seqlens_rewritten_in_place():
    """flash reads a packed batch's lengths on the device (Problem::lengths_on_device): a plan's captured run
    follows cumulative lengths rewritten in place, max_seqlen given as the packed rows (a bound for any cut)."""
    total, heads, d = 256, 8, 64
    q, k, v = (torch.randn(total, heads, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cu = torch.tensor([0, 100, 180, total], dtype=torch.int32, device="cuda")
    kwargs = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=total, max_seqlen_k=total)
    plan = attnprof.plan(q, k, v, backend="flash", **kwargs)
    assert plan.layout == "packed"
    out = torch.empty_like(q)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        plan.run(q, k, v, out, cu_seqlens_q=cu, cu_seqlens_k=cu)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.run(q, k, v, out, cu_seqlens_q=cu, cu_seqlens_k=cu)
    for cuts in ([0, 10, 200, total], [0, total, total, total], [0, 64, 128, total]):
        cu.copy_(torch.tensor(cuts, dtype=torch.int32))
        graph.replay()
        eager = attnprof.attention(q, k, v, backend="flash", max_seqlen_q=total, max_seqlen_k=total,
                                   cu_seqlens_q=cu, cu_seqlens_k=cu)
        torch.cuda.synchronize()
        torch.testing.assert_close(out, eager, atol=0, rtol=0, msg=str(cuts))
