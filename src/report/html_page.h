// The HTML report's style and scripts (report/html.cpp puts them around the
// data). The page script is one function in two parts, written one after
// the other: kScript here (its state, helpers, the header, the summary
// table, the bars across runs) and kScriptPanels (html_page_panels.h: the
// roofline, the diff, each run's panels, the end of the drawing). It reads
// the embedded JSON (id "report-data") and builds every element with
// textContent, never innerHTML, so no name in a trace can inject markup; it
// draws with Plotly.js only (no WebGL, no network). When it is done it sets
// <body data-report-status> to "ok", or to "error" with the messages in
// data-report-errors: the browser test reads those. Opened with #selftest,
// it also clicks every cited event once.
#pragma once

namespace attnprof::html_page {

inline constexpr const char* kCss = R"css(
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0; color: #222; background: #fafafa; }
main { max-width: 1400px; margin: 0 auto; padding: 16px 24px 48px; }
h1 { font-size: 22px; margin: 8px 0 4px; }
h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
.sub { color: #555; margin: 2px 0; }
nav a { margin-right: 14px; }
table { border-collapse: collapse; background: #fff; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.grid { display: grid; grid-template-columns: repeat(2, minmax(0, 1fr)); gap: 12px; }
.plot { background: #fff; border: 1px solid #e3e3e3; }
.note { color: #666; font-size: 13px; margin: 4px 0; }
.finding { background: #fff; border-left: 4px solid #4c78a8; padding: 6px 10px; margin: 6px 0; }
.finding.warning { border-left-color: #f58518; }
.finding.error { border-left-color: #d62728; }
.sev { font-weight: 600; text-transform: uppercase; font-size: 11px; margin-right: 6px; }
.rule { font-family: ui-monospace, monospace; font-size: 12px; color: #555; margin-right: 6px; }
.evidence { margin: 4px 0 0 0; padding-left: 18px; font-size: 13px; }
.evidence a { cursor: pointer; }
pre { background: #fff; border: 1px solid #e3e3e3; padding: 8px; overflow-x: auto; font-size: 12px; }
.failed { color: #a33; }
#report-errors { background: #fee; border: 1px solid #d62728; padding: 8px; white-space: pre-wrap; }
)css";

// Runs before Plotly.js loads, so its load errors are recorded too.
inline constexpr const char* kErrorTrap = R"js(
(function () {
  var errors = [];
  window.__reportErrors = errors;
  window.__reportRecord = function (msg) {
    errors.push(String(msg));
    if (document.body) {
      document.body.setAttribute('data-report-status', 'error');
      document.body.setAttribute('data-report-errors', JSON.stringify(errors));
    }
  };
  window.addEventListener('error', function (e) {
    window.__reportRecord((e.message || 'error') + (e.filename ? ' at ' + e.filename + ':' + e.lineno : ''));
  });
  window.addEventListener('unhandledrejection', function (e) {
    var r = e.reason;
    window.__reportRecord('unhandled rejection: ' + (r && r.message ? r.message : r));
  });
  var consoleError = console.error;
  console.error = function () {
    window.__reportRecord(Array.prototype.join.call(arguments, ' '));
    return consoleError.apply(console, arguments);
  };
})();
)js";

// The page script's first part; html_page_panels.h's kScriptPanels follows it.
inline constexpr const char* kScript = R"js(
(function () {
  'use strict';
  var COLORS = {
    cpu_op: '#4c78a8', user_annotation: '#b8b8b8', cuda_runtime: '#f58518', cuda_driver: '#e45756',
    cuda_sync: '#bab0ac', kernel: '#54a24b', gpu_memcpy: '#d62728', gpu_memset: '#9467bd'
  };
  var CONFIG = { displaylogo: false, responsive: true };
  var pending = [];
  var timelines = {};  // run index -> its timeline div
  var evidenceLinks = [];

  function el(tag, attrs, children) {
    var e = document.createElement(tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (k) {
        if (k === 'text') e.textContent = attrs[k];
        else if (k === 'cls') e.className = attrs[k];
        else e.setAttribute(k, attrs[k]);
      });
    }
    (children || []).forEach(function (c) {
      if (c !== null && c !== undefined) e.appendChild(typeof c === 'string' ? document.createTextNode(c) : c);
    });
    return e;
  }
  function num(v) { return typeof v === 'number' && isFinite(v); }
  function fmtTime(us) {
    if (!num(us)) return '-';
    if (us >= 1e6) return (us / 1e6).toFixed(2) + ' s';
    if (us >= 1e3) return (us / 1e3).toFixed(3) + ' ms';
    return us.toFixed(1) + ' us';
  }
  function fmtBytes(b) {
    if (!num(b)) return '-';
    if (b >= 1073741824) return (b / 1073741824).toFixed(2) + ' GiB';
    if (b >= 1048576) return (b / 1048576).toFixed(1) + ' MiB';
    if (b >= 1024) return (b / 1024).toFixed(1) + ' KiB';
    return b.toFixed(0) + ' B';
  }
  function fmtNum(v, digits) { return num(v) ? v.toFixed(digits) : '-'; }
  function fmtFlops(v) { return num(v) ? (v < 1 ? v.toFixed(3) : v.toFixed(1)) : '-'; }
  // Plotly reads hover text as markup: escape what a C++ kernel name carries.
  function esc(s) { return String(s).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;'); }
  // Three significant figures, for bar labels.
  function sig(v) { return String(Number(v.toPrecision(3))); }
  function shortTime(us) {
    if (us >= 1e6) return sig(us / 1e6) + ' s';
    if (us >= 1e3) return sig(us / 1e3) + ' ms';
    return sig(us) + ' us';
  }
  function shortMiB(m) { return m >= 1024 ? sig(m / 1024) + ' GiB' : m >= 1 ? sig(m) + ' MiB' : sig(m * 1024) + ' KiB'; }
  var measure = document.createElement('canvas').getContext('2d');  // text widths in a chart's font
  // `after(div)`, when given, runs once the chart is drawn (it may need the
  // drawn axes' pixels); the page is done when every chart's is.
  function plot(div, traces, layout, after) {
    layout.paper_bgcolor = '#fff';
    layout.plot_bgcolor = '#fff';
    layout.font = { size: 12 };
    var drawn = Promise.resolve(Plotly.newPlot(div, traces, layout, CONFIG));
    pending.push(after ? drawn.then(function () { return after(div); }) : drawn);
  }
  function table(headers, rows) {
    var t = el('table');
    t.appendChild(el('tr', null, headers.map(function (h) { return el('th', { text: h }); })));
    rows.forEach(function (r) {
      t.appendChild(el('tr', null, r.map(function (c) {
        if (c && c.nodeType) return el('td', null, [c]);
        var isNum = typeof c === 'number';
        return el('td', { text: c === null || c === undefined ? '-' : String(c), cls: isNum ? 'num' : '' });
      })));
    });
    return t;
  }
  function section(id, title) {
    var s = el('section', { id: id });
    s.appendChild(el('h2', { text: title }));
    return s;
  }

  var data = JSON.parse(document.getElementById('report-data').textContent);
  if (typeof Plotly === 'undefined') throw new Error('Plotly.js did not load');
  var root = document.getElementById('report');
  var runs = data.runs;
  var ranRuns = runs.filter(function (r) { return r.ran; });
  var anyGpu = ranRuns.some(function (r) { return r.device_type === 'cuda'; });
  var countName = anyGpu ? 'kernels/fwd' : 'ops/fwd';
  function countOf(r) { return num(r.kernels_per_forward) ? r.kernels_per_forward : r.ops_per_forward; }
  function hostOf(r) { return num(r.host_time_unprofiled_us) ? r.host_time_unprofiled_us : r.host_time_us; }

  // ---- header -------------------------------------------------------------
  root.appendChild(el('h1', { text: data.title || 'attnprof report' }));
  if (data.subtitle) root.appendChild(el('p', { cls: 'sub', text: data.subtitle }));
  if (data.device) root.appendChild(el('p', { cls: 'sub', text: 'device: ' + data.device }));
  (data.notes || []).forEach(function (n) { root.appendChild(el('p', { cls: 'note', text: n })); });
  var nav = el('nav');
  var fromTraces = !!data.from_traces;
  (fromTraces ? [['summary', 'steps']] : [['summary', 'runs'], ['bars', 'bars'], ['roofline', 'roofline']]).forEach(function (p) {
    nav.appendChild(el('a', { href: '#' + p[0], text: p[1] }));
  });
  if (data.diff.length) nav.appendChild(el('a', { href: '#diff', text: 'diff' }));
  runs.forEach(function (r, i) { if (r.ran) nav.appendChild(el('a', { href: '#run-' + i, text: r.label })); });
  root.appendChild(nav);

  // ---- summary table ----------------------------------------------------------
  var summary = section('summary', fromTraces ? 'Steps' : 'Runs');
  // A trace from elsewhere: only the columns it holds (no error against
  // float64, no TFLOP/s of a problem it does not name; peak memory where it
  // recorded memory).
  var anyMemory = runs.some(function (r) { return r.extra && r.extra.memory && r.extra.memory.t.length; });
  if (fromTraces) summary.appendChild(table(
    ['step', anyGpu ? 'GPU time' : 'time', countName.replace('/fwd', ''), 'copies'].concat(anyMemory ? ['peak mem'] : []).concat(
      ['attention calls', 'attention share', 'findings']),
    runs.map(function (r) {
      var at = r.extra && r.extra.attention;
      var share = at && (num(at.forward_pct) || num(at.backward_pct)) ? ((at.forward_pct || 0) + (at.backward_pct || 0)).toFixed(1) + '%' : '-';
      return [r.label, fmtTime(r.device_time_us), countOf(r), r.copies_per_forward].concat(
        anyMemory ? [fmtBytes(r.peak_bytes)] : []).concat([at ? at.calls.length : 0, share, r.findings.length]);
    })));
  else summary.appendChild(table(
    ['run', anyGpu ? 'GPU time' : 'time', 'CPU/call', countName, 'copies/fwd', 'peak mem', 'TFLOP/s', '% ceiling',
     'rel error', 'occupancy', 'findings'],
    runs.map(function (r) {
      if (!r.ran) {
        return [r.label, el('span', { cls: 'failed', text: (r.failed ? 'failed: ' : 'did not run: ') + r.reason }),
                '', '', '', '', '', '', '', '', ''];
      }
      var err = r.error_state === 'nan' ? 'NaN (' + r.nan_count + ' elements)'
              : r.error_state === 'zero' ? '0' : num(r.rel_error) ? r.rel_error.toExponential(2) : '-';
      if (r.accepted === false) err += ' FAIL';
      return [r.label, fmtTime(r.device_time_us), fmtTime(hostOf(r)), countOf(r), r.copies_per_forward,
              fmtBytes(r.peak_bytes), fmtFlops(r.tflops), num(r.ceiling_pct) ? r.ceiling_pct.toFixed(1) + '%' : '-',
              err, num(r.occupancy_pct) ? r.occupancy_pct.toFixed(0) + '%' : '-', r.findings.length];
    })));
  root.appendChild(summary);

  // ---- bars across runs -------------------------------------------------------
  // (compare's and profile's: a trace's steps have no error against float64 to bar)
  if (!fromTraces) (function () {
  var bars = section('bars', 'Across runs');
  var grid = el('div', { cls: 'grid' });
  bars.appendChild(grid);
  root.appendChild(bars);
  var labels = ranRuns.map(function (r) { return r.label; });
  // Every cell is in the grid before the first chart is drawn: Plotly sizes
  // a chart by its cell's width when it draws it.
  var cells = [0, 1, 2, 3].map(function () { return grid.appendChild(el('div', { cls: 'plot' })); });
  // Narrow bars (many runs, two series): their value labels stand upright.
  function upright(nseries) { return labels.length * nseries > 8; }
  // Each bar's label inside the bar where it fits (the drawn bar's pixels
  // against the label's measured length), else just above it: a label above
  // a tall bar could sit on a line drawn over the bars (the tolerance).
  function labelsInsideWhereTheyFit(div) {
    var fl = div._fullLayout, yr = fl.yaxis.range, log = fl.yaxis.type === 'log';
    var at = function (v) { return (log ? Math.log10(v) : v) - yr[0]; };
    var bars = [], where = [];
    div._fullData.forEach(function (t, k) {
      if (t.type !== 'bar' || !t.text) return;
      measure.font = t.textfont.size + 'px ' + fl.font.family;
      bars.push(k);
      where.push(t.y.map(function (y, j) {
        var base = Array.isArray(t.base) ? t.base[j] : 0;
        if (!num(y)) return 'outside';
        var px = (at(base + y) - at(base)) / (yr[1] - yr[0]) * fl._size.h;
        var len = t.textangle === -90 ? measure.measureText(String(t.text[j])).width : t.textfont.size * 1.3;
        return px >= len + 8 ? 'inside' : 'outside';
      }));
    });
    return bars.length ? Plotly.restyle(div, { textposition: where }, bars) : null;
  }
  function barPlot(chart, title, traces, yaxis) {
    var div = cells.shift();
    div.setAttribute('data-chart', chart);
    // The legend above the plot, right, where it covers no tick label.
    plot(div, traces, { title: { text: title, x: 0.02, xanchor: 'left' }, barmode: 'group', height: 340,
                        margin: { t: 50, b: 40, l: 60, r: 10 }, yaxis: yaxis, xaxis: { automargin: true },
                        legend: { orientation: 'h', x: 1, xanchor: 'right', y: 1.02, yanchor: 'bottom' } },
         labelsInsideWhereTheyFit);
  }
  // A figure as a bar: {v} when a log axis can place it (> 0); else a stub
  // saying what it is.
  function cell(v) { return num(v) && v > 0 ? { v: v } : { stub: v === 0 ? '0' : 'n/a' }; }
  // Figures that span orders of magnitude across backends (math's 20 ms
  // beside flash's 75 us; a float32 error of 1e-7 beside a bf16 one of 1e-3)
  // go on a log axis, where a linear one would flatten all but the largest
  // to nothing. Every bar rises from the axis floor (a decade below the
  // smallest value, so the smallest bar is still a decade tall) and carries
  // its value as a label. What a log axis cannot place (0, a missing figure,
  // NaN) is a short stub at the floor labelled with what it is, not a gap.
  // Series: { name, color, cells: one per run, {v, color?} or {stub, color?, hover?} }.
  // `extra`: traces drawn over the bars whose y values the range must hold.
  function logBars(chart, title, list, fmt, extra) {
    var values = [];
    list.forEach(function (s) { s.cells.forEach(function (c) { if (c.v) values.push(c.v); }); });
    (extra || []).forEach(function (t) { t.y.forEach(function (v) { if (num(v) && v > 0) values.push(v); }); });
    var lo = values.length ? Math.floor(Math.log10(Math.min.apply(null, values))) - 1 : 0;
    var top = values.length ? Math.log10(Math.max.apply(null, values)) : lo + 1;
    var up = upright(list.length);
    var hi = top + Math.max(0.5, (top - lo) * 0.15);  // room for a label above the tallest
    var floor = Math.pow(10, lo);
    var stub = Math.pow(10, lo + (hi - lo) * 0.07) - floor;
    var traces = list.map(function (s) {
      return { type: 'bar', name: s.name, x: labels, base: s.cells.map(function () { return floor; }),
               y: s.cells.map(function (c) { return c.v ? c.v - floor : stub; }),
               marker: { color: s.cells.map(function (c) { return c.color || (c.v ? s.color : '#c7c7c7'); }) },
               text: s.cells.map(function (c) { return c.v ? fmt(c.v) + (c.suffix || '') : c.stub; }),
               textposition: 'outside', textangle: up ? -90 : 0, constraintext: 'none', cliponaxis: false,
               insidetextanchor: extra && extra.length ? 'start' : 'end',  // clear of a line drawn across the bars
               textfont: { size: 11 }, hovertext: s.cells.map(function (c, i) {
                 return esc(labels[i]) + '<br>' + s.name + ': ' + (c.v ? fmt(c.v) + (c.suffix || '') : c.stub) +
                        (c.hover ? '<br>' + esc(c.hover) : '');
               }),
               hoverinfo: 'text' };
    });
    // One tick a decade once the axis spans a few (Plotly's 2 to 9 between
    // crowd it), every other decade once it spans many; 2 and 5 between
    // decades on a short axis.
    var dtick = hi - lo > 8 ? 2 : hi - lo >= 2.5 ? 1 : 'D2';
    barPlot(chart, title, traces.concat(extra || []), { type: 'log', range: [lo, hi], exponentformat: 'power', dtick: dtick });
  }
  if (ranRuns.length) {
    logBars('time', 'time per forward, us (log axis)',
            [{ name: anyGpu ? 'GPU time' : 'time', color: '#54a24b', cells: ranRuns.map(function (r) { return cell(r.device_time_us); }) },
             { name: 'CPU/call', color: '#4c78a8', cells: ranRuns.map(function (r) { return cell(hostOf(r)); }) }],
            shortTime);
    var counts = [[countName, countOf, '#72b7b2'], ['copies/fwd', function (r) { return r.copies_per_forward; }, '#d62728']];
    barPlot('counts', countName + ' and copies/fwd', counts.map(function (c) {
      var ys = ranRuns.map(function (r) { var v = c[1](r); return num(v) ? v : null; });
      return { type: 'bar', name: c[0], x: labels, y: ys, marker: { color: c[2] }, cliponaxis: false,
               text: ys.map(function (v) { return v === null ? 'n/a' : sig(v); }), textposition: 'outside',
               textangle: upright(counts.length) ? -90 : 0, constraintext: 'none', textfont: { size: 11 } };
    }), { rangemode: 'tozero' });
    logBars('memory', 'peak memory, MiB (log axis)',
            [{ name: 'peak', color: '#9467bd', cells: ranRuns.map(function (r) {
              return cell(num(r.peak_bytes) ? r.peak_bytes / 1048576 : null); }) }],
            shortMiB);
    // The error against float64 as the C++ side classed it (error_state):
    // NaN output is the headline, whatever the finite rows' error.
    var errorCells = ranRuns.map(function (r) {
      var fail = r.accepted === false;
      if (r.error_state === 'measured') {
        return { v: r.rel_error, color: fail ? '#d62728' : undefined, suffix: fail ? ' FAIL' : '',
                 hover: num(r.tolerance) ? 'tolerance ' + r.tolerance.toExponential(1) : '' };
      }
      if (r.error_state === 'zero') return { stub: '0', hover: 'exactly the reference' };
      if (r.error_state === 'nan') {
        return { stub: 'NaN', color: '#d62728', hover: r.nan_count + ' non-finite output elements' +
                 (num(r.rel_error) ? '; ' + r.rel_error.toExponential(2) + ' on the finite rows' : '') };
      }
      return { stub: 'not checked', hover: 'no reference compared' };
    });
    var tolerances = ranRuns.map(function (r) { return num(r.tolerance) && r.tolerance > 0 ? r.tolerance : null; });
    var tolerance = tolerances.some(function (t) { return t !== null; })
        ? [{ type: 'scatter', mode: 'markers', name: 'tolerance', x: labels, y: tolerances, hoverinfo: 'y',
             marker: { symbol: 'line-ew', size: 26, color: '#333', line: { width: 2, color: '#333' } } }]
        : [];
    logBars('error', 'relative error vs float64 (log axis)',
            [{ name: 'rel error', color: '#e45756', cells: errorCells }], function (v) { return v.toExponential(1); },
            tolerance);
  } else {
    bars.removeChild(grid);
    bars.appendChild(el('p', { cls: 'note', text: 'No run has figures to compare.' }));
  }
  })();
)js";

}  // namespace attnprof::html_page
