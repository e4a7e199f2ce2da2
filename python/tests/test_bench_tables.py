"""bench/bench_tables.py on hand-made records: issue 21's backward target judged
per row (met, missed, no figure with the refusal's reason), the count of rows,
the dtype shown where it is not bf16, and issue 12's forward targets as before.

Only bench_tables is imported (by path): it needs neither torch nor a GPU. The
rows are stand-ins for bench_vs_torch.Row with the attributes summarize reads.
"""

import dataclasses
import importlib.util
import pathlib

import pytest

TABLES = pathlib.Path(__file__).resolve().parents[2] / "bench" / "bench_tables.py"
CEILING = {"bytes_per_s": 4.0e12, "copied_bytes": 2**30, "device": "cuda", "reps": 10}


@pytest.fixture(scope="module")
def bt():
    spec = importlib.util.spec_from_file_location("bench_tables", TABLES)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclasses.dataclass(frozen=True)
class Row:
    cls: str
    b: int
    h: int
    hkv: int
    sq: int
    skv: int
    d: int
    mask: str
    kv_cache: str = "contiguous"
    page_size: int = 0
    dtype: str = "bf16"

    @property
    def paged(self):
        return self.kv_cache == "paged"

    def shape(self):
        heads = f"{self.h}/{self.hkv}" if self.hkv != self.h else f"{self.h}"
        return f"{self.b}x{heads}x{self.sq}x{self.d}"

    def same_problem(self):
        return (self.b, self.h, self.hkv, self.sq, self.skv, self.d, self.mask, self.kv_cache, self.page_size,
                self.dtype)

    def flops(self, pass_):
        pairs = self.sq * self.skv if self.mask == "none" else self.sq * (self.sq + 1) // 2
        return 4.0 * self.b * self.h * pairs * self.d * (2.5 if pass_ == "backward" else 1.0)

    def kv_bytes(self):
        return self.hkv * self.skv * self.d * 2 * 2 * self.b


def ran(backend, us, accepted=True, host=4.0):
    return {"backend": backend, "eligible": True, "failed": False, "reason": "", "device_time_us": us,
            "accepted": accepted, "host_time_unprofiled_us": host}


def refused(backend, reason):
    return {"backend": backend, "eligible": False, "failed": False, "reason": reason}


TORCH = {"sdpa": {"gpu_us": 5200.0, "host_us": 9.0, "kind": "cudnn"},
         "sdpa_flash": {"gpu_us": 6100.0, "host_us": 8.0, "kind": "flash"},
         "sdpa_cudnn": {"reason": "No available kernel. Aborting execution."}}

# One row of each verdict: met (and met at 1.004x, which rounds to 1.00x),
# missed, flash refused (head dim 256), cudnn failed, fp16.
BACKWARD_CASES = [
    (Row("grid", 2, 16, 16, 8192, 8192, 128, "causal"), {"flash": ran("flash", 4000.0), "cudnn": ran("cudnn", 5000.0)}),
    (Row("gqa", 2, 32, 8, 4096, 4096, 128, "causal"), {"flash": ran("flash", 3600.0), "cudnn": ran("cudnn", 3000.0)}),
    (Row("hd256", 2, 16, 16, 4096, 4096, 256, "causal"), {
        "flash": refused("flash", "flash's backward takes head dims 64, 96 and 128\nthe second line is not shown"),
        "cudnn": ran("cudnn", 2500.0)}),
    (Row("hd96", 2, 24, 24, 4096, 4096, 96, "causal"), {
        "flash": ran("flash", 1000.0),
        "cudnn": {"backend": "cudnn", "eligible": True, "failed": True, "reason": "cuDNN graph build failed"}}),
    (Row("fp16", 4, 16, 16, 2048, 2048, 128, "causal", dtype="fp16"),
     {"flash": ran("flash", 1004.0), "cudnn": ran("cudnn", 1000.0)}),
]


def backward_summary(bt):
    return [bt.summarize(row, mine, TORCH, row.flops("backward"), CEILING["bytes_per_s"], "backward")
            for row, mine in BACKWARD_CASES]


def test_backward_verdicts(bt):
    met, missed, no_flash, no_cudnn, fp16 = backward_summary(bt)
    assert (met["backward_target"], met["target"]) == ("met", "met: flash 0.80x cudnn")
    assert (missed["backward_target"], missed["target"]) == ("missed", "missed: flash 1.20x cudnn")
    assert missed["misses"] == ["flash 1.20x cudnn"]
    assert no_flash["backward_target"] == "no figure"
    assert no_flash["target"] == "no figure: our flash refused the row: flash's backward takes head dims 64, 96 and 128"
    assert no_cudnn["target"] == "no figure: our cudnn did not run: cuDNN graph build failed"
    assert (fp16["backward_target"], fp16["target"]) == ("met", "met: flash 1.00x cudnn")  # 1.004 rounds to 1.00
    # Backward FLOPs are 2.5x the forward's; causal counts the visible pairs.
    row = BACKWARD_CASES[0][0]
    pairs = 8192 * 8193 // 2
    assert met["flash_tflops"] == pytest.approx(2.5 * 4 * 2 * 16 * pairs * 128 / 4000e-6 / 1e12)
    assert met["cudnn_tflops"] == pytest.approx(met["flash_tflops"] * 4000 / 5000)
    assert met["flops"] == row.flops("backward") and met["pass"] == "backward"
    assert fp16["dtype"] == "fp16" and met["dtype"] == "bf16"
    # Issue 12's forward targets are not judged on a backward row: flash's
    # host time (6 us) would miss its 5 us there.
    slow_host = {"flash": ran("flash", 900.0, host=6.0), "cudnn": ran("cudnn", 1000.0)}
    s = bt.summarize(row, slow_host, TORCH, row.flops("backward"), CEILING["bytes_per_s"], "backward")
    assert s["target"] == "met: flash 0.90x cudnn"
    # A flash over its error tolerance misses whatever its time.
    wrong = {"flash": ran("flash", 900.0, accepted=False), "cudnn": ran("cudnn", 1000.0)}
    s = bt.summarize(row, wrong, TORCH, row.flops("backward"), CEILING["bytes_per_s"], "backward")
    assert s["target"] == "missed: flash 0.90x cudnn, flash over its error tolerance"


