"""bench/train_step.py on the CPU: a tiny Llama-shaped model trained with attnprof's flash and with SDPA.

The benchmark is imported by path and its main() run in-process at its tiny
CPU config (FP32), our own model forced with --model own so that the test
does not depend on transformers; the transformers path is tested too where
transformers is importable (the GPU machine), else skipped with the reason.
"""

import importlib.util
import json
import math
import pathlib

import pytest
import torch

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "train_step.py"


@pytest.fixture(scope="module")
def train_step():
    spec = importlib.util.spec_from_file_location("train_step", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_result(result, out_dir, layers, model_prefix):
    on_disk = json.loads((out_dir / "train_step.json").read_text())
    assert on_disk == json.loads(json.dumps(result))  # what main returned is what it wrote
    md = (out_dir / "train_step.md").read_text()
    assert "| side | attention | median step ms |" in md and "Step-time ratio attnprof/SDPA" in md
    assert result["model"].startswith(model_prefix)
    assert result["config"]["device"] == "cpu" and result["config"]["dtype"] == "fp32"
    steps = result["config"]["steps"]
    for name in ("attnprof", "sdpa"):
        side = result["sides"][name]
        assert len(side["step_ms"]) == steps and side["step_ms_median"] > 0
        assert side["step_ms_p10"] <= side["step_ms_median"] <= side["step_ms_p90"]
        assert len(side["losses"]) == steps + result["config"]["warmup"]
        assert all(math.isfinite(x) for x in side["losses"])
        share = side["attention_share"]
        # Forward and backward of each layer's attention, as outermost ops.
        assert share["attention_op_calls"] == 2 * layers, share
        assert 0 < share["share"] < 1 and 0 < share["attention_ms"] < share["step_ms"]
    # The one forward op (return_lse=True in training) and its backward.
    assert "attnprof::attention" in result["sides"]["attnprof"]["attention_share"]["attention_ops"]
    assert "attnprof::attention_backward" in result["sides"]["attnprof"]["attention_share"]["attention_ops"]
    assert any(op.startswith("aten::_scaled_dot_product") for op in result["sides"]["sdpa"]["attention_share"]["attention_ops"])
    ratio = result["step_time_ratio_attnprof_over_sdpa"]
    assert ratio == pytest.approx(result["sides"]["attnprof"]["step_ms_median"] / result["sides"]["sdpa"]["step_ms_median"])
    g = result["agreement"]
    # FP32 on the CPU: attnprof's flash and SDPA agree to rounding (about 5e-7 here). The bounds are tight on
    # purpose: at this init the tiny model's attention is nearly uniform, so a 2% error in the scale moves the
    # gradients by only 3e-4 (relative L2) and their cosine by 5e-8; a missing mask or shuffled K/V heads move the
    # cosine below 0.85.
    assert g["loss_rel_diff"] < 1e-6, g
    assert g["grad_cosine"] > 0.99999 and g["worst_param"]["cosine"] > 0.9999, g
    assert g["grad_max_rel_err"] < 1e-5 and g["grad_rel_l2"] < 1e-5, g
    assert g["grad_elements"] > 0
    # The same updates from the same gradients: the trajectories stay together.
    assert g["last_loss_rel_diff"] < 1e-5, g


def test_own_model_flash_agrees_with_sdpa(train_step, tmp_path):
    result = train_step.main(["--device", "cpu", "--model", "own", "--out", str(tmp_path)])
    check_result(result, tmp_path, layers=2, model_prefix="own")
    assert result["config"]["backend"] == "flash"


def test_transformers_llama_flash_agrees_with_sdpa(train_step, tmp_path):
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not importable here: its LlamaForCausalLM path is not tested on this "
                               "machine (it runs on the GPU machine, in scripts/gpu.sh python and train_model)")
    result = train_step.main(["--device", "cpu", "--model", "transformers", "--layers", "2", "--out", str(tmp_path)])
    check_result(result, tmp_path, layers=2, model_prefix="transformers LlamaForCausalLM")
    assert result["notes"]["transformers"] == transformers.__version__
    assert result["notes"]["contract_max_abs_diff"] < 1e-4  # ours against transformers' sdpa_attention_forward


