// tensortap dashboard and report: draws the blocks of a view (figures, tables, choices, notes).
// Names from the job are only ever set as text (textContent), never parsed as HTML; figure text
// arrives HTML-escaped from the server and plotly shows it as characters.
(function () {
  "use strict";

  var STATUS_LABEL = { NoData: "no data" };

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  var PLOT_CONFIG = { displaylogo: false, responsive: true };

  // A run's colour in every view: tensortap.ui.views.PALETTE (Okabe and Ito's colour-blind-safe palette).
  var PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000"];
  function jobColour(i) { return PALETTE[i % PALETTE.length]; }
  // and its dash beyond seven jobs (views.DASHES, views.job_dash), as plotly draws them at a width of 2
  var DASHES = [null, "9,9", "3,3", "9,3,3,3", "15,15", "15,6,3,6"];
  function jobDash(i) { return DASHES[Math.floor(i / PALETTE.length) % DASHES.length]; }
  var SVG = "http://www.w3.org/2000/svg";
  // a job's swatch in the header: a short line in its colour and dash (the legend of figures that have none)
  function swatch(i) {
    var s = document.createElementNS(SVG, "svg");
    s.setAttribute("class", "swatch");
    s.setAttribute("width", "30"); s.setAttribute("height", "12"); s.setAttribute("aria-hidden", "true");
    var bg = document.createElementNS(SVG, "rect");
    bg.setAttribute("width", "30"); bg.setAttribute("height", "12"); bg.setAttribute("rx", "2");
    bg.setAttribute("fill", "#ffffff");
    var line = document.createElementNS(SVG, "line");
    line.setAttribute("x1", "2"); line.setAttribute("x2", "28"); line.setAttribute("y1", "6"); line.setAttribute("y2", "6");
    line.setAttribute("stroke", jobColour(i)); line.setAttribute("stroke-width", "3");
    if (jobDash(i)) line.setAttribute("stroke-dasharray", jobDash(i));
    s.appendChild(bg); s.appendChild(line);
    s.dataset.colour = jobColour(i);
    s.dataset.dash = jobDash(i) || "solid";
    return s;
  }

  // How curves are drawn (the toolbar above them): EMA smoothing weight, log y axis, x by global step, by step
  // within the mode, by wall time (seconds since the job's first step, where the job records it) or by epoch
  // (where the job saved a scalar `epoch`).
  var curveState = { smooth: 0, ylog: false, x: "step" };
  // the trace meta key that holds the points' x of each x axis but the global step (wall time and epoch: computed
  // from the job's table in layout.meta, by linear interpolation between its steps)
  var X_KEYS = { mode: "x_mode", wall: "x_wall", epoch: "x_epoch" };
  // the value at each of `steps` by linear interpolation in the table (st, vs); beyond its ends null, or (`extend`)
  // the line through the nearest two
  function interp(st, vs, steps, extend) {
    var n = st.length;
    return steps.map(function (x) {
      if (x === null || !n) return null;
      if (x < st[0] || x > st[n - 1]) {
        if (!extend || n < 2) return null;
        var a = x < st[0] ? 0 : n - 2;
        return vs[a] + (vs[a + 1] - vs[a]) * (x - st[a]) / (st[a + 1] - st[a]);
      }
      var lo = 0, hi = n - 1;
      while (hi - lo > 1) { var mid = (lo + hi) >> 1; if (st[mid] <= x) lo = mid; else hi = mid; }
      if (st[lo] === x || hi === lo) return vs[lo];
      if (st[hi] === x) return vs[hi];
      return vs[lo] + (vs[hi] - vs[lo]) * (x - st[lo]) / (st[hi] - st[lo]);
    });
  }
  function hasTable(f, key) {
    var m = f.layout.meta && f.layout.meta[key];
    return !!m && Object.keys(m).length > 0;
  }
  // the points' x under x axis `xKey` (null: the global steps themselves); `f`: the trace's figure, whose
  // layout.meta.wall and layout.meta.epoch hold each job's table. A job without the table: no points.
  function xOf(t, xKey, f) {
    var m = t.meta || {};
    if (xKey === "x_wall" || xKey === "x_epoch") {
      var key = xKey === "x_wall" ? "wall" : "epoch";
      var tables = f.layout.meta && f.layout.meta[key], table = tables && tables[String(m.job)];
      if (!table) return t.x.map(function () { return null; });
      return key === "wall" ? interp(table.step, table.s, t.x, false) : interp(table.step, table.epoch, t.x, true);
    }
    return xKey && m[xKey] ? m[xKey] : null;
  }
  var X_TITLES = { mode: "step within its mode", wall: "wall time (s since the job's first step)",
                   epoch: "epoch (the job's saved epoch scalar)" };
  var curveListeners = [];  // called when the toolbar changes (the live page keeps it in the URL)

  // --- curves: smoothing, zero-safe log axis, x by mode step -------------------------------------

  // TensorBoard's smoothing: an exponential moving average, debiased at the start; a gap stays a gap.
  function ema(y, w) {
    var out = new Array(y.length), last = 0, n = 0;
    for (var i = 0; i < y.length; i++) {
      var v = y[i];
      if (v === null || v === undefined || !isFinite(v)) { out[i] = null; continue; }
      last = last * w + (1 - w) * v;
      n++;
      out[i] = last / (1 - Math.pow(w, n));
    }
    return out;
  }

  function sup(k) { return k === 0 ? "1" : k === 1 ? "10" : "10<sup>" + k + "</sup>"; }

  // views.log_ticks: whole decades when two or more show (at most four), else the ends themselves.
  function logTicks(lo, hi) {
    var loL = Math.log10(lo), hiL = Math.log10(hi), ks = [];
    for (var k = Math.ceil(loL - 1e-9); k <= Math.floor(hiL + 1e-9); k++) ks.push(k);
    if (ks.length >= 2) {
      var step = Math.max(1, Math.ceil((ks.length - 1) / 3));
      ks = ks.filter(function (_, i) { return i % step === 0; });
      return [ks.map(function (k) { return Math.pow(10, k); }), ks.map(sup)];
    }
    var vals = hi > lo * 1.0001 ? [lo, hi] : [lo];
    return [vals, vals.map(function (v) { return Number(v.toPrecision(2)).toString(); })];
  }

  // The y axis and the rows of a zero-safe log scale (views.zero_safe_log_axis): at most four labels; a
  // row "0" (or "≤ 0") below the values for those that are not positive, a row "NaN/inf" above them.
  function logAxis(ys, zeroLabel, nonfinite, base) {
    var lo = Infinity, hi = -Infinity;
    ys.forEach(function (y) { y.forEach(function (v) { if (v !== null && v > 0 && isFinite(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); } }); });
    var any = isFinite(lo);
    if (!any) { lo = 1; hi = 1; }
    var loL = Math.log10(lo), hiL = Math.log10(hi);
    var pad = Math.max(0.1, 0.05 * (hiL - loL)), gap = Math.max(0.3, 0.15 * (hiL - loL + 2 * pad));
    var t = any ? logTicks(lo, hi) : [[], []], vals = t[0], text = t[1];
    var zeroL = loL - pad - gap, nfL = hiL + pad + gap, range = [loL - pad, hiL + pad];
    if (zeroLabel) { vals.unshift(Math.pow(10, zeroL)); text.unshift(zeroLabel); range[0] = zeroL - gap / 2; }
    if (nonfinite) { vals.push(Math.pow(10, nfL)); text.push("NaN/inf"); range[1] = nfL + gap / 2; }
    var axis = Object.assign({}, base || {}, { type: "log", tickvals: vals, ticktext: text, zeroline: false,
                                               range: range, autorange: false });
    return { axis: axis, rows: { zero: Math.pow(10, zeroL), nonfinite: Math.pow(10, nfL) } };
  }

  // The figure to draw for a block of curves under curveState.
  function curveFigure(f, cs) {
    var layout = JSON.parse(JSON.stringify(f.layout));
    var xKey = X_KEYS[cs.x];
    var lines = [], others = [], rowMarks = [];
    f.data.forEach(function (t) {
      var m = t.meta || {};
      var x = xOf(t, xKey, f) || t.x;
      if (m.curve && (cs.x === "wall" || cs.x === "epoch") && t.x.length && x.every(function (v) { return v === null; })) {
        t = Object.assign({}, t, { name: t.name + (cs.x === "epoch" ? " (no epoch saved)" : " (no wall time)") });
      }
      if (m.curve) {
        var key = "c" + m.job + ":" + m.tensor + ":" + m.mode;
        if (cs.smooth > 0) {
          lines.push(Object.assign({}, t, { x: x, y: t.y, opacity: 0.25, showlegend: false, hoverinfo: "skip",
                                            legendgroup: key, mode: "lines", name: t.name + " (raw)",
                                            meta: Object.assign({}, m, { raw: true }) }));
          lines.push(Object.assign({}, t, { x: x, y: ema(t.y, cs.smooth), legendgroup: key,
                                            meta: Object.assign({}, m, { smoothing: cs.smooth }) }));
        } else {
          lines.push(Object.assign({}, t, { x: x, legendgroup: key }));
        }
      } else if (m.row === "nonfinite") {
        rowMarks.push(Object.assign({}, t, { x: x }));
      } else {
        others.push(Object.assign({}, t, { x: x }));
      }
    });
    if (xKey) layout.xaxis = Object.assign({}, layout.xaxis, { title: { text: X_TITLES[cs.x] } });
    if (cs.x === "wall" || cs.x === "epoch") delete layout.xaxis.dtick;
    var finite = [];
    lines.forEach(function (t) { t.y.forEach(function (v) { if (v !== null && isFinite(v)) finite.push(v); }); });
    if (cs.ylog) {
      var zeros = [];
      lines.forEach(function (t) {
        var zx = [];
        t.y = t.y.map(function (v, i) { if (v !== null && v <= 0) { zx.push(t.x[i]); return null; } return v; });
        if (zx.length) zeros.push([t, zx]);  // the saved value (the faint raw curve) or the smoothed one
      });
      var neg = finite.some(function (v) { return v < 0; });
      var la = logAxis(lines.map(function (t) { return t.y; }), zeros.length ? (neg ? "≤ 0" : "0") : null,
                       rowMarks.length > 0, layout.yaxis);
      layout.yaxis = la.axis;
      zeros.forEach(function (p) {
        others.push({ type: "scatter", mode: "markers", x: p[1], y: p[1].map(function () { return la.rows.zero; }),
                      name: (neg ? "≤ 0 · " : "exactly 0 · ") + p[0].name, legendgroup: p[0].legendgroup,
                      showlegend: false, marker: { symbol: "triangle-down", size: 8, color: p[0].line.color },
                      hovertemplate: "step %{x}: " + (neg ? "≤ 0" : "exactly 0") + "<extra></extra>",
                      meta: { row: "zero", job: p[0].meta.job, tensor: p[0].meta.tensor } });
      });
      rowMarks.forEach(function (t) { t.y = t.x.map(function () { return la.rows.nonfinite; }); });
      others.forEach(function (t) {  // a rule's marker on a value the log scale cannot show: on the 0 row
        if (t.meta && t.meta.rule) t.y = t.y.map(function (v) { return v !== null && v > 0 ? v : la.rows.zero; });
      });
    } else if (rowMarks.length) {
      var bottom = finite.length ? Math.min.apply(null, finite) : 0;
      rowMarks.forEach(function (t) { t.y = t.x.map(function () { return bottom; }); });
    }
    layout.uirevision = cs.x + (cs.ylog ? ":log" : ":linear");
    return { data: lines.concat(rowMarks, others), layout: layout };
  }

  // The figure of a block as drawn now: curves under curveState, a switch's chosen variant.
  function figureOf(div) {
    var b = div._tt;
    var f = b.curves ? curveFigure(div._ttFig, curveState) : { data: b.figure.data, layout: Object.assign({}, b.figure.layout, { uirevision: "keep" }) };
    if (b.switch) {
      var opt = b.switch.options[div._ttSwitch || 0];
      f = { data: f.data.map(function (t, i) { return Object.assign({}, t, { visible: !!opt.visible[i] }); }),
            layout: JSON.parse(JSON.stringify(f.layout)) };
      Object.keys(opt.layout || {}).forEach(function (path) {
        var parts = path.split("."), o = f.layout;
        for (var i = 0; i < parts.length - 1; i++) { o[parts[i]] = o[parts[i]] || {}; o = o[parts[i]]; }
        o[parts[parts.length - 1]] = opt.layout[path];
      });
    }
    return f;
  }

  function draw(div) {
    var f = figureOf(div);
    var drawn;
    try {
      drawn = Plotly.react(div, f.data, f.layout, PLOT_CONFIG);
    } catch (e) {
      drawn = Promise.reject(e);
    }
    return drawn.catch(function (e) {
      throw new Error("figure " + div.dataset.fig + ": " + (e && e.message || e));
    }).then(function () {
      if (div._tt.curves && !div._ttZoomHooked && zoomSource) {
        div._ttZoomHooked = true;
        div.on("plotly_relayout", function (ev) { onZoom(div, ev); });
      }
    });
  }

  function redrawCurves() {
    var divs = document.querySelectorAll("div.figure[data-curves]");
    return Array.prototype.reduce.call(divs, function (done, d) {
      return done.then(function () { return d._tt ? draw(d) : null; });
    }, Promise.resolve()).then(function () { window.ttCurveRenders = (window.ttCurveRenders || 0) + 1; });
  }

  // The live page re-reads a zoomed curve: every point inside the shown steps, an envelope outside.
  var zoomSource = null;  // function (meta, lo, hi) -> promise of {x, y, x_mode}; null in the report
  function onZoom(div, ev) {
    var lo = ev["xaxis.range[0]"], hi = ev["xaxis.range[1]"];
    if (ev["xaxis.range"]) { lo = ev["xaxis.range"][0]; hi = ev["xaxis.range"][1]; }
    if (ev["xaxis.autorange"]) {
      div._ttFig = div._tt.figure;
      div._ttZoom = null;
      window.ttZooms = (window.ttZooms || 0) + 1;
      return Promise.resolve();
    }
    if (lo === undefined || hi === undefined) return Promise.resolve();
    // kept: a redraw of the live view (new steps) reads this window again at full resolution
    div._ttZoom = { lo: lo, hi: hi, x: curveState.x };
    var f = div._ttFig, xKey = X_KEYS[curveState.x];
    var data = f.data.slice();
    var jobs = [];
    data.forEach(function (t, i) {
      var m = t.meta || {};
      if (!m.curve) return;
      var glo = lo, ghi = hi;
      var xs = xOf(t, xKey, f);
      if (xs) {  // the axis shows mode steps or wall time: the global steps of the same points
        var a = xs.findIndex(function (s) { return s !== null && s >= lo; }), b = -1;
        for (var k = xs.length - 1; k >= 0; k--) if (xs[k] !== null && xs[k] <= hi) { b = k; break; }
        if (a < 0 || b < 0) return;
        glo = t.x[a]; ghi = t.x[b];
      }
      jobs.push(zoomSource(m, glo, ghi).then(function (s) {
        data[i] = Object.assign({}, t, { x: s.x, y: s.y, meta: Object.assign({}, m, { x_mode: s.x_mode,
                                                                                     window: [glo, ghi], n_inside: s.inside }) });
      }));
    });
    return Promise.all(jobs).then(function () {
      var layout = JSON.parse(JSON.stringify(f.layout));
      layout.xaxis = Object.assign({}, layout.xaxis, { range: [lo, hi], autorange: false });
      div._ttFig = { data: data, layout: layout };
      return draw(div);
    }).then(function () { window.ttZooms = (window.ttZooms || 0) + 1; },
            function (e) { showError("zoom: " + (e.message || e)); });
  }

  function curveToolbar(hasWall, hasEpoch, hasRounds) {
    var bar = el("div", "toolbar");
    bar.setAttribute("role", "group");
    bar.setAttribute("aria-label", "how curves are drawn");
    var sl = el("label", null, "smoothing ");
    var range = el("input");
    range.type = "range"; range.min = "0"; range.max = "0.99"; range.step = "0.01";
    range.value = String(curveState.smooth);
    range.dataset.control = "smooth";
    var out = el("output", null, curveState.smooth.toFixed(2));
    range.addEventListener("input", function () {
      curveState.smooth = Number(range.value);
      out.textContent = curveState.smooth.toFixed(2);
      changed();
    });
    sl.appendChild(range); sl.appendChild(out);
    var lg = el("label", null, " ");
    var box = el("input");
    box.type = "checkbox"; box.checked = curveState.ylog; box.dataset.control = "ylog";
    box.addEventListener("change", function () { curveState.ylog = box.checked; changed(); });
    lg.appendChild(box); lg.appendChild(document.createTextNode(" log scale"));
    var xl = el("label", null, "x axis ");
    var xs = el("select");
    xs.dataset.control = "x";
    var xOptions = [["step", hasRounds ? "global step (XGBoost: round)" : "global step"], ["mode", "step within its mode"]];
    if (hasWall) xOptions.push(["wall", "wall time"]);
    if (hasEpoch) xOptions.push(["epoch", "epoch"]);
    xOptions.forEach(function (o) {
      var opt = el("option", null, o[1]); opt.value = o[0]; if (o[0] === curveState.x) opt.selected = true; xs.appendChild(opt);
    });
    xs.addEventListener("change", function () { curveState.x = xs.value; changed(); });
    xl.appendChild(xs);
    var hint = el("span", "meta", (hasWall ? "wall time: when the step's data was flushed (within 0.5 s)"
                                           : "wall time: not recorded (smdebug jobs)") + "; " +
                                  (hasEpoch ? "epoch: the job's saved scalar named epoch"
                                            : "epoch: offered when a job saves a scalar named epoch"));
    [sl, lg, xl, hint].forEach(function (n) { bar.appendChild(n); });
    var pending = null;
    function changed() {
      // one redraw per frame while the slider moves
      if (pending) return;
      pending = requestAnimationFrame(function () {
        pending = null;
        redrawCurves();
        curveListeners.forEach(function (f) { f(curveState); });
      });
    }
    return bar;
  }

  function renderChoice(b, onChoice) {
    var wrap = el("div", "choice");
    var lab = el("label", null, b.label + " ");
    var sel = el("select");
    sel.dataset.param = b.param;
    b.options.forEach(function (o) {
      var opt = el("option", null, o.label);
      opt.value = o.value;
      if (o.value === b.value) opt.selected = true;
      sel.appendChild(opt);
    });
    sel.addEventListener("change", function () { onChoice(b.param, sel.value); });
    if (b.search) {  // a long list: typing narrows it
      var find = el("input");
      find.type = "search";
      find.placeholder = "search " + b.options.length + " names";
      find.setAttribute("aria-label", "search " + b.label);
      find.dataset.search = b.param;
      find.addEventListener("input", function () {
        var q = find.value.toLowerCase(), first = null;
        Array.prototype.forEach.call(sel.options, function (o) {
          var hit = o.textContent.toLowerCase().indexOf(q) >= 0;
          o.hidden = !hit;
          if (hit && !first) first = o;
        });
        sel.dataset.matches = String(Array.prototype.filter.call(sel.options, function (o) { return !o.hidden; }).length);
      });
      find.addEventListener("keydown", function (e) {
        var firstShown = Array.prototype.find.call(sel.options, function (o) { return !o.hidden; });
        if (e.key === "Enter" && firstShown) { sel.value = firstShown.value; onChoice(b.param, sel.value); }
      });
      wrap.appendChild(find);
      wrap.appendChild(document.createTextNode(" "));
    }
    lab.appendChild(sel);
    wrap.appendChild(lab);
    return wrap;
  }

  // Draws `blocks` into `container`, reusing figure divs of the same id (so a live redraw updates the
  // plot in place). Returns a promise that resolves once every figure is drawn.
  function renderBlocks(container, blocks, onChoice) {
    var old = {};
    container.querySelectorAll("div.figure").forEach(function (d) { old[d.dataset.fig] = d; });
    var nodes = [];
    var drawing = [];
    var toolbar = false;
    blocks.forEach(function (b, i) {
      // the curve toolbar goes above the first curves (or the note about them just before)
      if (!toolbar && (b.curves || (b.type === "note" && blocks[i + 1] && blocks[i + 1].curves))) {
        nodes.push(curveToolbar(blocks.some(function (x) { return x.curves && hasTable(x.figure, "wall"); }),
                                blocks.some(function (x) { return x.curves && hasTable(x.figure, "epoch"); }),
                                blocks.some(function (x) { return x.curves && /^rounds-/.test(x.id); })));
        toolbar = true;
      }
      if (b.type === "heading") {
        nodes.push(el("h3", null, b.text));
      } else if (b.type === "group") {
        // blocks without figures (the diagnosis); `pending`: the view to ask for until nothing in it is pending
        var box = el("div", b.pending ? "group pending" : "group");
        if (b.pending) box.dataset.pending = b.pending;
        renderBlocks(box, b.blocks, onChoice);
        nodes.push(box);
      } else if (b.type === "note") {
        nodes.push(el("p", "note", b.text));
      } else if (b.type === "table") {
        nodes.push(renderTable(b));
      } else if (b.type === "choice") {
        if (!onChoice) {
          nodes.push(el("p", "meta", b.label + ": " + labelOf(b)));
          return;
        }
        nodes.push(renderChoice(b, onChoice));
      } else if (b.type === "search") {
        if (!onChoice) return;
        var w = el("div", "choice");
        var l = el("label", null, b.label + " ");
        var inp = el("input");
        inp.type = "search"; inp.value = b.value || ""; inp.dataset.param = b.param;
        inp.addEventListener("change", function () { onChoice(b.param, inp.value, { page: null }); });
        l.appendChild(inp);
        w.appendChild(l);
        nodes.push(w);
      } else if (b.type === "figure") {
        var div = old[b.id] || el("div", "figure");
        div.dataset.fig = b.id;
        div.style.height = (b.height || 360) + "px";
        div.setAttribute("role", "img");
        div.setAttribute("aria-label", (b.figure.layout.title && b.figure.layout.title.text || "figure").replace(/<[^>]*>/g, ""));
        div._tt = b;
        div._ttFig = b.figure;
        if (!old[b.id]) div._ttZoom = null;
        if (b.curves) div.dataset.curves = "1";
        delete old[b.id];
        if (b.switch) {
          var sw = el("div", "choice");
          var sl = el("label", null, b.switch.label + " ");
          var ss = el("select");
          ss.dataset.switch = b.id;
          b.switch.options.forEach(function (o, i) {
            var opt = el("option", null, o.label); opt.value = String(i);
            if (i === (div._ttSwitch || 0)) opt.selected = true;
            ss.appendChild(opt);
          });
          ss.addEventListener("change", (function (d) {
            return function () { d._ttSwitch = Number(ss.value); draw(d); };
          })(div));
          sl.appendChild(ss); sw.appendChild(sl);
          nodes.push(sw);
        }
        nodes.push(div);
        drawing.push(div);
      }
    });
    Object.keys(old).forEach(function (k) { try { Plotly.purge(old[k]); } catch (e) { /* gone */ } });
    container.replaceChildren.apply(container, nodes);
    // One figure per task, in page order: the browser shows each as it is drawn (the report's first
    // screen does not wait for its last figure).
    return drawing.reduce(function (done, d, i) {
      return done.then(function () { return i ? nextTask() : null; }).then(function () {
        return draw(d);
      }).then(function () {
        if (!window.ttFirstFigureAt) { window.ttFirstFigureAt = performance.now(); }
        // a zoomed curve redrawn with the job's new steps: its window read again at full resolution
        var z = d._ttZoom;
        if (z && d._tt.curves && zoomSource && z.x === curveState.x) return onZoom(d, { "xaxis.range": [z.lo, z.hi] });
      });
    }, Promise.resolve());
  }

  function nextTask() {
    return new Promise(function (resolve) { setTimeout(resolve, 0); });
  }

  function labelOf(b) {
    for (var i = 0; i < b.options.length; i++) if (b.options[i].value === b.value) return b.options[i].label;
    return b.value;
  }

  // A long cell (a rule's explanation that lists every tensor of the job) shows its start; a click shows
  // the rest after it (so the cell's text is the whole text, in order).
  var LONG_CELL = 240;
  function longText(text) {
    var cut = text.lastIndexOf(" ", 160);
    if (cut < 80) cut = 160;
    var d = el("details", "long");
    var s = el("summary", null, text.slice(0, cut));
    s.appendChild(el("span", "more", " … (more)"));
    d.appendChild(s);
    d.appendChild(el("span", null, text.slice(cut)));
    return d;
  }

  function renderTable(b) {
    var t = el("table", "tt");
    t.dataset.table = b.id || "";
    var head = el("tr");
    b.columns.forEach(function (c) { head.appendChild(el("th", null, c)); });
    t.appendChild(head);
    b.rows.forEach(function (r) {
      var tr = el("tr");
      b.columns.forEach(function (c) {
        var v = r[c];
        var td;
        if (c === b.status_column) {
          td = el("td", "status status-" + String(v).replace(/[^A-Za-z]/g, ""), STATUS_LABEL[v] || v);
        } else if (String(v).length > LONG_CELL) {
          td = el("td");
          td.appendChild(longText(String(v)));
        } else {
          td = el("td", null, v);
        }
        tr.appendChild(td);
      });
      t.appendChild(tr);
    });
    return t;
  }

  function getJSON(url) {
    return fetch(url, { cache: "no-store" }).then(function (r) {
      return r.json().then(function (body) {
        if (!r.ok) throw new Error(body.error || ("HTTP " + r.status));
        return body;
      });
    });
  }

  // The view, its choices, the jobs picked and how curves are drawn live in the URL's fragment
  // (#view=layers&page=1&job=0&job=2&smooth=0.6&ylog=1&x=mode), so a reload keeps them.
  var CURVE_PARAMS = ["smooth", "ylog", "x"];
  function fromHash() {
    var q = new URLSearchParams(location.hash.replace(/^#/, ""));
    var params = {};
    q.forEach(function (v, k) { if (k !== "view" && k !== "job" && CURVE_PARAMS.indexOf(k) < 0) params[k] = v; });
    if (q.getAll("job").length) params.job = q.getAll("job");
    if (q.get("smooth")) curveState.smooth = Math.min(0.99, Math.max(0, Number(q.get("smooth")) || 0));
    if (q.get("ylog")) curveState.ylog = q.get("ylog") === "1";
    if (X_KEYS[q.get("x")]) curveState.x = q.get("x");
    return { view: q.get("view") || "overview", params: params };
  }

  function appendParams(q, params) {
    Object.keys(params).forEach(function (k) {
      var v = params[k];
      if (v == null) return;
      (Array.isArray(v) ? v : [v]).forEach(function (x) { q.append(k, x); });
    });
  }

  function viewPath(view, params) {
    var q = new URLSearchParams();
    appendParams(q, params);
    var s = q.toString();
    return "/api/view/" + encodeURIComponent(view) + (s ? "?" + s : "");
  }

  function toHash(view, params) {
    var q = new URLSearchParams({ view: view });
    appendParams(q, params);
    if (curveState.smooth) q.append("smooth", String(curveState.smooth));
    if (curveState.ylog) q.append("ylog", "1");
    if (curveState.x !== "step") q.append("x", curveState.x);
    history.replaceState(null, "", "#" + q.toString());
  }

  // performance marks, read by bench/ui_paint.py: tt-plotly-ready (plotly.js ran), tt-view-data (the first
  // view's JSON parsed), tt-painted (its figures drawn)
  function mark(name) {
    if (window.performance && performance.mark) performance.mark(name);
  }

  function markPainted() {
    if (!window.ttPaintedAt) {
      window.ttPaintedAt = performance.now();
      mark("tt-painted");
      document.body.dataset.painted = "1";
    }
    window.ttRenders = (window.ttRenders || 0) + 1;
  }

  function showError(msg) {
    var e = document.getElementById("error");
    if (!e) return;
    e.textContent = msg || "";
    e.hidden = !msg;
  }

  // --- report: every section drawn from the data embedded in the file ---------------------------
  function runReport(doc) {
    var main = document.getElementById("view");
    var jobs = document.getElementById("jobs");
    doc.jobs.forEach(function (j) {
      var chip = el("span", "job");
      chip.appendChild(swatch(j.index));
      chip.appendChild(document.createTextNode(j.name));
      jobs.appendChild(chip);
    });
    document.getElementById("live").textContent = "report generated " + doc.generated;
    var bodies = doc.sections.map(function (s) {
      var sec = el("section", "report-section");
      sec.dataset.view = s.name;
      sec.appendChild(el("h2", null, s.title));
      var body = el("div");
      sec.appendChild(body);
      main.appendChild(sec);
      return body;
    });
    // sections drawn one after another, from the top
    doc.sections.reduce(function (done, s, i) {
      return done.then(function () { return i ? nextTask() : null; }).then(function () {
        return renderBlocks(bodies[i], s.blocks, null);
      });
    }, Promise.resolve()).then(markPainted, function (e) { showError(String(e)); });
  }

  // --- live dashboard ---------------------------------------------------------------------------
  function runLive(early) {
    var pollMs = Number(document.getElementById("tt-app").dataset.pollMs) || 1000;
    var first = (early && early.first) || fromHash();
    var state = { view: first.view, params: first.params, sig: null, loading: false, again: false, views: [] };
    var main = document.getElementById("view");

    function viewURL() { return viewPath(state.view, state.params); }

    function load(prefetched) {
      if (state.loading) { state.again = true; return Promise.resolve(); }
      state.loading = true;
      var view = state.view;
      return (prefetched || getJSON(viewURL())).then(function (body) {
        if (view !== state.view) return null;
        // the jobs' signatures this view was drawn at: the next poll that differs redraws it
        state.sig = JSON.stringify(body.jobs);
        main.dataset.view = view;
        return renderBlocks(main, body.blocks, function (param, value, resets) {
          state.params[param] = value;
          Object.keys(resets || {}).forEach(function (k) { delete state.params[k]; });
          toHash(state.view, state.params);
          load();
        }).then(function () {
          showError(""); markPainted();
          main.querySelectorAll("div.pending").forEach(function (box) { fillPending(box, view); });
        });
      }).catch(function (e) { showError(String(e.message || e)); }).then(function () {
        state.loading = false;
        if (state.again) { state.again = false; load(); }
      });
    }

    // a block still being made (a large job's diagnosis): its view (box.dataset.pending) is asked for until it is
    // ready, then drawn in the block's place; the rest of the view is left as it is
    function fillPending(box, view) {
      setTimeout(function () {
        if (view !== state.view || !box.isConnected) return;
        getJSON(viewPath(box.dataset.pending, state.params.job ? { job: state.params.job } : {}))
          .then(function (body) {
            if (!box.isConnected) return null;
            // what is ready so far drawn in the box; asked again while some of it is being made
            var group = body.blocks.length === 1 && body.blocks[0].type === "group" ? body.blocks[0] : null;
            if (group && group.pending) { renderBlocks(box, group.blocks, null); fillPending(box, view); return null; }
            box.classList.remove("pending");
            delete box.dataset.pending;
            return renderBlocks(box, group ? group.blocks : body.blocks, null);
          }).catch(function () { fillPending(box, view); });
      }, pollMs);
    }

    function tabs() {
      var nav = document.getElementById("tabs");
      nav.setAttribute("role", "tablist");
      nav.replaceChildren();
      state.views.forEach(function (v) {
        var b = el("button", v.name === state.view ? "active" : "", v.title);
        b.dataset.view = v.name;
        b.setAttribute("role", "tab");
        b.setAttribute("aria-selected", v.name === state.view ? "true" : "false");
        b.addEventListener("click", function () {
          state.view = v.name;
          state.params = state.params.job ? { job: state.params.job } : {};
          toHash(state.view, state.params);
          main.replaceChildren();
          tabs();
          load();
        });
        nav.appendChild(b);
      });
    }

    function poll() {
      getJSON("/api/poll").then(function (body) {
        var sig = JSON.stringify(body.jobs);
        var live = document.getElementById("live");
        var running = body.jobs.some(function (j) { return j.ended === false; });
        live.textContent = running ? "live: watching for new steps" : "all jobs ended";
        if (sig !== state.sig) {
          load();
          // a job that grew may have gained views (workers, XGBoost)
          getJSON("/api/jobs").then(function (b) {
            if (JSON.stringify(b.views) !== JSON.stringify(state.views)) { state.views = b.views; tabs(); }
          }).catch(function () { /* the next poll says */ });
        }
        state.sig = sig;
      }).catch(function (e) { showError("poll: " + (e.message || e)); })
        .then(function () { setTimeout(poll, pollMs); });
    }

    // the job picker: the jobs a view overlays (each in its colour, in every view)
    function picker(list) {
      var jobs = document.getElementById("jobs");
      jobs.replaceChildren();
      jobs.setAttribute("role", "group");
      jobs.setAttribute("aria-label", "jobs shown");
      var picked = state.params.job;
      list.forEach(function (j) {
        var lab = el("label", "job");
        lab.title = j.path;
        var box = el("input");
        box.type = "checkbox";
        box.value = String(j.index);
        box.dataset.job = String(j.index);
        box.checked = !picked || picked.indexOf(String(j.index)) >= 0;
        box.addEventListener("change", function () {
          var on = Array.prototype.filter.call(jobs.querySelectorAll("input[data-job]"), function (b) { return b.checked; })
            .map(function (b) { return b.value; });
          if (!on.length) { box.checked = true; return; }  // at least one job
          if (on.length === list.length) delete state.params.job; else state.params.job = on;
          toHash(state.view, state.params);
          load();
        });
        lab.appendChild(box);
        lab.appendChild(swatch(j.index));
        lab.appendChild(document.createTextNode(j.name));
        jobs.appendChild(lab);
      });
    }

    zoomSource = function (meta, lo, hi) {
      var q = new URLSearchParams({ job: String(meta.job), tensor: meta.tensor, mode: meta.mode, lo: String(lo), hi: String(hi) });
      return getJSON("/api/series?" + q.toString());
    };
    curveListeners.push(function () { toHash(state.view, state.params); });

    early = early || { jobs: getJSON("/api/jobs") };
    early.jobs.then(function (body) {
      picker(body.jobs);
      state.views = body.views;
      tabs();
      return load(early.view);
    }).then(function () { setTimeout(poll, pollMs); })
      .catch(function (e) { showError(String(e.message || e)); });
  }

  // The live page loads this script before plotly.js: its first requests run while plotly.js is parsed.
  var me = document.currentScript;
  var early = null;
  if (me && me.dataset.mode === "live") {
    var first = fromHash();
    early = { jobs: getJSON("/api/jobs"), view: getJSON(viewPath(first.view, first.params)).then(function (b) {
      mark("tt-view-data");
      return b;
    }), first: first };
    [early.jobs, early.view].forEach(function (p) { p.catch(function () { /* shown later */ }); });
  }

  function start() {
    mark("tt-plotly-ready");
    if (typeof window.ttReportData === "string") runReport(JSON.parse(window.ttReportData));
    else runLive(early);
  }

  window.tensortap = { renderBlocks: renderBlocks };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
