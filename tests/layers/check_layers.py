#!/usr/bin/env python3
"""The layering check: fails when a source file includes a header of a layer
above its own (or of a sibling it may not see), when a public header includes a
third-party header, and when a front end (the CLI, the Python module) includes
anything but the public API.

The layers, lowest first, and what each may include besides itself. This table
is the architecture; the top CMakeLists.txt links the libraries the same way.
A new public header or source folder must be placed here, or the check fails.
"""
import argparse
import pathlib
import re
import sys

# layer -> layers it may include (its own always allowed).
ALLOWED = {
    "core": set(),
    "profiler": {"core"},
    "cupti": {"core", "profiler"},
    # The run record: what a run or a trace step leaves (trace, metrics,
    # findings). Below analysis, which reads it, and dispatch, which fills it.
    "record": {"core", "profiler"},
    # Backends implement the core's Backend and the profiler's DeviceRuntime;
    # they never see the record, the analysis or anything above.
    "backends": {"core", "profiler", "cupti"},
    # Analysis reads records and traces; it sees no backend, no dispatch, no report.
    "analysis": {"core", "profiler", "record"},
    # Zigzag sharding and the log-sum-exp merge: the ring's arithmetic, read
    # by its driver (parallel) and by the ring itself.
    "sharding": {"core"},
    # The GPU half's ring attention over NCCL, built into the CUDA plugin.
    "ring": {"core", "profiler", "cupti", "backends", "sharding"},
    # The CUDA plugin's entry point: the one file that assembles the GPU half
    # (the CUDA backends, the collectors, the ring) into libattnprof_cuda.so.
    "plugin": {"core", "profiler", "cupti", "backends", "ring"},
    "dispatch": {"core", "profiler", "cupti", "record", "backends", "analysis"},
    "parallel": {"core", "profiler", "cupti", "record", "backends", "analysis", "dispatch", "sharding"},
    "report": {"core", "profiler", "cupti", "record", "backends", "analysis", "dispatch", "sharding", "parallel"},
    # Front ends: the public API only (checked separately below).
    "cli": set(),
    "python": set(),
}

# Public headers (include/attnprof/) by layer.
PUBLIC = {
    "core": ["error.h", "dtype.h", "tensor.h", "mask.h", "problem.h", "problem_spec.h", "reference.h", "backend.h",
             "aliasing.h", "limits.h", "mask_tensor.h", "varlen.h"],
    "profiler": ["activity.h", "profiler.h", "key_averages.h", "trace_io.h", "device_runtime.h", "occupancy.h"],
    "record": ["findings.h", "record.h"],
    "analysis": ["trace_reader.h", "analyze.h"],
    "dispatch": ["runner.h"],
    "parallel": ["parallel.h"],
    "report": ["report.h", "html.h", "replay.h"],
}

# Source folders (under src/) by layer, the most specific prefix first.
FOLDERS = [
    ("profiler/cupti/", "cupti"),
    ("backends/cuda/plugin.cpp", "plugin"),
    ("parallel/cuda/", "ring"),
    ("parallel/merge.", "sharding"),
    ("parallel/sharding.", "sharding"),
    ("core/", "core"),
    ("profiler/", "profiler"),
    ("record/", "record"),
    ("backends/", "backends"),
    ("analysis/", "analysis"),
    ("dispatch/", "dispatch"),
    ("parallel/", "parallel"),
    ("report/", "report"),
    ("cli/", "cli"),
    ("python/", "python"),
]
FRONT_ENDS = {"cli", "python"}
SOURCE_SUFFIXES = {".h", ".hpp", ".cuh", ".cpp", ".cu"}
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)
STD_HEADER = re.compile(r"^[a-z_0-9]+$")  # <vector>, <cstdint>: no directory, no suffix


def public_layer(name, errors, where):
    for layer, headers in PUBLIC.items():
        if name in headers:
            return layer
    errors.append(f"{where}: attnprof/{name} is in no layer: add it to PUBLIC in {pathlib.Path(__file__).name}")
    return None


