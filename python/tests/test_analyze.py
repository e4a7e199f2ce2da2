"""attnprof.analyze and attnprof.diff: the CLI's --json records as objects, from a path or a torch.profiler.profile."""

import json
import os
import subprocess

import pytest

import attnprof

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "..", "tests", "fixtures")
MODEL_TRAIN = os.path.join(FIXTURES, "models", "cpu_sdpa_train.pt.trace.json.gz")
NAIVE = os.path.join(FIXTURES, "torch", "cpu_naive.pt.trace.json.gz")
INPLACE = os.path.join(FIXTURES, "torch", "cpu_naive_inplace.pt.trace.json.gz")


def cli():
    """The attnprof command beside the module in the build tree (CTest's PYTHONPATH=<build>/python)."""
    for p in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        exe = os.path.join(os.path.dirname(os.path.abspath(p)), "attnprof")
        if p and os.access(exe, os.X_OK):
            return exe
    return None


def test_analyze_a_path_gives_the_clis_records():
    a = attnprof.analyze(MODEL_TRAIN)
    assert isinstance(a, attnprof.Analysis)
    step = a.traces[0].steps[0]
    assert step.label == "ProfilerStep#1"
    calls = a.attention_calls()
    # transformers' Llama of 2 layers: a flash forward and a flash backward per layer.
    assert [(c.backend, c["pass"]) for c in calls] == \
        [("flash", "forward")] * 2 + [("flash", "backward")] * 2
    fwd = calls[0]
    assert fwd.shape == "1x4x32x16, kv 1x2x32x16" and fwd.mask == "causal" and fwd.dtype == "fp32"
    assert fwd.flops == 4 * 1 * 4 * (32 * 33 / 2) * 16
    assert calls[2].flops == 2.5 * fwd.flops
    assert all(isinstance(f, attnprof.Finding) for f in a.findings())
    assert "attention" in str(a) and "ProfilerStep#1" in str(a)
    assert a.traces[0].replay is None


def test_analyze_matches_the_cli_json(tmp_path):
    exe = cli()
    assert exe, "the attnprof command beside the module (PYTHONPATH=<build>/python)"
    out = tmp_path / "a.json"
    subprocess.run([exe, "analyze", MODEL_TRAIN, "--json", str(out)], check=True, capture_output=True)
    want = json.loads(out.read_text())
    got = attnprof.analyze(MODEL_TRAIN).to_dict()
    # The same document, the path as given aside.
    assert got["traces"][0]["steps"] == want["traces"][0]["steps"]


def test_analyze_ceiling_as_the_cli_takes_it(tmp_path):
    exe = cli()
    assert exe, "the attnprof command beside the module (PYTHONPATH=<build>/python)"
    out = tmp_path / "c.json"
    subprocess.run([exe, "analyze", MODEL_TRAIN, "--ceiling-tflops", "0.5", "--json", str(out)], check=True,
                   capture_output=True)
    a = attnprof.analyze(MODEL_TRAIN, ceiling_tflops=0.5)
    assert a.to_dict()["traces"][0]["steps"] == json.loads(out.read_text())["traces"][0]["steps"]
    calls = a.attention_calls()
    assert calls and all(c["ceiling_pct"] == pytest.approx(100 * c["tflops"] / 0.5) for c in calls)
    with pytest.raises(ValueError, match="ceiling_tflops"):
        attnprof.analyze(MODEL_TRAIN, ceiling_tflops=0)


def test_analyze_replay_on_the_cpu():
    a = attnprof.analyze(MODEL_TRAIN, replay=True, device="cpu", backends=["flash"])
    problems = a.traces[0].replay.problems
    assert [p.label for p in problems] == ["forward 1x4x32x16, kv 1x2x32x16 causal fp32",
                                           "backward 1x4x32x16, kv 1x2x32x16 causal fp32"]
    for p in problems:
        assert p.fastest == "flash" and p.runs[0].ran and p.runs[0].us > 0


def test_analyze_a_torch_profile(tmp_path):
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    q, k, v = (torch.randn(1, 2, 64, 16) for _ in range(3))
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    a = attnprof.analyze(prof)
    calls = a.attention_calls()
    assert len(calls) == 1 and calls[0].shape == "1x2x64x16" and calls[0].mask == "causal"
    assert calls[0].flops == 4 * 1 * 2 * (64 * 65 / 2) * 16
    # The temporary export is gone.
    assert not a.traces[0].path or not os.path.exists(a.traces[0].path)


def test_diff_of_two_paths():
    d = attnprof.diff(NAIVE, INPLACE)
    assert isinstance(d, attnprof.Diff)
    assert any(f.rule == "hidden-copy" for f in d.findings_only_a)
    assert any(f.rule == "masked-fill-in-place" for f in d.findings_only_b)
    assert d.a.totals.steps == 2 and d.b.totals.steps == 2
    assert "findings only in A" in str(d)


def test_bad_inputs_are_one_clear_error(tmp_path):
    with pytest.raises(attnprof.Error, match="cannot read"):
        attnprof.analyze(str(tmp_path / "missing.json"))
    with pytest.raises(attnprof.Error, match="path or a torch.profiler.profile"):
        attnprof.analyze(42)
    with pytest.raises(attnprof.Error, match="step"):
        attnprof.analyze(MODEL_TRAIN, step=-1)
    with pytest.raises(attnprof.Error, match="no ProfilerStep#7"):
        attnprof.analyze(MODEL_TRAIN, step=7)
    with pytest.raises(attnprof.Error, match="device"):
        attnprof.analyze(MODEL_TRAIN, replay=True, device="tpu")


def test_a_compiled_calls_trace_names_its_mask_and_layout(tmp_path):
    """attnprof's op opens its label inside itself, so a call from a compiled graph (no Python of ours around it)
    is read with its mask and backend, and its [B, S, H, D] tensors by the op's bshd flag (issue 59's generate()
    traces under torch.compile read 'unknown' and a transposed shape before)."""
    torch = pytest.importorskip("torch")
    q = torch.randn(1, 8, 4, 16)
    k, v = torch.randn(1, 12, 2, 16), torch.randn(1, 12, 2, 16)
    f = torch.compile(lambda q, k, v: attnprof.attention(q, k, v, backend="flash", mask="causal-bottom-right",
                                                         layout="bshd"), backend="eager", fullgraph=True)
    f(q, k, v)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        f(q, k, v)
    path = str(tmp_path / "compiled.json")
    prof.export_chrome_trace(path)
    calls = attnprof.analyze(path).attention_calls()
    assert len(calls) == 1, calls
    c = calls[0]
    assert (c.backend, c.shape, c.mask) == ("attnprof:flash", "1x4x8x16, kv 1x2x12x16", "causal-bottom-right")
    assert c.flops == 4 * 1 * 4 * sum(i + 5 for i in range(8)) * 16  # row i sees keys 0 .. i + 4
