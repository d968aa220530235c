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

  // Draws `blocks` into `container`, reusing figure divs of the same id (so a live redraw updates the
  // plot in place). Returns a promise that resolves once every figure is drawn.
  function renderBlocks(container, blocks, onChoice) {
    var old = {};
    container.querySelectorAll("div.figure").forEach(function (d) { old[d.dataset.fig] = d; });
    var nodes = [];
    var drawing = [];
    blocks.forEach(function (b) {
      if (b.type === "heading") {
        nodes.push(el("h3", null, b.text));
      } else if (b.type === "note") {
        nodes.push(el("p", "note", b.text));
      } else if (b.type === "table") {
        nodes.push(renderTable(b));
      } else if (b.type === "choice") {
        if (!onChoice) {
          nodes.push(el("p", "meta", b.label + ": " + labelOf(b)));
          return;
        }
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
        lab.appendChild(sel);
        wrap.appendChild(lab);
        nodes.push(wrap);
      } else if (b.type === "figure") {
        var div = old[b.id] || el("div", "figure");
        div.dataset.fig = b.id;
        div.style.height = (b.height || 360) + "px";
        delete old[b.id];
        nodes.push(div);
        drawing.push([div, b.figure]);
      }
    });
    Object.keys(old).forEach(function (k) { try { Plotly.purge(old[k]); } catch (e) { /* gone */ } });
    container.replaceChildren.apply(container, nodes);
    // One figure per task, in page order: the browser shows each as it is drawn (the report's first
    // screen does not wait for its last figure).
    return drawing.reduce(function (done, p, i) {
      return done.then(function () { return i ? nextTask() : null; }).then(function () {
        return Plotly.react(p[0], p[1].data, p[1].layout, PLOT_CONFIG);
      }).then(function () { if (!window.ttFirstFigureAt) { window.ttFirstFigureAt = performance.now(); } });
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

  // The view and its choices live in the URL's fragment (#view=layers&page=1), so a reload keeps them.
  function fromHash() {
    var q = new URLSearchParams(location.hash.replace(/^#/, ""));
    var params = {};
    q.forEach(function (v, k) { if (k !== "view") params[k] = v; });
    return { view: q.get("view") || "overview", params: params };
  }

  function viewPath(view, params) {
    var q = new URLSearchParams();
    Object.keys(params).forEach(function (k) { if (params[k] != null) q.append(k, params[k]); });
    var s = q.toString();
    return "/api/view/" + encodeURIComponent(view) + (s ? "?" + s : "");
  }

  function toHash(view, params) {
    var q = new URLSearchParams({ view: view });
    Object.keys(params).forEach(function (k) { if (params[k] != null) q.append(k, params[k]); });
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
    doc.jobs.forEach(function (j) { jobs.appendChild(el("span", "job", j.name)); });
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
        return renderBlocks(main, body.blocks, function (param, value) {
          state.params[param] = value;
          toHash(state.view, state.params);
          load();
        }).then(function () { showError(""); markPainted(); });
      }).catch(function (e) { showError(String(e.message || e)); }).then(function () {
        state.loading = false;
        if (state.again) { state.again = false; load(); }
      });
    }

    function tabs() {
      var nav = document.getElementById("tabs");
      nav.replaceChildren();
      state.views.forEach(function (v) {
        var b = el("button", v.name === state.view ? "active" : "", v.title);
        b.dataset.view = v.name;
        b.addEventListener("click", function () {
          state.view = v.name;
          state.params = {};
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

    early = early || { jobs: getJSON("/api/jobs") };
    early.jobs.then(function (body) {
      var jobs = document.getElementById("jobs");
      body.jobs.forEach(function (j) {
        var s = el("span", "job", j.name);
        s.title = j.path;
        jobs.appendChild(s);
      });
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
