// The second part of the HTML report's page script (html_page.h's kScript
// opens the function whose state and helpers these use, and report/html.cpp
// writes the two one after the other): the roofline and its point labels,
// the diff of two runs, each run's timeline, findings and tables, then the
// end of the drawing (data-report-status, the #selftest clicks).
#pragma once

namespace attnprof::html_page {

inline constexpr const char* kScriptPanels = R"js(
  // ---- roofline -----------------------------------------------------------
  // Offsets (pixels, from a marker to its label's centre) for a w x h label,
  // nearest first: on rings around the marker (ellipses just clear of it,
  // then a third of a step further out each), 36 directions a ring, above and
  // below before the diagonals before the sides. Rays out from the marker,
  // so a crowd of points fans its names out with their lines between them.
  function labelOffsets(w, h) {
    var out = [];
    for (var ring = 0; ring < 30; ++ring) {
      var s = 1 + ring / 3;
      for (var a = 0; a < 36; ++a) {
        var t = a * Math.PI / 18, dx = Math.cos(t), dy = Math.sin(t);
        out.push({ o: [dx * (w / 2 + 12) * s, -dy * (h / 2 + 10) * s], key: ring * 10 + (1 - Math.abs(dy)) + (dy < 0 ? 0.5 : 0) });
      }
    }
    return out.sort(function (a, b) { return a.key - b.key; }).map(function (c) { return c.o; });
  }
  function overlap(a, b) {
    return Math.max(0, Math.min(a[2], b[2]) - Math.max(a[0], b[0])) * Math.max(0, Math.min(a[3], b[3]) - Math.max(a[1], b[1]));
  }
  // How many of a line's sample points fall inside a box.
  function crossings(line, box) {
    var n = 0;
    for (var t = 0.05; t < 1; t += 0.05) {
      var x = line[0] + (line[2] - line[0]) * t, y = line[1] + (line[3] - line[1]) * t;
      if (x > box[0] && x < box[2] && y > box[1] && y < box[3]) ++n;
    }
    return n;
  }
  // Each roofline point's name in a box tied to its marker by a thin line,
  // placed so that no two names overlap however close the points (fused
  // backends can sit within a pixel of each other). Greedy, in the drawn
  // chart's pixels: points from the top, each name at the first offset
  // (labelOffsets) whose box lies inside the plot area, clear of every box
  // and marker, with its line crossing no box placed so far and its box no
  // line; failing all, at the one that breaks these least. Text widths are
  // measured with the chart's font.
  function nameRooflinePoints(div, points) {
    var fl = div._fullLayout, size = fl._size, xr = fl.xaxis.range, yr = fl.yaxis.range;
    var fontSize = 11, pad = 3, gap = 3;
    measure.font = fontSize + 'px ' + fl.font.family;
    var at = points.map(function (r) {
      return [size.l + (Math.log10(r.roofline.intensity) - xr[0]) / (xr[1] - xr[0]) * size.w,
              size.t + (yr[1] - Math.log10(r.roofline.tflops)) / (yr[1] - yr[0]) * size.h];
    });
    var taken = at.map(function (p) { return [p[0] - 7, p[1] - 7, p[0] + 7, p[1] + 7]; });  // the markers
    var boxes = [], lines = [];
    var order = at.map(function (p, i) { return i; }).sort(function (i, j) { return at[i][1] - at[j][1] || at[i][0] - at[j][0]; });
    var annotations = [];
    order.forEach(function (i) {
      var r = points[i];
      var w = measure.measureText(r.label).width + 2 * (pad + 1) + 2 * gap, h = Math.ceil(fontSize * 1.3) + 2 * (pad + 1) + 2 * gap;
      var best = null, bestCost = Infinity;
      labelOffsets(w, h).some(function (o) {
        var cx = at[i][0] + o[0], cy = at[i][1] + o[1];
        var box = [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2];
        var line = [at[i][0], at[i][1], cx, cy];
        var cost = taken.reduce(function (c, b) { return c + overlap(box, b); }, 0) +
                   10 * boxes.reduce(function (c, b) { return c + crossings(line, b); }, 0) +
                   10 * lines.reduce(function (c, l) { return c + crossings(l, box); }, 0);
        if (box[0] < size.l || box[2] > size.l + size.w || box[1] < size.t || box[3] > size.t + size.h) cost += 0.5;
        if (cost < bestCost) { bestCost = cost; best = { o: o, box: box, line: line }; }
        return cost === 0;
      });
      taken.push(best.box);
      boxes.push(best.box);
      lines.push(best.line);
      var color = (div._fullData[i] && div._fullData[i].marker.color) || '#333';
      annotations.push({ x: Math.log10(r.roofline.intensity), y: Math.log10(r.roofline.tflops), xref: 'x', yref: 'y',
                         text: esc(r.label), showarrow: true, arrowhead: 0, arrowwidth: 1, arrowcolor: color,
                         ax: best.o[0], ay: best.o[1], axref: 'pixel', ayref: 'pixel', standoff: 6,
                         bgcolor: 'rgba(255,255,255,0.9)', bordercolor: color, borderwidth: 1, borderpad: pad,
                         font: { size: fontSize, color: '#222' } });
    });
    return Plotly.relayout(div, { annotations: annotations });
  }
  if (!fromTraces) (function () {
  var roof = section('roofline', 'Roofline');
  root.appendChild(roof);
  var points = ranRuns.filter(function (r) { return r.roofline; });
  var C = data.ceiling_tflops, BW = data.bandwidth_tbs;
  if (points.length) {
    var xs = points.map(function (r) { return r.roofline.intensity; });
    var ys = points.map(function (r) { return r.roofline.tflops; });
    var xmin = Math.min.apply(null, xs) / 4, xmax = Math.max.apply(null, xs) * 4;
    var traces = points.map(function (r) {
      return { type: 'scatter', mode: 'markers', name: r.label, x: [r.roofline.intensity], y: [r.roofline.tflops],
               marker: { size: 11 },
               hovertext: [esc(r.label) + '<br>' + fmtFlops(r.roofline.tflops) + ' TFLOP/s<br>' +
                           r.roofline.intensity.toFixed(2) + ' FLOP/byte<br>' + fmtBytes(r.roofline.bytes) + ' moved'],
               hoverinfo: 'text' };
    });
    if (num(C) && num(BW) && BW > 0) {
      var ridge = C / BW;
      xmin = Math.min(xmin, ridge / 4);
      xmax = Math.max(xmax, ridge * 4);
      traces.push({ type: 'scatter', mode: 'lines', name: 'roof: min(ceiling, bandwidth x intensity)',
                    x: [xmin, ridge, xmax], y: [BW * xmin, C, C], line: { color: '#333', width: 2 } });
    } else if (num(C)) {
      traces.push({ type: 'scatter', mode: 'lines', name: 'measured ceiling ' + C.toFixed(C < 1 ? 3 : 1) + ' TFLOP/s',
                    x: [xmin, xmax], y: [C, C], line: { color: '#333', width: 2, dash: 'dash' } });
    }
    var ymin = Math.min.apply(null, ys.concat(num(C) ? [C] : [])) / 10;
    var ymax = Math.max.apply(null, ys.concat(num(C) ? [C] : [])) * 3;
    var div = el('div', { cls: 'plot', 'data-chart': 'roofline' });
    roof.appendChild(div);
    plot(div, traces, { height: 460, margin: { t: 20, l: 70, r: 20, b: 60 },
                        xaxis: { type: 'log', title: { text: 'arithmetic intensity (FLOP / byte moved)' }, range: [Math.log10(xmin), Math.log10(xmax)] },
                        yaxis: { type: 'log', title: { text: 'TFLOP/s' }, range: [Math.log10(ymin), Math.log10(ymax)] } },
         function (d) {
           // Placed again when a zoom or a resize moves the points (not when
           // the placing itself relays the annotations out).
           d.on('plotly_relayout', function (e) { if (e && !('annotations' in e)) nameRooflinePoints(d, points); });
           return nameRooflinePoints(d, points);
         });
  } else {
    roof.appendChild(el('p', { cls: 'note', text: 'No run has both TFLOP/s and a FLOP count: nothing to place.' }));
  }
  roof.appendChild(el('p', { cls: 'note', text: num(C)
      ? 'Ceiling: ' + C.toFixed(C < 1 ? 3 : 1) + ' TFLOP/s, the device\'s measured matrix-product ceiling (TFLOP/s / % of ceiling of ' + data.ceiling_from + ').'
      : 'No measured ceiling in these runs.' }));
  roof.appendChild(el('p', { cls: 'note', text: num(BW)
      ? 'Memory line: ' + (BW * 1e3).toFixed(0) + ' GB/s, ' + data.bandwidth_from + '.'
      : 'Memory-bandwidth line absent: the device properties give no bandwidth (CPU runs, or traces without it).' }));
  roof.appendChild(el('p', { cls: 'note', text:
      'Bytes moved per forward (a lower bound, so intensity is an upper bound): Q, K, V read and O written once; runs ' +
      'of a decomposed forward (3 or more ops per forward) add (8 + 2 x copies) x B x H x S x Skv score elements (written by the first ' +
      'matrix product, read and written by scale, mask and softmax, read by the second; FP32 where the backend ' +
      'computes in FP32).' }));

  })();

