#!/usr/bin/env python3
"""The layering check: fails when a source file includes a header of a layer
above its own (or of a sibling it may not see), when a public header includes a
third-party header, and when a front end (the CLI, the Python module) includes
anything but the public API.

The layers, what each may include besides itself, its source folders and its
public headers are the table in docs/architecture.md (between the layers:begin
and layers:end markers): the architecture as written is the architecture as
checked. A new public header or source folder must be placed there, or the
check fails.
"""
import argparse
import pathlib
import re
import sys

TABLE_DOC = pathlib.Path("docs") / "architecture.md"
BEGIN, END = "<!-- layers:begin", "<!-- layers:end -->"
PUBLIC_API_ONLY = "public API only"
CODE = re.compile(r"`([^`]+)`")


class TableError(Exception):
    pass


def read_table(text, where):
    """The layer table of the architecture page: ALLOWED (layer -> layers it may
    include), PUBLIC (layer -> public headers), FOLDERS ((prefix, layer), longest
    prefix first) and FRONT_ENDS (the layers that may include the public API only)."""
    if BEGIN not in text or END not in text:
        raise TableError(f"{where}: no layer table (the {BEGIN} ... {END} markers)")
    rows = [line.strip() for line in text.split(BEGIN, 1)[1].split(END, 1)[0].splitlines()[1:]]
    rows = [r for r in rows if r.startswith("|")]
    if len(rows) < 3 or [c.strip() for c in rows[0].strip("|").split("|")][:4] != [
            "layer", "may include", "sources", "public headers"]:
        raise TableError(f"{where}: the layer table's header must start | layer | may include | sources | public headers |")
    allowed, public, folders, front_ends = {}, {}, [], set()
    for row in rows[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        if len(cells) < 4 or not cells[0]:
            raise TableError(f"{where}: a layer row needs a layer, what it may include, sources and headers: {row}")
        layer, may, sources, headers = cells[:4]
        if layer in allowed:
            raise TableError(f"{where}: the layer {layer} has two rows")
        if may == PUBLIC_API_ONLY:
            allowed[layer] = set()
            front_ends.add(layer)
        else:
            allowed[layer] = set() if may == "-" else {m.strip() for m in may.split(",")}
        folders += [(prefix, layer) for prefix in CODE.findall(sources)]
        if CODE.findall(headers):
            public[layer] = CODE.findall(headers)
    for layer, may in allowed.items():
        if may - allowed.keys():
            raise TableError(f"{where}: {layer} may include {', '.join(sorted(may - allowed.keys()))}, "
                             "which is no layer of the table")
    folders.sort(key=lambda f: len(f[0]), reverse=True)
    return allowed, public, folders, front_ends


ALLOWED, PUBLIC, FOLDERS, FRONT_ENDS = {}, {}, [], set()


def load_table(root):
    global ALLOWED, PUBLIC, FOLDERS, FRONT_ENDS
    path = root / TABLE_DOC
    ALLOWED, PUBLIC, FOLDERS, FRONT_ENDS = read_table(path.read_text(encoding="utf-8"), path)


SOURCE_SUFFIXES = {".h", ".hpp", ".cuh", ".cpp", ".cu"}
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)
STD_HEADER = re.compile(r"^[a-z_0-9]+$")  # <vector>, <cstdint>: no directory, no suffix


def public_layer(name, errors, where):
    for layer, headers in PUBLIC.items():
        if name in headers:
            return layer
    errors.append(f"{where}: attnprof/{name} is in no layer: add it to the table in {TABLE_DOC}")
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
            errors.append(f"{p.relative_to(root)}: src/{rel.split('/')[0]}/ is in no layer: add it to the table in {TABLE_DOC}")
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
        "src/analysis/rules.cpp": '#include "attnprof/runner.h"\n',  # analysis reaching up into the runner
        "src/analysis/limits.cpp": '#include "backends/cuda/fused_params.h"\n',  # into a backend
        "src/backends/cpu/flash.cpp": '#include "analysis/metrics.h"\n',  # a backend into analysis
        "src/cli/commands.cpp": '#include "report/json.h"\n',  # a front end into internals
        "include/attnprof/problem.h": "#include <nlohmann/json.hpp>\n",  # third party in the API
        "include/attnprof/record.h": '#include "attnprof/report.h"\n',  # a public header reaching up
    }
    fine = {
        "src/runner/runner.cpp": '#include "analysis/metrics.h"\n#include "backends/cpu/cpu_backends.h"\n',
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


def table_self_test():
    """The table reader on tables with one fault each: each must be refused."""
    good = ("<!-- layers:begin -->\n| layer | may include | sources | public headers | owns |\n| --- | --- | --- | --- | --- |\n"
            "| core | - | `core/` | `error.h` | x |\n| cli | public API only | `cli/` | | x |\n<!-- layers:end -->\n")
    bad = {
        "no markers": good.replace("<!-- layers:begin -->", ""),
        "a wrong header": good.replace("| may include |", "| uses |"),
        "an unknown layer": good.replace("| core | - |", "| core | profiler |"),
        "two rows of one layer": good.replace("| cli | public API only |", "| core | - |"),
    }
    ok = True
    allowed, public, folders, front_ends = read_table(good, "good")
    if allowed != {"core": set(), "cli": set()} or public != {"core": ["error.h"]} or front_ends != {"cli"} \
            or sorted(folders) != [("cli/", "cli"), ("core/", "core")]:
        print(f"self-test: the table was misread: {allowed} {public} {folders} {front_ends}")
        ok = False
    for what, text in bad.items():
        try:
            read_table(text, what)
            print(f"self-test: a table with {what} was read")
            ok = False
        except TableError:
            pass
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=pathlib.Path, default=pathlib.Path(__file__).resolve().parents[2])
    args = ap.parse_args()
    try:
        load_table(args.root)
    except (OSError, TableError) as e:
        print(f"layering: {e}")
        return 1
    if not self_test() or not table_self_test():
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