def folder_layer(rel):
    for prefix, layer in FOLDERS:
        if rel.startswith(prefix):
            return layer
    return None


def check(root):
    errors = []
    include_dir = root / "include" / "attnprof"
    src = root / "src"
    files = []
    for p in sorted(include_dir.glob("*.h")):
        files.append((p, public_layer(p.name, errors, p.relative_to(root)), True))
    for p in sorted(src.rglob("*")):
        if p.suffix not in SOURCE_SUFFIXES:
            continue
        rel = p.relative_to(src).as_posix()
        layer = folder_layer(rel)
        if layer is None:
            errors.append(f"{p.relative_to(root)}: src/{rel.split('/')[0]}/ is in no layer: add it to FOLDERS")
            continue
        files.append((p, layer, False))

    for path, layer, public in files:
        if layer is None:
            continue
        where = path.relative_to(root)
        for kind, target in INCLUDE.findall(path.read_text(encoding="utf-8", errors="replace")):
            if kind == "<":
                if public and not STD_HEADER.match(target):
                    errors.append(f"{where}: a public header includes the third-party <{target}>")
                continue
            if target.startswith("attnprof/"):
                to = public_layer(target[len("attnprof/"):], errors, where)
            elif public:
                errors.append(f'{where}: a public header includes the internal "{target}"')
                continue
            elif layer in FRONT_ENDS and not target.startswith(layer + "/"):
                errors.append(f'{where}: the {layer} front end includes the internal "{target}" (public API only)')
                continue
            else:
                to = folder_layer(target)
                if to is None:
                    errors.append(f'{where}: "{target}" is in no layer')
                    continue
            if to is None or to == layer or to in ALLOWED[layer] or layer in FRONT_ENDS:
                continue
            errors.append(f'{where} ({layer}) includes "{target}" ({to}): {layer} may include only '
                          + (", ".join(sorted(ALLOWED[layer])) or "itself"))
    return errors


def self_test():
    """The check on a small tree with one break of each kind: each must be found."""
    import tempfile

    breaks = {
        "src/analysis/rules.cpp": '#include "attnprof/runner.h"\n',  # analysis reaching up into dispatch
        "src/analysis/limits.cpp": '#include "backends/cuda/fused_params.h"\n',  # into a backend
        "src/backends/cpu/flash.cpp": '#include "analysis/metrics.h"\n',  # a backend into analysis
        "src/cli/commands.cpp": '#include "report/json.h"\n',  # a front end into internals
        "include/attnprof/problem.h": "#include <nlohmann/json.hpp>\n",  # third party in the API
        "include/attnprof/record.h": '#include "attnprof/report.h"\n',  # a public header reaching up
    }
    fine = {
        "src/dispatch/runner.cpp": '#include "analysis/metrics.h"\n#include "backends/cpu/cpu_backends.h"\n',
        "src/cli/main.cpp": '#include "attnprof/report.h"\n#include "cli/args.h"\n#include <vector>\n',
        "include/attnprof/runner.h": '#include "attnprof/record.h"\n#include <string>\n',
    }
    with tempfile.TemporaryDirectory() as d:
        root = pathlib.Path(d)
        for rel, text in {**breaks, **fine}.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        for h in ("report.h", "findings.h"):
            (root / "include/attnprof" / h).write_text("")
        errors = check(root)
    missed = [rel for rel in breaks if not any(e.startswith(rel) for e in errors)]
    wrong = [e for e in errors if not any(e.startswith(rel) for rel in breaks)]
    for rel in missed:
        print(f"self-test: the break in {rel} was not found")
    for e in wrong:
        print(f"self-test: a sound include was refused: {e}")
    return not missed and not wrong


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=pathlib.Path, default=pathlib.Path(__file__).resolve().parents[2])
    args = ap.parse_args()
    if not self_test():
        return 1
    errors = check(args.root)
    for e in errors:
        print(e)
    if errors:
        print(f"layering: {len(errors)} include(s) break the layers")
        return 1
    print("layering: every include respects the layers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