  // ---- diff -------------------------------------------------------------------
  if (data.diff.length) {
    var diff = section('diff', 'What changed: ' + data.diff_a + ' -> ' + data.diff_b);
    root.appendChild(diff);
    function fmtVal(v, unit) {
      if (!num(v)) return '-';
      if (unit === 'us') return fmtTime(v);
      if (unit === 'B') return fmtBytes(v);
      return String(Math.round(v * 1000) / 1000);
    }
    diff.appendChild(table(['kind', 'name', data.diff_a, data.diff_b, 'change', 'note'], data.diff.map(function (d) {
      var change = num(d.a) && num(d.b) ? (d.a !== 0 ? (d.b / d.a).toFixed(2) + 'x' : '') : '';
      return [d.kind, d.name, fmtVal(d.a, d.unit), fmtVal(d.b, d.unit), change, d.note];
    })));
    var timed = data.diff.filter(function (d) { return d.unit === 'us' && (num(d.a) || num(d.b)); });
    timed.sort(function (x, y) { return Math.abs((y.b || 0) - (y.a || 0)) - Math.abs((x.b || 0) - (x.a || 0)); });
    timed = timed.slice(0, 25);
    if (timed.length) {
      var names = timed.map(function (d) { return d.name.length > 60 ? d.name.slice(0, 57) + '...' : d.name; });
      var ddiv = el('div', { cls: 'plot' });
      diff.appendChild(ddiv);
      plot(ddiv, [
        { type: 'bar', orientation: 'h', name: data.diff_a, y: names, x: timed.map(function (d) { return num(d.a) ? d.a : 0; }), marker: { color: '#4c78a8' } },
        { type: 'bar', orientation: 'h', name: data.diff_b, y: names, x: timed.map(function (d) { return num(d.b) ? d.b : 0; }), marker: { color: '#f58518' } }
      ], { barmode: 'group', height: 140 + 34 * timed.length, margin: { l: 320, t: 20, r: 20, b: 50 },
           xaxis: { title: { text: 'us' } }, yaxis: { autorange: 'reversed', automargin: true } });
    }
  }

