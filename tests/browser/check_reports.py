#!/usr/bin/env python3
"""Opens every kind of HTML report attnprof writes in headless Chromium.

Reports: compare with several backends and profile with one (both on the CPU,
at a small shape), and one built from a hand-made RunResult list as analyze
and diff build theirs (tests/tools/report_fixtures.cpp).

A report passes when, opened from disk with #selftest (the page then clicks
every cited event once):
  - the page says it finished: <body data-report-status="ok"> in the DOM that
    Chromium dumps; the page sets "error" and lists the messages when any
    script error, unhandled rejection or console.error happened, from before
    Plotly.js loads to the last chart;
  - it drew the charts its data calls for (data-report-plots);
  - Chromium's own log has no console error and no uncaught exception;
  - its screenshot is not blank: many distinct colours, and a good share of
    the pixels differ from the page background.
Chromium missing is a failure, not a skip: scripts/setup.sh installs it.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
MIN_COLOURS = 64
MIN_INK = 0.03  # fraction of pixels that are not the background


def find_chromium():
    env = os.environ.get("CHROMIUM")
    if env:
        return env
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def chromium(browser, profile_dir, args, timeout=120):
    cmd = [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--no-first-run", "--no-default-browser-check", "--disable-extensions",
           "--user-data-dir=" + profile_dir, "--enable-logging=stderr", "--v=0",
           "--virtual-time-budget=20000"] + args
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def embedded_data(html_path):
    with open(html_path, encoding="utf-8") as f:
        text = f.read()
    m = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', text, re.S)
    if not m:
        raise AssertionError("no report-data element")
    return json.loads(m.group(1))


def expected_plots(data):
    """The charts the page script draws for this data (html_page.h)."""
    ran = [r for r in data["runs"] if r["ran"]]
    n = 4 if ran else 0  # time, counts, memory, error
    n += 1 if any(r.get("roofline") for r in ran) else 0
    n += sum(1 for r in ran if r["timeline"]["events"])
    n += 1 if any(d["unit"] == "us" and (d["a"] is not None or d["b"] is not None) for d in data["diff"]) else 0
    return n


def console_problems(log):
    """Chromium logs every console message at INFO ("INFO:CONSOLE:1] "msg", source: ...")
    whatever its level, so console.error is caught by the page itself
    (data-report-status); here: uncaught exceptions and error-looking messages."""
    bad = []
    for line in log.splitlines():
        if ":CONSOLE" in line and re.search(r"Uncaught|Error|error", line):
            bad.append(line.strip())
    return bad


def screenshot_problems(png):
    from PIL import Image  # Pillow, installed by scripts/setup.sh

    with Image.open(png) as im:
        rgb = im.convert("RGB")
        colours = rgb.getcolors(maxcolors=1 << 24) or []
    total = sum(c for c, _ in colours)
    if total == 0:
        return ["empty screenshot"]
    background = max(colours)[0]
    ink = 1.0 - background / total
    problems = []
    if len(colours) < MIN_COLOURS:
        problems.append(f"screenshot looks blank: {len(colours)} distinct colours (want >= {MIN_COLOURS})")
    if ink < MIN_INK:
        problems.append(f"screenshot looks blank: {ink:.1%} of pixels differ from the background (want >= {MIN_INK:.0%})")
    return problems


def check(browser, html_path, work):
    name = os.path.basename(html_path)
    problems = []
    data = embedded_data(html_path)
    url = "file://" + os.path.abspath(html_path) + "#selftest"
    with tempfile.TemporaryDirectory(dir=work) as profile:
        dom = chromium(browser, profile, ["--dump-dom", url])
    body = re.search(r"<body([^>]*)>", dom.stdout)
    if dom.returncode != 0 or not body:
        return [f"{name}: chromium exited {dom.returncode} with no page:\n{dom.stderr[-2000:]}"]
    attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', body.group(1)))
    status = attrs.get("data-report-status")
    if status != "ok":
        errors = attrs.get("data-report-errors", "").replace("&quot;", '"')
        problems.append(f"{name}: page status {status!r}; errors: {errors}")
    plots = int(attrs.get("data-report-plots", "0"))
    want = expected_plots(data)
    if plots != want:
        problems.append(f"{name}: drew {plots} charts, its data calls for {want}")
    problems += [f"{name}: {line}" for line in console_problems(dom.stderr)]

    # The screenshot of the page as a reader first sees it (no #selftest, which scrolls).
    png = os.path.join(work, name.replace(".html", ".png"))
    with tempfile.TemporaryDirectory(dir=work) as profile:
        shot = chromium(browser, profile, ["--screenshot=" + png, "--window-size=1400,2200", "--hide-scrollbars",
                                           url.split("#")[0]])
    if shot.returncode != 0 or not os.path.exists(png):
        problems.append(f"{name}: no screenshot (chromium exited {shot.returncode}):\n{shot.stderr[-2000:]}")
    else:
        problems += [f"{name}: {p}" for p in screenshot_problems(png)]
        problems += [f"{name} (screenshot run): {line}" for line in console_problems(shot.stderr)]
    print(f"{'ok  ' if not problems else 'FAIL'} {name}: status {status}, {plots}/{want} charts, "
          f"{len(data['runs'])} runs, {os.path.getsize(html_path) / 1e6:.1f} MB")
    return problems


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"FAIL: {' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attnprof", required=True)
    ap.add_argument("--fixtures", required=True, help="the report_fixtures helper")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    browser = find_chromium()
    if not browser:
        print("FAIL: headless Chromium not found (looked for " + ", ".join(CHROMIUM_NAMES) +
              " and $CHROMIUM): run scripts/setup.sh, which installs Debian's chromium", file=sys.stderr)
        return 1
    shutil.rmtree(a.out, ignore_errors=True)
    os.makedirs(a.out)
    shape = ["--device", "cpu", "--batch", "1", "--heads", "2", "--seq", "128", "--head-dim", "32",
             "--warmup", "1", "--active", "2", "--quiet", "--trace-dir", os.path.join(a.out, "traces")]
    reports = {
        "compare.html": [a.attnprof, "compare"] + shape,
        "profile.html": [a.attnprof, "profile", "--backend", "naive"] + shape,
    }
    for name, cmd in reports.items():
        run(cmd + ["--html", os.path.join(a.out, name)])
    run([a.fixtures, "html", os.path.join(a.out, "handmade.html")])
    # analyze and diff over traces: a GPU-shaped one (4 profiler steps) and
    # two of the compare run's own CPU traces.
    gpu_trace = os.path.join(a.out, "gpu_trace.json")
    run([a.fixtures, "gpu-trace", gpu_trace])
    naive, inplace = (os.path.join(a.out, "traces", f"1_2_128_32_{b}.json") for b in ("naive", "naive_inplace"))
    run([a.attnprof, "analyze", gpu_trace, "--html", os.path.join(a.out, "analyze.html")])
    run([a.attnprof, "diff", naive, inplace, "--html", os.path.join(a.out, "diff.html")])

    names = ("compare.html", "profile.html", "handmade.html", "analyze.html", "diff.html")
    failed = 0
    for name in names:
        problems = check(browser, os.path.join(a.out, name), a.out)
        for p in problems:
            print("FAIL " + p, file=sys.stderr)
        failed += bool(problems)
    print(f"browser test: {len(names) - failed} of {len(names)} reports clean")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
