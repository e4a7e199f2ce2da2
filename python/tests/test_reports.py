"""compare, profile and explain as calls: typed results over the library's --json, its tables as reprs."""

import json
import os

import pytest

import attnprof

SMALL = dict(batch=1, heads=2, seq=64, head_dim=32, dtype="fp32", device="cpu", schedule=(0, 1, 1, 1))


def test_compare_returns_typed_results(tmp_path):
    rep = attnprof.compare(**SMALL, trace_dir=str(tmp_path), json_path=str(tmp_path / "compare.json"))
    assert isinstance(rep, attnprof.Report)
    # The --json document, whole, and its fields as attributes.
    assert json.loads((tmp_path / "compare.json").read_text())["results"] == rep.json["results"]
    assert rep.problem.seq == 64 and rep.problem.dtype == "fp32" and rep.problem.device == "cpu"
    assert [r.backend for r in rep.results] == attnprof.backend_names()
    flash = rep["flash"]
    assert isinstance(flash, attnprof.Result)
    assert flash.eligible and not flash.failed and flash.accepted
    assert flash.ops_per_forward >= 1 and flash.host_time_us > 0 and flash.rel_error < 1e-3
    assert set(flash.fields()) >= {"backend", "kernels_per_forward", "copies_per_forward", "peak_bytes", "tflops",
                                   "findings", "expected_ops"}
    # Trace paths: the files were written where the report says.
    for path in (flash.trace_path, flash.table_path, flash.summary_path):
        assert path and os.path.isfile(path), path
    assert "Self CPU" in flash.table
    # A backend that cannot run on the CPU says why, with no paths.
    cudnn = rep["cudnn"]
    assert not cudnn.eligible and "not eligible on CPU" in cudnn.reason and cudnn.trace_path is None
    assert rep.accepted


def test_findings_are_records_with_rule_ids_and_severities(tmp_path):
    rep = attnprof.compare(**SMALL, trace_dir=None, backends=["naive", "naive_inplace", "math"])
    assert [r.backend for r in rep.results] == ["naive", "naive_inplace", "math"]
    findings = [f for r in rep.results for f in r.findings]
    assert findings and all(isinstance(f, attnprof.Finding) for f in findings)
    assert all(f.severity in ("info", "warning", "error") for f in findings)
    hidden = [f for f in rep["naive"].findings if f.rule == "hidden-copy"]
    assert hidden and hidden[0].severity == "warning" and "copy" in hidden[0].text
    assert isinstance(hidden[0].figures, attnprof.Record) and hidden[0].evidence
    assert hidden[0].evidence[0].cat == "cpu_op"
    assert rep["naive"].trace_path is None  # trace_dir=None writes nothing


def test_repr_is_the_table_at_a_glance():
    rep = attnprof.compare(**SMALL, trace_dir=None, backends=["naive", "flash"])
    text = repr(rep)
    assert text.startswith("compare: batch 1, heads 2, seq 64, head_dim 32, fp32")
    assert "backend" in text and "rel error" in text
    lines = text.splitlines()
    assert any(line.startswith("naive ") for line in lines) and any(line.startswith("flash ") for line in lines)
    assert rep.table() in text


def test_profile_one_backend(tmp_path):
    rep = attnprof.profile("flash", **SMALL, trace_dir=str(tmp_path), expect={"flash": 1})
    assert len(rep.results) == 1 and rep.results[0].backend == "flash"
    assert os.path.isfile(rep.results[0].trace_path)
    assert rep.results[0].ops_per_forward == 1
    auto = attnprof.profile(**SMALL, trace_dir=None)
    assert auto.results[0].backend in attnprof.backend_names()
    with pytest.raises(attnprof.Error, match="cudnn"):
        attnprof.profile("cudnn", **SMALL, trace_dir=None)


def test_explain():
    ex = attnprof.explain(batch=1, heads=2, seq=64, head_dim=32, device="cpu")
    assert isinstance(ex, attnprof.Explanation)
    assert [r.backend for r in ex.results] == attnprof.backend_names()
    assert "flash" in ex.eligible() and "cudnn" not in ex.eligible()
    assert ex.auto is not None and ex.auto.backend in ex.eligible()
    assert "eligible" in repr(ex) and "auto" in repr(ex) and "picks" in repr(ex)


def test_explain_says_which_cuda_backends_the_build_has():
    # The check docs/install.md gives a user of `pip install .`: a CPU-only build says so, a CUDA one names
    # its architectures and the plugin file the backends came from (or why it cannot be loaded).
    ex = attnprof.explain(batch=1, heads=2, seq=64, head_dim=32, device="cpu")
    assert ex.cuda_build == ex.json["cuda_build"]
    assert ("build: " + ex.cuda_build) in ex.table()
    if attnprof.cuda_built():
        assert ex.cuda_build.startswith("CUDA backends") and "sm " in ex.cuda_build
    else:
        assert ex.cuda_build.startswith("CPU only")