  // ---- per run: timeline, findings, table ---------------------------------------
  function highlight(runIndex, ev) {
    var div = timelines[runIndex];
    if (!div || !div.layout) return;
    var range = div.layout.xaxis.range.slice();
    var x0 = ev.ts, x1 = ev.ts + Math.max(ev.dur, (range[1] - range[0]) * 0.003);
    var update = { shapes: [{ type: 'rect', xref: 'x', yref: 'paper', x0: x0, x1: x1, y0: 0, y1: 1,
                              fillcolor: 'rgba(228,26,28,0.22)', line: { color: '#e41a1c', width: 1 } }] };
    if (x0 < range[0] || x1 > range[1]) {
      var pad = (x1 - x0) + (range[1] - range[0]) * 0.05;
      update['xaxis.range'] = [Math.min(range[0], x0 - pad), Math.max(range[1], x1 + pad)];
    }
    if (div.scrollIntoView) div.scrollIntoView({ block: 'center' });
    return Plotly.relayout(div, update);
  }

  // analyze's panels under a step, each only where the trace holds what it draws.
  function pct(v) { return num(v) ? v.toFixed(1) + '%' : '-'; }
  function drawExtra(s, r) {
    var x = r.extra;
    if (!x) return;
    var at = x.attention;
    if (at && at.calls.length) {
      s.appendChild(el('h3', { text: 'Attention: ' + at.calls.length + ' calls; forward ' + pct(at.forward_pct) +
                                     ', backward ' + pct(at.backward_pct) + ' of the step\'s ' + at.time }));
      s.appendChild(table(['#', 'backend', 'pass', 'shape', 'mask', 'dtype', at.time, 'TFLOP/s', 'share', 'kernels'],
        at.calls.map(function (c, k) {
          return [k + 1, c.backend, c.pass, c.shape || '-', c.mask || '-', c.dtype || '-', fmtTime(c.us),
                  num(c.tflops) ? sig(c.tflops) : '-', pct(c.share_pct),
                  el('span', { title: c.kernels.join('\n'), text: c.kernels.slice(0, 2).join(', ') + (c.kernels.length > 2 ? ', ...' : '') })];
        })));
      if (at.missing_shapes) s.appendChild(el('p', { cls: 'note', text: at.missing_shapes }));
      var placed = at.calls.filter(function (c) { return num(c.intensity) && num(c.tflops) && c.tflops > 0; });
      if (placed.length) {
        var groups = {};
        placed.forEach(function (c) {
          var key = c.backend + ' ' + c.pass;
          var g = groups[key] || (groups[key] = { type: 'scatter', mode: 'markers', name: key, x: [], y: [], hovertext: [],
                                                  hoverinfo: 'text', marker: { size: 10 } });
          g.x.push(c.intensity);
          g.y.push(c.tflops);
          g.hovertext.push(esc(c.backend + ' ' + c.pass + ' ' + c.shape + ' ' + c.mask) + '<br>' + sig(c.tflops) +
                           ' TFLOP/s<br>' + c.intensity.toFixed(1) + ' FLOP/byte (' + fmtBytes(c.bytes) + ' at least)');
        });
        var traces = Object.keys(groups).map(function (k) { return groups[k]; });
        var xs = placed.map(function (c) { return c.intensity; }), ys = placed.map(function (c) { return c.tflops; });
        var xmin = Math.min.apply(null, xs) / 3, xmax = Math.max.apply(null, xs) * 3;
        if (num(x.bandwidth_tbs)) {
          traces.push({ type: 'scatter', mode: 'lines', name: 'memory: ' + (x.bandwidth_tbs * 1e3).toFixed(0) + ' GB/s x intensity',
                        x: [xmin, xmax], y: [x.bandwidth_tbs * xmin, x.bandwidth_tbs * xmax], line: { color: '#333', dash: 'dot' } });
        }
        var rdiv = el('div', { cls: 'plot', 'data-chart': 'attention-roofline' });
        s.appendChild(el('h3', { text: 'Attention calls on the roofline' }));
        s.appendChild(rdiv);
        plot(rdiv, traces, { height: 380, margin: { t: 20, l: 70, r: 20, b: 60 },
                             xaxis: { type: 'log', title: { text: 'FLOP / byte (FLOPs over the least traffic a call moves)' }, range: [Math.log10(xmin), Math.log10(xmax)] },
                             yaxis: { type: 'log', title: { text: 'TFLOP/s' },
                                      range: [Math.log10(Math.min.apply(null, ys) / 5), Math.log10(Math.max.apply(null, ys) * 5)] } });
      }
    }
    if (x.replay) {
      var rp = x.replay;
      s.appendChild(el('h3', { text: 'Replay' + (rp.device ? ' on ' + rp.device + ' (' + rp.device_description + ')' : '') }));
      if (rp.note) s.appendChild(el('p', { cls: 'note', text: rp.note }));
      rp.problems.forEach(function (p) {
        s.appendChild(el('p', { text: p.label + ': ' + p.calls + ' calls in the trace (' + p.ran + '), ' + fmtTime(p.trace_us) + ' a call there' }));
        if (p.skipped) { s.appendChild(el('p', { cls: 'note', text: p.skipped })); return; }
        s.appendChild(table(['backend', 'time', 'vs trace', 'TFLOP/s', 'note'], p.runs.map(function (u) {
          return [u.backend === p.fastest ? el('b', { text: u.backend + ' (fastest)' }) : u.backend, num(u.us) ? fmtTime(u.us) : '-',
                  num(u.ratio) ? u.ratio.toFixed(2) + 'x' : '-', num(u.tflops) ? sig(u.tflops) : '-', u.note || ''];
        })));
      });
    }
    if (x.memory && x.memory.t.length) {
      var mdiv = el('div', { cls: 'plot', 'data-chart': 'memory-timeline' });
      s.appendChild(el('h3', { text: 'Memory allocated over the step' }));
      s.appendChild(mdiv);
      plot(mdiv, [{ type: 'scatter', mode: 'lines', line: { shape: 'hv', color: '#9467bd' }, name: 'allocated', x: x.memory.t,
                    y: x.memory.total.map(function (b) { return b / (1024 * 1024); }), hovertemplate: '%{y:.2f} MiB at %{x:.1f} us<extra></extra>' }],
           { height: 260, margin: { t: 20, l: 70, r: 20, b: 50 }, xaxis: { title: { text: 'us from the trace start' } },
             yaxis: { title: { text: 'MiB allocated' }, rangemode: 'tozero' } });
    }
    if (x.kernels && x.kernels.length) {
      var seen = {};
      var boxes = x.kernels.map(function (k) {
        var name = k.short;
        seen[name] = (seen[name] || 0) + 1;
        if (seen[name] > 1) name += ' #' + seen[name];
        return { type: 'box', orientation: 'h', name: name, x: k.us, boxpoints: k.us.length <= 50 ? 'all' : 'outliers',
                 jitter: 0.3, hoverinfo: 'x', text: k.name, showlegend: false };
      });
      var kdiv = el('div', { cls: 'plot', 'data-chart': 'kernel-durations' });
      s.appendChild(el('h3', { text: 'Top kernels: the duration of each launch' }));
      s.appendChild(kdiv);
      var names = el('details', null, [el('summary', { text: 'Whole kernel names' }),
                                       el('pre', { text: x.kernels.map(function (k, j) { return boxes[j].name + ': ' + k.name; }).join('\n\n') })]);
      plot(kdiv, boxes, { height: 120 + 40 * boxes.length, margin: { t: 20, l: 20, r: 20, b: 50 },
                          xaxis: { type: 'log', title: { text: 'us per launch (log axis)' } },
                          yaxis: { automargin: true, autorange: 'reversed' } });
      s.appendChild(names);
    }
  }