def test_masks_other_than_plain_causal_are_refused(train_step):
    attention = train_step.make_attnprof_attention("flash")
    module = torch.nn.Module()
    b, h, hkv, s, d = 2, 4, 2, 16, 8
    q, k, v = torch.randn(b, h, s, d), torch.randn(b, hkv, s, d), torch.randn(b, hkv, s, d)
    want, _ = train_step.sdpa_attention(module, q, k, v, None, scaling=d ** -0.5)
    causal = torch.ones(s, s, dtype=torch.bool).tril()[None, None].expand(b, 1, s, s)
    additive = torch.zeros(b, 1, s, s).masked_fill(~causal, float("-inf"))
    for mask in (None, causal, additive):  # plain causal, as None, bool or additive
        got, weights = attention(module, q, k, v, mask, scaling=d ** -0.5)
        assert got.shape == (b, s, h, d) and weights is None
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    assert attention.calls == 3
    padded = causal.clone()
    padded[1, :, :, :3] = False  # the second sequence left-padded by 3 tokens
    with pytest.raises(train_step.Refused, match=r"^attention_mask \(2, 1, 16, 16\) torch.bool is not plain causal"):
        attention(module, q, k, v, padded, scaling=d ** -0.5)
    with pytest.raises(train_step.Refused, match="is not plain causal"):
        train_step.sdpa_attention(module, q, k, v, additive.masked_fill(~padded, float("-inf")))
    module.is_causal = False
    with pytest.raises(train_step.Refused, match=r"^non-causal attention asked"):
        attention(module, q, k, v, None)
    assert attention.calls == 3


def test_refusals_are_one_line(train_step, monkeypatch):
    with pytest.raises(SystemExit) as e:
        train_step.main(["--device", "cpu", "--backend", "nope"])
    assert str(e.value).startswith("train_step: error: --backend 'nope' is not one of attnprof's: ")
    assert "flash" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(SystemExit) as e:  # attnprof's own refusal, in one line
        train_step.main(["--device", "cpu", "--backend", "naive", "--no-profile"])
    assert str(e.value).startswith("train_step: error: attnprof refused: naive keeps the [S, Skv] probabilities")
    assert "\n" not in str(e.value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as e:
        train_step.main(["--device", "cuda"])
    assert str(e.value).startswith("train_step: error: --device cuda but torch ") and "sees no CUDA device" in str(e.value)
    assert "\n" not in str(e.value)
    with pytest.raises(SystemExit) as e:  # argparse's own refusal (exit status 2)
        train_step.main(["--device", "cpu", "--heads", "6", "--kv-heads", "4"])
    assert e.value.code == 2


def test_attention_share_on_a_gpu_trace(train_step, tmp_path):
    # The CUDA branch of the accounting, on a hand-made Chrome trace: kernels
    # count as attention's when launched (External id) from an attention op or
    # an op inside one, on the op's own thread (the backward's runs on autograd's).
    def op(name, ext, ts, dur, tid=1, cat="cpu_op"):
        return {"ph": "X", "cat": cat, "name": name, "pid": 10, "tid": tid, "ts": ts, "dur": dur,
                "args": {"External id": ext}}

    def kernel(name, ext, dur, cat="kernel"):
        return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": 1000, "dur": dur,
                "args": {"External id": ext, "correlation": ext + 100}}

    events = [
        op("train_step", 1, 0, 500, cat="user_annotation"),
        op("aten::mm", 2, 10, 5), kernel("gemm", 2, 40),
        op("attnprof::attention_train", 3, 20, 30), kernel("flash_fwd", 3, 10),
        op("aten::empty", 4, 22, 2),
        op("aten::mm", 5, 100, 5, tid=2), kernel("gemm", 5, 30),
        op("attnprof::attention_backward", 6, 110, 50, tid=2), op("aten::zeros", 7, 112, 3, tid=2),
        kernel("memset", 7, 2, cat="gpu_memset"), kernel("flash_bwd", 6, 18),
        op("aten::add", 8, 115, 3, tid=1),  # inside the backward's span, but on another thread
        kernel("add", 8, 5), kernel("unlinked", 0, 1),
        {"ph": "s", "cat": "ac2g", "name": "flow", "pid": 0, "tid": 7, "ts": 1, "id": 3},
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    share = train_step._attention_share(str(path), torch.device("cuda"))
    assert share["attention_ops"] == ["attnprof::attention_backward", "attnprof::attention_train"]
    assert share["attention_op_calls"] == 2
    assert share["attention_ms"] == pytest.approx(0.030)  # flash_fwd 10 + memset 2 + flash_bwd 18 (us)
    assert share["step_ms"] == pytest.approx(0.106)
    assert share["share"] == pytest.approx(30 / 106)
    assert share["unlinked_gpu_ms"] == pytest.approx(0.001)
    assert share["attention_kernels"] == ["flash_bwd", "flash_fwd", "memset"]
