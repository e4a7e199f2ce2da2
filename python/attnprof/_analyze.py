"""attnprof.analyze and attnprof.diff: `attnprof analyze` and `attnprof diff` as calls, for notebooks.

    import attnprof
    a = attnprof.analyze("run.pt.trace.json.gz")      # or a torch.profiler.profile that has stopped
    a.traces[0].steps[0].attention.calls[0].backend
    print(a)                                           # the text `attnprof analyze` prints
    d = attnprof.diff("a.json", "b.json")
    d.kernels_added

The records are the CLI's --json documents read through attributes (Record);
the work is the C++ library's.
"""

from __future__ import annotations

import json as _json
import os as _os
import tempfile as _tempfile

from . import _args, _core
from ._records import Finding, Record


class Analysis(Record):
    """What analyze returns: traces (path, device, steps: label, findings, ops, kernels_by_time,
    attention, ...; replay when asked), as `attnprof analyze --json` writes them; str() is the CLI's text."""

    __slots__ = ("_text",)

    def __init__(self, json_text: str, text: str):
        super().__init__(_json.loads(json_text))
        object.__setattr__(self, "_text", text)

    def findings(self) -> list[Finding]:
        """Every step's findings, in order."""
        return [Finding(f) for t in self._data["traces"] for s in t["steps"] for f in s["findings"]]

    def attention_calls(self) -> list[Record]:
        """Every step's attention calls, in order."""
        return [Record(c) for t in self._data["traces"] for s in t["steps"] for c in s["attention"]["calls"]]

    def __str__(self):
        return self._text

    __repr__ = __str__


class Diff(Record):
    """What diff returns: a and b (label, totals), kernels, ops, op_host, kernels_added, kernels_removed,
    findings_only_a, findings_only_b, as `attnprof diff --json` writes them; str() is the CLI's text."""

    __slots__ = ("_text",)

    def __init__(self, json_text: str, text: str):
        super().__init__(_json.loads(json_text))
        object.__setattr__(self, "_text", text)

    def __str__(self):
        return self._text

    __repr__ = __str__


def _step(name: str, step):
    step = _args.whole(name, step, optional=True)
    if step is not None and not 0 <= step < 2**30:
        raise _core.Error(f"{name} must be a whole number of a ProfilerStep#N, got {step!r}")
    return step


class _TracePath:
    """A path as given, or a torch.profiler.profile exported to a temporary Chrome trace (removed on exit)."""

    def __init__(self, source, what: str):
        self._tmp = None
        if isinstance(source, (str, _os.PathLike)):
            self.path = _os.fspath(source)
        elif hasattr(source, "export_chrome_trace"):
            fd, self._tmp = _tempfile.mkstemp(suffix=".pt.trace.json", prefix="attnprof_")
            _os.close(fd)
            try:
                source.export_chrome_trace(self._tmp)
            except Exception as e:
                self.close()
                raise _core.Error(f"{what}: the profile could not be exported ({type(e).__name__}: {e}); "
                                  "export_chrome_trace needs a profile that has stopped") from None
            self.path = self._tmp
        else:
            raise _core.Error(f"{what} must be a trace file's path or a torch.profiler.profile, "
                              f"got {type(source).__name__}")

    def close(self):
        if self._tmp:
            try:
                _os.unlink(self._tmp)
            except OSError:
                pass
            self._tmp = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def analyze(trace, *more, step: int | None = None, replay: bool = False, device: str | None = None,
            backends: str | list[str] | None = None, top: int = 10, ceiling_tflops: float | None = None) -> Analysis:
    """`attnprof analyze TRACE [TRACE...]` as a call. Each trace is a path (Chrome JSON, gzipped or
    not) or a torch.profiler.profile that has stopped. replay=True runs each distinct attention problem
    through attnprof's backends here (device= where, backends= which: one name or a list), as --replay does.
    top is the rows per table, 1 to 100000.
    ceiling_tflops= is --ceiling-tflops: the trace's device's matmul ceiling, for each attention
    call's share of it (default: ATTNPROF_CEILING_TFLOPS, else none)."""
    paths = [_TracePath(t, "trace") for t in (trace, *more)]
    try:
        json_text, text = _core.analyze([p.path for p in paths], step=_step("step", step),
                                        replay=_args.flag("replay", replay),
                                        device=_args.text("device", device, optional=True),
                                        backends=_args.names("backends", backends), top=_args.whole("top", top),
                                        ceiling_tflops=_args.real("ceiling_tflops", ceiling_tflops))
    finally:
        for p in paths:
            p.close()
    return Analysis(json_text, text)


def diff(a, b, *, a_step: int | None = None, b_step: int | None = None, top: int = 15) -> Diff:
    """`attnprof diff A B` as a call: a and b are paths or stopped torch.profiler.profile objects
    (the same path twice with two steps compares two steps of one trace)."""
    with _TracePath(a, "a") as pa, _TracePath(b, "b") as pb:
        json_text, text = _core.diff(pa.path, pb.path, a_step=_step("a_step", a_step), b_step=_step("b_step", b_step),
                                     top=_args.whole("top", top))
    return Diff(json_text, text)
