"""`attnprof compare`, `profile` and `explain` as calls: each builds the library's Problem from typed keyword
values (every one checked once, by the library), runs the command's own pipeline in attnprof._core and returns
its report as objects (attnprof._records)."""

from __future__ import annotations

from . import _args, _core
from ._args import ArgumentTypeError
from ._core import Error
from ._records import Explanation, Report

_INT64 = _args.INT64
_whole, _real = _args.whole, _args.real


# The library's defaults (attnprof/problem.h, runner.h, key_averages.h), read
# once: the signatures below show them and keep no copies. batch and heads
# left None take the device's (the CLI's: the reference shape on a GPU, a
# smaller one on the CPU).
_D = _core.defaults()


def _problem(batch, heads, seq, head_dim, dtype, device, mask, window, scale, kv_heads, kv_seq, pass_, deterministic,
             softcap=None, seq_lens=None, kv_seq_lens=None):
    """The library's Problem from typed values: every number and list as itself, each checked once by the library."""
    w = _args.whole
    return _core.Problem(batch=w("batch", batch, _INT64, optional=True), heads=w("heads", heads, _INT64, optional=True),
                         kv_heads=w("kv_heads", kv_heads, _INT64, optional=True), seq=w("seq", seq, _INT64),
                         kv_seq=w("kv_seq", kv_seq, _INT64, optional=True), head_dim=w("head_dim", head_dim, _INT64),
                         dtype=_args.text("dtype", dtype), device=_args.text("device", device),
                         mask=_args.text("mask", mask), window=w("window", window, _INT64, optional=True),
                         scale=_real("scale", scale), pass_=_args.text("pass_", pass_),
                         deterministic=_args.flag("deterministic", deterministic), softcap=_real("softcap", softcap),
                         seq_lens=_args.lengths("seq_lens", seq_lens),
                         kv_seq_lens=_args.lengths("kv_seq_lens", kv_seq_lens))


def _fp8_descale(value):
    """fp8_descale as a number, or None for "auto" (each tensor's amax / 448)."""
    if value is None or isinstance(value, str) and value == "auto":
        return None
    if isinstance(value, str):
        raise Error(f"fp8_descale takes 'auto' or a number, got {value!r}")
    return _real("fp8_descale", value)


def _run_args(backends, trace_dir, json_path, seed, threads, bshd, check_rows, schedule, unprofiled_calls, expect,
              sort_by, row_limit, fp8_descale):
    """compare's and profile's run options as keywords, each of its type (the library bounds them)."""
    try:
        schedule = tuple(schedule)
    except TypeError:
        raise ArgumentTypeError(f"schedule must be (wait, warmup, active, repeat), got {schedule!r}") from None
    if len(schedule) != 4:
        raise Error(f"schedule must be (wait, warmup, active, repeat), got {schedule!r}")
    schedule = tuple(_whole(f"schedule.{n}", v) for n, v in zip(("wait", "warmup", "active", "repeat"), schedule))
    expect = {_args.text("expect", k): _whole(f"expect[{k!r}]", v) for k, v in dict(expect or {}).items()}
    return dict(backends=_args.names("backends", backends), trace_dir=_args.path("trace_dir", trace_dir),
                json_path=_args.path("json_path", json_path), seed=_whole("seed", seed, _args.UINT64),
                threads=_whole("threads", threads), bshd=_args.flag("bshd", bshd),
                check_rows=_whole("check_rows", check_rows, _INT64), schedule=schedule,
                unprofiled_calls=_whole("unprofiled_calls", unprofiled_calls), expect=expect,
                sort_by=_args.text("sort_by", sort_by), row_limit=_whole("row_limit", row_limit),
                fp8_descale=_fp8_descale(fp8_descale))