  runs.forEach(function (r, i) {
    if (!r.ran) return;
    var s = section('run-' + i, r.label);
    root.appendChild(s);
    if (r.collector_note) s.appendChild(el('p', { cls: 'note', text: r.collector_note }));
    var tl = r.timeline;
    s.appendChild(el('h3', { text: 'Timeline' + (tl.step ? ' of ' + tl.step : '') + ': CPU ranges by depth, GPU activities by stream' }));
    if (tl.events.length) {
      var cats = {};
      tl.events.forEach(function (e) {
        var t = cats[e.c];
        if (!t) {
          t = cats[e.c] = { type: 'bar', orientation: 'h', name: e.c, x: [], base: [], y: [], hovertext: [],
                            hoverinfo: 'text', marker: { color: COLORS[e.c] || '#888' } };
        }
        t.x.push(e.d);
        t.base.push(e.t);
        t.y.push(tl.lanes[e.l]);
        t.hovertext.push(esc(e.f || e.n) + '<br>' + e.c + ': ' + fmtTime(e.d) + ' at ' + e.t.toFixed(3) + ' us');
      });
      var div = el('div', { cls: 'plot' });
      s.appendChild(div);
      timelines[i] = div;
      plot(div, Object.keys(cats).map(function (k) { return cats[k]; }), {
        barmode: 'overlay', height: 140 + 30 * tl.lanes.length, margin: { l: 170, t: 20, r: 20, b: 50 },
        xaxis: { title: { text: 'us from the trace start' }, range: [tl.from, tl.to], zeroline: false },
        yaxis: { type: 'category', categoryorder: 'array', categoryarray: tl.lanes, autorange: 'reversed' },
        legend: { orientation: 'h', y: -0.25 }
      });
      if (tl.left_out > 0) s.appendChild(el('p', { cls: 'note', text: tl.left_out + ' shorter events are left out of this timeline.' }));
    } else {
      s.appendChild(el('p', { cls: 'note', text: 'No events in this step.' }));
    }

    drawExtra(s, r);

    s.appendChild(el('h3', { text: 'Findings' }));
    if (!r.findings.length) s.appendChild(el('p', { cls: 'note', text: 'No findings.' }));
    r.findings.forEach(function (f) {
      var box = el('div', { cls: 'finding ' + f.severity }, [
        el('span', { cls: 'sev', text: f.severity }), el('span', { cls: 'rule', text: f.rule }), f.text]);
      if (f.evidence.length) {
        var ul = el('ul', { cls: 'evidence' });
        f.evidence.forEach(function (ev) {
          var a = el('a', { href: '#run-' + i, text: ev.short || ev.name, title: ev.name });
          a.addEventListener('click', function (e) { e.preventDefault(); highlight(i, ev); });
          evidenceLinks.push(function () { return highlight(i, ev); });
          ul.appendChild(el('li', null, [a, ' ' + ev.cat + ', at ' + ev.ts.toFixed(3) + ' us, ' + fmtTime(ev.dur)]));
        });
        box.appendChild(ul);
      }
      s.appendChild(box);
    });

    var details = el('details', null, [el('summary', { text: 'Key-averages table' }), el('pre', { text: r.table || '' })]);
    if (runs.length === 1) details.setAttribute('open', '');
    s.appendChild(details);
  });

  Promise.all(pending).then(function () {
    if (location.hash !== '#selftest') return null;
    // Exercise every evidence link once, as a reader clicking through would.
    return evidenceLinks.reduce(function (p, f) { return p.then(f); }, Promise.resolve());
  }).then(function () {
    var errors = window.__reportErrors || [];
    document.body.setAttribute('data-report-plots', String(document.querySelectorAll('.js-plotly-plot').length));
    document.body.setAttribute('data-report-status', errors.length ? 'error' : 'ok');
    if (errors.length) {
      document.body.setAttribute('data-report-errors', JSON.stringify(errors));
      root.insertBefore(el('div', { id: 'report-errors', text: 'Errors while drawing:\n' + errors.join('\n') }), root.firstChild);
    }
  }, function (e) { window.__reportRecord(e && e.message ? e.message : e); });
})();
)js";

}  // namespace attnprof::html_page
