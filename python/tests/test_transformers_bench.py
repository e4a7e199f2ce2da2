"""bench/hf_structure.py (the GPU phase `hf` of scripts/gpu.sh) at its tiny CPU config: every case runs through
the registration on flash, agrees with transformers' own attention, and lands in one table and hf_structure.json.
"""

import importlib.util
import json
import pathlib

import pytest

import attnprof

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "hf_structure.py"


def test_tiny_run_writes_one_table_and_its_json(tmp_path):
    spec = importlib.util.spec_from_file_location("hf_structure", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    result = bench.main(["--dry", "--device", "cpu", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "hf_structure.json").read_text()) == json.loads(json.dumps(result))
    cases = result["cases"]
    for name in ("llama padded", "llama unpadded", "llama packed", "gemma2 padded vs eager"):
        case = cases[name]
        assert case["step_ms"] > 0 and case["ref_step_ms"] > 0, name
        assert case["loss_rel_diff"] < 1e-4 and case["grad_cosine"] > 0.9999, (name, case)
    for name in ("generate dynamic", "generate static"):
        assert cases[name]["tokens_equal"] and cases[name]["tokens_per_s"] > 0, (name, cases[name])
        eager = cases[name]["vs_eager"]  # float32 on the CPU: eager's tokens too
        assert eager["tokens_equal"] and eager["ref_tokens_per_s"] > 0, (name, eager)
    assert result["config"]["lengths"] == [10, 32]  # 30% and 100% of the tiny batch's 32 tokens
    assert "llama packed train" in result["table"] and "generate static" in result["table"]
    assert sum(line.startswith("generate static") for line in result["table"].splitlines()) == 2  # sdpa, eager
