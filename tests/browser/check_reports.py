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
    the pixels differ from the page background;
  - its charts read at a glance, as drawn (a probe script appended to a copy
    of the page reads each chart's Plotly layout and the bounding boxes of
    what it drew): time per forward, peak memory and relative error on log
    axes, every bar rising from the plot area's floor (none in mid-air) and
    tall enough to see, with its value as a label; errors that are 0, NaN or
    not checked labelled as such; the roofline's names, one per point, inside
    the chart and overlapping neither each other nor a marker.
Chromium missing is a failure, not a skip: scripts/setup.sh installs it.
"""
import argparse
import html.parser
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
    if data.get("from_traces"):
        # analyze and diff: no bars or roofline of runs; per step its timeline, and only the panels
        # its trace holds what for: attention calls with FLOPs, memory events, kernels.
        n = sum(1 for r in ran if r["timeline"]["events"])
        for r in ran:
            x = r.get("extra") or {}
            calls = (x.get("attention") or {}).get("calls", [])
            n += any(c.get("intensity") and c.get("tflops") for c in calls)
            n += bool((x.get("memory") or {}).get("t"))
            n += bool(x.get("kernels"))
        n += 1 if any(d["unit"] == "us" and (d["a"] is not None or d["b"] is not None) for d in data["diff"]) else 0
        return n
    n = 4 if ran else 0  # time, counts, memory, error
    n += 1 if any(r.get("roofline") for r in ran) else 0
    n += sum(1 for r in ran if r["timeline"]["events"])
    n += 1 if any(d["unit"] == "us" and (d["a"] is not None or d["b"] is not None) for d in data["diff"]) else 0
    return n


# Appended to a copy of the page: once the page says it is done, writes what
# its charts drew into <body data-probe> for --dump-dom to carry out. Boxes are
# [left, top, right, bottom] in CSS pixels.
PROBE = r"""
<script>
(function () {
  function box(e) { var r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; }
  function all(root, sel) { return Array.prototype.slice.call(root.querySelectorAll(sel)); }
  function collect() {
    var charts = all(document, '.js-plotly-plot').map(function (div) {
      var fl = div._fullLayout;
      return {
        chart: div.getAttribute('data-chart'),
        xtype: fl.xaxis.type, ytype: fl.yaxis.type,
        area: box(div.querySelector('.draglayer .nsewdrag')),
        div: box(div),
        bars: all(div, '.barlayer .point').map(function (p) {
          var t = p.querySelector('text');
          return { box: box(p.querySelector('path')), text: t ? t.textContent : null };
        }),
        markers: all(div, '.scatterlayer .point').map(box),
        labels: all(div, '.annotation-text-g').map(function (g) {
          return { box: box(g.querySelector('rect') || g), text: g.textContent };
        })
      };
    });
    document.body.setAttribute('data-probe', JSON.stringify(charts));
  }
  (function wait() {
    if (document.body.getAttribute('data-report-status') === 'loading') setTimeout(wait, 50);
    else collect();
  })();
})();
</script>
"""

LOG_CHARTS = ("time", "memory", "error")
MIN_BAR_PX = 4  # the shortest bar a reader still sees (stubs for 0, NaN, n/a are taller)


def intersects(a, b):
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def chart_problems(data, charts):
    """What the drawn charts get wrong, against what the data calls for."""
    ran = [r for r in data["runs"] if r["ran"]]
    problems = []
    by_name = {c["chart"]: c for c in charts if c["chart"]}
    if data.get("from_traces"):
        return problems + trace_chart_problems(data, charts, by_name)
    for name in LOG_CHARTS if ran else ():
        c = by_name.get(name)
        if c is None:
            problems.append(f"no {name} chart")
            continue
        if c["ytype"] != "log":
            problems.append(f"{name} chart: y axis is {c['ytype']!r}, not log")
        floor = c["area"][3]
        for b in c["bars"]:
            left, top, right, bottom = b["box"]
            if abs(bottom - floor) > 1.5:
                problems.append(f"{name} chart: a bar ends {floor - bottom:.1f} px above the axis floor (mid-air)")
            if bottom - top < MIN_BAR_PX:
                problems.append(f"{name} chart: a bar {bottom - top:.1f} px tall (flattened)")
            if not b["text"]:
                problems.append(f"{name} chart: a bar without its value as a label")
        want = len(ran) * (2 if name == "time" else 1)
        if len(c["bars"]) != want:
            problems.append(f"{name} chart: {len(c['bars'])} bars, want one per run and series ({want})")
    if "error" in by_name:
        texts = [b["text"] for b in by_name["error"]["bars"]]
        for r, text in zip(ran, texts):
            want = {"zero": "0", "nan": "NaN", "unchecked": "not checked"}.get(r["error_state"])
            if want is not None and text != want:
                problems.append(f"error chart: {r['label']}'s error ({r['error_state']}) is labelled {text!r}, not {want!r}")
    points = [r for r in ran if r.get("roofline")]
    if points:
        c = by_name.get("roofline")
        if c is None:
            return problems + ["no roofline chart"]
        labels = c["labels"]
        if sorted(lab["text"] for lab in labels) != sorted(r["label"] for r in points):
            problems.append(f"roofline: names {sorted(lab['text'] for lab in labels)}, "
                            f"want one per point {sorted(r['label'] for r in points)}")
        for i, a in enumerate(labels):
            for b in labels[i + 1:]:
                if intersects(a["box"], b["box"]):
                    problems.append(f"roofline: names {a['text']!r} and {b['text']!r} overlap")
            for m in c["markers"]:
                if intersects(a["box"], m):
                    problems.append(f"roofline: name {a['text']!r} covers a marker")
            if not (c["div"][0] <= a["box"][0] and a["box"][2] <= c["div"][2] and
                    c["div"][1] <= a["box"][1] and a["box"][3] <= c["div"][3]):
                problems.append(f"roofline: name {a['text']!r} at {a['box']} is outside its chart {c['div']}")
    return problems


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


def body_attributes(dom):
    """<body>'s attributes, unescaped, from Chromium's --dump-dom; None with no body.
    (A parser, not a pattern: attribute values may hold '>' unescaped.)"""

    class Body(html.parser.HTMLParser):
        attrs = None

        def handle_starttag(self, tag, attrs):
            if tag == "body" and self.attrs is None:
                self.attrs = {k: v or "" for k, v in attrs}

    parser = Body(convert_charrefs=True)
    parser.feed(dom)
    return parser.attrs


def trace_chart_problems(data, charts, by_name):
    """A report of traces from elsewhere: times from the trace's start, no panel without data,
    short kernel names with the whole one kept."""
    problems = []
    for r in (r for r in data["runs"] if r["ran"]):
        tl = r["timeline"]
        if tl["events"] and not (0 <= tl["from"] < 1e9 and tl["to"] < 1e10):
            problems.append(f"{r['label']}: timeline from {tl['from']} to {tl['to']} us: not from the trace's start")
        for e in tl["events"]:
            if e["c"] == "kernel" and (len(e["n"]) > 72 or not e.get("f")):
                problems.append(f"{r['label']}: kernel name {e['n'][:80]!r} not shortened, or its whole name lost")
                break
        x = r.get("extra") or {}
        for k in x.get("kernels", []):
            if len(k["short"]) > 72 or not k["us"]:
                problems.append(f"{r['label']}: kernel {k['short'][:80]!r}: no short name or no durations")
    for c in charts:
        if c["chart"] in ("time", "counts", "error", "roofline", "memory"):
            problems.append(f"a {c['chart']} chart on a report of traces")
    if any((r.get("extra") or {}).get("replay") for r in data["runs"]) and not any(
            (r.get("extra") or {}).get("replay", {}).get("problems") for r in data["runs"]):
        problems.append("a replay with no problems listed")
    return problems


def check(browser, html_path, work):
    name = os.path.basename(html_path)
    problems = []
    data = embedded_data(html_path)
    probed = os.path.join(work, name.replace(".html", ".probe.html"))
    with open(html_path, encoding="utf-8") as f:
        page = f.read()
    with open(probed, "w", encoding="utf-8") as f:
        f.write(page.replace("</body>", PROBE + "</body>"))
    url = "file://" + os.path.abspath(html_path) + "#selftest"
    with tempfile.TemporaryDirectory(dir=work) as profile:
        dom = chromium(browser, profile, ["--dump-dom", "--window-size=1400,2200",
                                          "file://" + os.path.abspath(probed) + "#selftest"])
    attrs = body_attributes(dom.stdout)
    if dom.returncode != 0 or attrs is None:
        return [f"{name}: chromium exited {dom.returncode} with no page:\n{dom.stderr[-2000:]}"]
    status = attrs.get("data-report-status")
    if status != "ok":
        errors = attrs.get("data-report-errors", "")
        problems.append(f"{name}: page status {status!r}; errors: {errors}")
    plots = int(attrs.get("data-report-plots", "0"))
    want = expected_plots(data)
    if plots != want:
        problems.append(f"{name}: drew {plots} charts, its data calls for {want}")
    problems += [f"{name}: {line}" for line in console_problems(dom.stderr)]
    if "data-probe" not in attrs:
        problems.append(f"{name}: the probe wrote nothing")
    else:
        charts = json.loads(attrs["data-probe"])
        problems += [f"{name}: {p}" for p in chart_problems(data, charts)]

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
    # A trace we did not make: transformers' Llama training step (tests/fixtures/models/), replayed.
    model = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "models",
                         "cpu_sdpa_train.pt.trace.json.gz")
    run([a.attnprof, "analyze", model, "--replay", "--backends", "flash,math", "--quiet",
         "--html", os.path.join(a.out, "model_analyze.html")])

    names = ("compare.html", "profile.html", "handmade.html", "analyze.html", "diff.html", "model_analyze.html")
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
