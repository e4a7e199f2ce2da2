#!/usr/bin/env python3
"""The documentation's links: fails when a relative link in README.md or in a
Markdown file under docs/ names a file (or a heading of a Markdown file) that
the repository does not hold, when it leaves the repository (../shared/...),
and when README.md links anywhere but inside the repository (a web address or
an absolute path), since README is the page a user who clones the project
reads first and everything it points to must come with the clone.
"""
import argparse
import pathlib
import re
import sys
import tempfile
import urllib.parse

# [text](target "title") and ![alt](target), with the target up to a space or
# the closing parenthesis; <target> in angle brackets; [label]: target.
INLINE = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(\S+)", re.M)
FENCE = re.compile(r"^\s{0,3}(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def prose_lines(text):
    """The lines outside fenced code blocks, as (number, line)."""
    inside = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            yield number, line


def anchors(path):
    """The anchors GitHub gives a Markdown file's headings: lower case, every
    character but letters, digits, spaces, hyphens and underscores dropped,
    spaces made hyphens; a repeated anchor takes -1, -2, ..."""
    seen = {}
    found = set()
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        m = HEADING.match(line)
        if not m:
            continue
        # A link in a heading keeps its text; code keeps its text without the backticks.
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(2))
        slug = "".join(c for c in text.lower() if c.isalnum() or c in " -_").replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def links(path):
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        line = INLINE_CODE.sub("", line)  # a link written inside code is an example, not a link
        for m in INLINE.finditer(line):
            yield number, m.group(1).strip("<>")
        for m in REFERENCE.finditer(line):
            yield number, m.group(1)


def check(root):
    root = root.resolve()
    files = [root / "README.md"] + sorted((root / "docs").rglob("*.md"))
    errors = []
    cache = {}
    for md in files:
        if not md.exists():
            errors.append(f"{md.relative_to(root)}: missing")
            continue
        is_readme = md == root / "README.md"
        for number, target in links(md):
            where = f"{md.relative_to(root)}:{number}"
            if SCHEME.match(target) or target.startswith("//"):
                if is_readme:
                    errors.append(f"{where}: README links outside the repository: {target}")
                continue
            if target.startswith("/"):
                errors.append(f"{where}: an absolute path is not inside the repository once cloned: {target}")
                continue
            rel, _, fragment = target.partition("#")
            dest = (md.parent / urllib.parse.unquote(rel)).resolve() if rel else md
            if not dest.is_relative_to(root):
                errors.append(f"{where}: {target} leaves the repository")
                continue
            if not dest.exists():
                errors.append(f"{where}: {target} does not exist ({dest.relative_to(root)})")
                continue
            if fragment and dest.suffix == ".md":
                if dest not in cache:
                    cache[dest] = anchors(dest)
                if fragment not in cache[dest]:
                    errors.append(f"{where}: {target}: {dest.relative_to(root)} has no heading #{fragment}")
    return errors


def self_test():
    """The check on a small tree with one break of each kind: each must be found."""
    with tempfile.TemporaryDirectory() as d:
        root = pathlib.Path(d) / "repo"
        (root / "docs/perf/runs").mkdir(parents=True)
        (root / "docs/perf/runs/a.txt").write_text("")
        (root / "docs/perf/forward.md").write_text("# Forward\n\n## Current figures: H200, 2026-12-04\n")
        (root / "README.md").write_text(
            "[spec](../shared/DESIGN.md) [web](https://example.com) [ok](docs/perf/forward.md)\n"
            "`[code](../nowhere.md)` [sec](docs/perf/forward.md#current-figures-h200-2026-12-04)\n"
            "```\n[fenced](../nowhere.md)\n```\n")
        (root / "docs/index.md").write_text(
            "[gone](perf/backward.md) [run](perf/runs/a.txt) [web](https://example.com)\n"
            "[bad anchor](perf/forward.md#history) [abs](/etc/passwd)\n[ref]: ../../outside.md\n"
            "[code in a heading](#a-codeb-heading)\n\n### A `code`b heading\n")
        errors = check(root)
    expected = ["README.md:1: ../shared/DESIGN.md leaves", "README.md:1: README links outside",
                "docs/index.md:1: perf/backward.md does not exist", "docs/index.md:2: perf/forward.md#history",
                "docs/index.md:2: an absolute path", "docs/index.md:3: ../../outside.md leaves"]
    missed = [e for e in expected if not any(x.startswith(e.split(": ")[0]) and e.split(": ")[1] in x
                                              for x in errors)]
    wrong = [x for x in errors if not any(x.startswith(e.split(": ")[0]) and e.split(": ")[1] in x
                                          for e in expected)]
    for e in missed:
        print(f"self-test: not found: {e}")
    for x in wrong:
        print(f"self-test: a sound link was refused: {x}")
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
        print(f"links: {len(errors)} link(s) do not resolve inside the repository")
        return 1
    print("links: every link in README.md and docs/ resolves inside the repository")
    return 0


if __name__ == "__main__":
    sys.exit(main())