def test_backward_table(bt):
    table = bt.summary_table(backward_summary(bt), CEILING, "backward")
    lines = table.splitlines()
    assert lines[-1] == ("Backward target flash <= 1.00x cudnn: met on 2 of 5 rows, missed on 1, no figure on 2 "
                         "(missed gqa 2x32/8x4096x128 causal; no figure hd256 2x16x4096x256 causal, "
                         "hd96 2x24x4096x96 causal).")
    rows = [x for x in lines if x.startswith("| ") and not x.startswith("| class")]
    assert len(rows) == 5
    cells = [[c.strip() for c in x.strip("|").split("|")] for x in rows]
    assert [c[1] for c in cells] == ["2x16x8192x128", "2x32/8x4096x128", "2x16x4096x256", "2x24x4096x96",
                                     "4x16x2048x128 fp16"]  # dtype only where it is not bf16
    assert [c[-1].split(":")[0] for c in cells] == ["met", "missed", "no figure", "no figure", "met"]
    assert cells[0][3:5] == ["4.000", "5.000"] and cells[0][9] == "0.80"  # flash ms, cudnn ms, flash/cudnn
    assert cells[2][3] == "refused" and cells[2][9] == "-"
    assert cells[0][6] == "6.100" and cells[0][7] == "refused"  # torch flash SDPA, torch cuDNN SDPA
    assert cells[0][11] == f"{backward_summary(bt)[0]['flash_tflops']:.0f}"
    # The refusal's one-line reason under the table, the row named.
    assert ("- row 3 (hd256 2x16x4096x256 causal, contiguous): our flash: flash's backward takes head dims 64, 96 "
            "and 128") in lines
    assert "- row 4 (hd96 2x24x4096x96 causal, contiguous): our cudnn: cuDNN graph build failed" in lines
    assert "- row 5 (fp16 4x16x2048x128 fp16 causal, contiguous): torch sdpa_cudnn: No available kernel. " \
           "Aborting execution." in lines
    assert "the second line is not shown" not in table
    assert "target met?" not in table and "TFLOP/s at" not in table  # no forward targets here


def test_forward_targets_unchanged(bt):
    """Issue 12's targets on a forward row: flash/cudnn, the 700 TFLOP/s row, host time."""
    headline = Row("grid", 2, 16, 16, 8192, 8192, 128, "none")
    fl = headline.flops("forward")  # 1.1e12: 600 TFLOP/s at 1833 us
    slow = {"flash": ran("flash", fl / 600e6, host=6.0), "cudnn": ran("cudnn", fl / 650e6)}
    s = bt.summarize(headline, slow, TORCH, fl, CEILING["bytes_per_s"])
    assert s["pass"] == "forward" and "backward_target" not in s
    assert s["target"] == "no: flash 1.08x cudnn; 600 < 700 TFLOP/s; host 6.0 > 5 us"
    fast = {"flash": ran("flash", fl / 750e6), "cudnn": ran("cudnn", fl / 700e6)}
    assert bt.summarize(headline, fast, TORCH, fl, CEILING["bytes_per_s"])["target"] == "yes"
    # The 700 TFLOP/s target is the bf16 row's: an fp16 row of that shape is not held to it.
    fp16 = dataclasses.replace(headline, dtype="fp16")
    s = bt.summarize(fp16, {"flash": ran("flash", fl / 600e6), "cudnn": ran("cudnn", fl / 550e6)}, TORCH, fl,
                     CEILING["bytes_per_s"])
    assert s["target"] == "yes"
    no_cudnn = {"flash": ran("flash", fl / 750e6), "cudnn": refused("cudnn", "no")}
    assert bt.summarize(headline, no_cudnn, TORCH, fl, CEILING["bytes_per_s"])["target"] == "? cudnn did not run"
    table = bt.summary_table([s], CEILING, "forward")
    assert "| target met? |" in table and "| 2x16x8192x128 fp16 | none | contiguous |" in table
    assert "Backward target" not in table


def test_run_compare_reads_the_json_or_gives_each_backend_the_last_line(bt, tmp_path):
    """run_compare: a process that writes its JSON gives the results by backend; one that fails gives
    every backend asked for the process's last line as its reason."""
    import sys
    path = tmp_path / "r.json"
    body = {"results": [{"backend": "flash", "device_time_us": 12.5}, {"backend": "cudnn", "reason": "refused"}]}
    write = f"import json; json.dump({body!r}, open({str(path)!r}, 'w'))"
    got = bt.run_compare([sys.executable, "-c", write], str(path), ["flash", "cudnn"])
    assert got["flash"]["device_time_us"] == 12.5 and got["cudnn"]["reason"] == "refused"
    missing = tmp_path / "none.json"
    fail = "import sys; print('first'); sys.exit('attnprof: error: --dtype fp8 takes no mask bias')"
    got = bt.run_compare([sys.executable, "-c", fail], str(missing), ["flash", "cudnn"])
    assert got == {b: {"reason": "attnprof: error: --dtype fp8 takes no mask bias"} for b in ("flash", "cudnn")}
