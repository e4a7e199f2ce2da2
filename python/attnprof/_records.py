"""Typed views of what the C++ pipeline returns: the --json documents as attributes.

Nothing is computed here: every field is the library's JSON (the DESIGN.md
schema), every table is the library's own text.
"""

from __future__ import annotations

import json as _json


class Record:
    """A JSON object read through attributes; nested objects are Records too, lists stay lists."""

    __slots__ = ("_data",)

    def __init__(self, data: dict):
        object.__setattr__(self, "_data", data)

    def __getattr__(self, name):
        try:
            return _wrap(self._data[name])
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no field '{name}'; fields: {', '.join(self._data)}") from None

    def __getitem__(self, name):
        return self.__getattr__(name)

    def __dir__(self):
        return list(self._data) + list(super().__dir__())

    def __eq__(self, other):
        return isinstance(other, Record) and self._data == other._data

    def fields(self) -> list[str]:
        return list(self._data)

    def to_dict(self) -> dict:
        """The JSON object itself (as --json writes it)."""
        return self._data

    def __repr__(self):
        return f"{type(self).__name__}({_json.dumps(self._data)})"


def _wrap(value):
    if isinstance(value, dict):
        return Record(value)
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    return value


class Finding(Record):
    """One finding: rule (its id in the rule table), severity (info, warning, error), text, evidence, figures."""

    __slots__ = ()

    def __repr__(self):
        return f"Finding({self.rule}, {self.severity}: {self.text})"


class Result(Record):
    """One backend's run: the --json result fields (kernels_per_forward, host_time_us, rel_error, accepted ...),
    findings as Finding records, its key-averages table, and the paths of the files written for it."""

    __slots__ = ("findings", "table", "trace_path", "table_path", "summary_path")

    def __init__(self, data: dict, table: str, paths: tuple[str, str, str]):
        super().__init__(data)
        object.__setattr__(self, "findings", [Finding(f) for f in data.get("findings", [])])
        object.__setattr__(self, "table", table)
        for name, path in zip(("trace_path", "table_path", "summary_path"), paths):
            object.__setattr__(self, name, path or None)

    def __repr__(self):
        state = "ran" if self.table else ("failed" if self.failed else "not run")
        return f"Result({self.backend}, {state}: {self.reason})"


class Report:
    """What compare and profile return: device, problem, results (one per backend), the --json
    document (.json), and a repr that is the at-a-glance table the CLI prints."""

    def __init__(self, rep, command: str):
        self._rep = rep
        self.command = command
        self.json = _json.loads(rep.json())
        self.device = Record(self.json["device"])
        self.problem = Record(self.json["problem"])
        self.device_description = rep.device_description
        self.collector_note = rep.collector_note or None
        self.results = [Result(r, t, o) for r, t, o in zip(self.json["results"], rep.tables, rep.outputs)]

    @property
    def accepted(self) -> bool:
        """Every backend that ran is within tolerance against the float64 reference."""
        return self._rep.accepted()

    def __getitem__(self, backend: str) -> Result:
        for r in self.results:
            if r.backend == backend:
                return r
        raise KeyError(f"no result for backend '{backend}': {', '.join(r.backend for r in self.results)}")

    def table(self) -> str:
        """The table at a glance (report::compare_table)."""
        return self._rep.compare_table()

    def __str__(self):
        header = f"{self.command}: {self._rep.problem_description}\ndevice: {self.device_description}\n\n"
        note = f"\nnote: {self.collector_note}\n" if self.collector_note else ""
        return header + self.table() + note

    __repr__ = __str__


class Explanation:
    """What explain returns: results (backend, eligible, reason per backend), auto (backend, reason or None),
    cuda_build (which CUDA backends this build has: "CPU only ..." for a wheel built without a CUDA toolkit),
    the --json document (.json), and a repr that is the CLI's table."""

    def __init__(self, json_text: str, table: str, device_description: str, auto_error: str):
        self.json = _json.loads(json_text)
        self.device = Record(self.json["device"])
        self.problem = Record(self.json["problem"])
        self.results = [Record(r) for r in self.json["results"]]
        self.auto = Record(self.json["auto"]) if self.json.get("auto") else None
        self.auto_error = auto_error or None
        self.cuda_build = self.json["cuda_build"]
        self.device_description = device_description
        self._table = table

    def eligible(self) -> list[str]:
        return [r.backend for r in self.results if r.eligible]

    def table(self) -> str:
        return self._table

    def __str__(self):
        auto = f"auto: {self.auto_error}\n" if self.auto_error else ""
        return f"explain on {self.problem.device}\ndevice: {self.device_description}\n\n{auto}{self._table}"

    __repr__ = __str__