def compare(*, batch: int | None = None, heads: int | None = None, seq: int = _D["seq"],
            head_dim: int = _D["head_dim"], dtype: str = _D["dtype"], device: str = "cpu", mask: str = _D["mask"],
            window: int | None = None, scale: float | None = None, kv_heads: int | None = None,
            kv_seq: int | None = None, backends: list[str] | None = None, trace_dir: str | None = "traces",
            json_path: str | None = None, seed: int = _D["seed"], threads: int = _D["threads"], bshd: bool = False,
            check_rows: int = _D["check_rows"], schedule: tuple[int, int, int, int] = _D["schedule"],
            unprofiled_calls: int = _D["unprofiled_calls"], expect: dict[str, int] | None = None,
            sort_by: str = _D["sort_by"], row_limit: int = _D["row_limit"], pass_: str = _D["pass_"],
            deterministic: bool = False, softcap: float | None = None, seq_lens: list[int] | None = None,
            kv_seq_lens: list[int] | None = None, fp8_descale: float | str | None = None) -> Report:
    """`attnprof compare` as a call: every eligible backend (or `backends`) profiled on one problem.

    schedule is (wait, warmup, active, repeat) steps, as --wait/--warmup/--active/--repeat.
    pass_ is --pass (forward, backward or train), deterministic --deterministic, softcap --softcap
    (Gemma-2's tanh(s / c) * c on the scaled scores; None: no cap, and 0 or less is refused).
    seq_lens (kv_seq_lens) is --seq-lens (--kv-seq-lens): a packed batch of these lengths, batch their
    count and seq their maximum; the findings say what share of the padded batch's FLOPs it needs.
    dtype="fp8" is --dtype fp8 (e4m3 inputs quantized from the bf16 run's, bf16 output; each result's
    .fp8 holds the descales and the bf16 error beside it), fp8_descale --fp8-descale ("auto" or None:
    each tensor's amax / 448; a number: that descale for q, k and v).
    """
    p = _problem(batch, heads, seq, head_dim, dtype, device, mask, window, scale, kv_heads, kv_seq, pass_, deterministic,
                 softcap, seq_lens, kv_seq_lens)
    rep = _core.compare(p, **_run_args(backends, trace_dir, json_path, seed, threads, bshd, check_rows, schedule,
                                       unprofiled_calls, expect, sort_by, row_limit, fp8_descale))
    return Report(rep, "compare")


def profile(backend: str = "auto", *, batch: int | None = None, heads: int | None = None, seq: int = _D["seq"],
            head_dim: int = _D["head_dim"], dtype: str = _D["dtype"], device: str = "cpu", mask: str = _D["mask"],
            window: int | None = None, scale: float | None = None, kv_heads: int | None = None,
            kv_seq: int | None = None, trace_dir: str | None = "traces", json_path: str | None = None,
            seed: int = _D["seed"], threads: int = _D["threads"], bshd: bool = False,
            check_rows: int = _D["check_rows"], schedule: tuple[int, int, int, int] = _D["schedule"],
            unprofiled_calls: int = _D["unprofiled_calls"], expect: dict[str, int] | None = None,
            sort_by: str = _D["sort_by"], row_limit: int = _D["row_limit"], pass_: str = _D["pass_"],
            deterministic: bool = False, softcap: float | None = None, seq_lens: list[int] | None = None,
            kv_seq_lens: list[int] | None = None, fp8_descale: float | str | None = None) -> Report:
    """`attnprof profile --backend B` as a call: one backend ("auto" picks one); its key-averages table in .table.

    seq_lens and kv_seq_lens make a packed batch, fp8_descale sets an fp8 run's descales, as compare's do.
    """
    p = _problem(batch, heads, seq, head_dim, dtype, device, mask, window, scale, kv_heads, kv_seq, pass_, deterministic,
                 softcap, seq_lens, kv_seq_lens)
    args = _run_args(None, trace_dir, json_path, seed, threads, bshd, check_rows, schedule, unprofiled_calls, expect,
                     sort_by, row_limit, fp8_descale)
    del args["backends"]
    rep = _core.profile(p, backend=_args.text("backend", backend), **args)
    return Report(rep, "profile")


def explain(*, batch: int | None = None, heads: int | None = None, seq: int = _D["seq"],
            head_dim: int = _D["head_dim"], dtype: str = _D["dtype"], device: str = "cpu", mask: str = _D["mask"],
            window: int | None = None, scale: float | None = None, kv_heads: int | None = None,
            kv_seq: int | None = None, threads: int = _D["threads"], pass_: str = _D["pass_"],
            deterministic: bool = False, softcap: float | None = None, seq_lens: list[int] | None = None,
            kv_seq_lens: list[int] | None = None) -> Explanation:
    """`attnprof explain` as a call: which backends can take the problem and why, and what auto picks.

    seq_lens and kv_seq_lens make a packed batch, as compare's do.
    """
    p = _problem(batch, heads, seq, head_dim, dtype, device, mask, window, scale, kv_heads, kv_seq, pass_, deterministic,
                 softcap, seq_lens, kv_seq_lens)
    return Explanation(*_core.explain(p, threads=_whole("threads", threads)))
