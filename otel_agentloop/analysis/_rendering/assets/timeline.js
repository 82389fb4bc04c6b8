
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("timeline-data").textContent);
  var PH_LABEL = {generate_sequences: "generation", tool_calls: "tool", compute_score: "reward"};
  var ENGINE = ["queue", "prefill", "decode"];
  var span = Math.max(D.span_ms, 1e-3);

  function h(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function pct(ms) { return (100 * ms / span) + "%"; }
  function secs(x) { return (x < 10 ? x.toFixed(3) : x.toFixed(2)) + " s"; }
  function niceStep(total, n) {
    var raw = total / n, p = Math.pow(10, Math.floor(Math.log10(raw))), m = raw / p;
    return p * (m < 1.5 ? 1 : m < 3 ? 2 : m < 7 ? 5 : 10);
  }
  function sampleName(s) { return "sample " + s.i + " / rollout " + s.r; }
  function stateText(s) {
    var seen = s.snap !== null ? " at +" + secs(s.snap / 1e3) : "";
    if (s.st === "hung") {
      return "HUNG in " + (PH_LABEL[s.cur] || s.cur) + ": still running when the step was collected (reported" +
        seen + (s.ended ? "; ended at +" + secs(s.e / 1e3) + ", after the collect" : "; no end") + ")";
    }
    if (s.st === "slow") return "slow (watchdog reported it" + seen + ", finished before the collect)";
    if (s.st === "failed") return "FAILED";
    return "ok" + (s.errs ? " (" + s.errs + " error span" + (s.errs > 1 ? "s" : "") + ")" : "");
  }

  // -- header ----------------------------------------------------------------------------------
  var c = D.counts, slow = null;
  D.samples.forEach(function (s) { if (s.slowest) slow = s; });
  document.getElementById("title").textContent =
    "Step " + D.step + (D.validate ? " (validation)" : "") + ": " + D.samples.length + " samples on one time axis";
  document.getElementById("summary").textContent =
    (c.failed || 0) + " failed · " + (c.hung || 0) + " hung · " + (c.slow || 0) + " slow · step span " +
    secs(D.span_ms / 1e3) +
    (slow ? " · slowest: " + sampleName(slow) + " (" + secs(slow.tot) + " gen+tool+score" +
            (slow.cause ? "; " + slow.cause : "") + ")" : "") +
    (D.verdicts_from === "summary" ? " · hung/slow as collected (step summary)" :
     D.verdicts_from === "snapshots" ? " · hung/slow from watchdog snapshots" : "") +
    (D.source ? " · from " + D.source : "");
  var legend = document.getElementById("legend");
  [["var(--gen)", "generation"], ["var(--tool)", "tool call"], ["var(--score)", "reward"], ["var(--err)", "error"],
   ["repeating-linear-gradient(45deg,#DD8452 0 3px,#fff 3px 6px)", "open phase of a hung sample"]
  ].concat(D.engine ? [["#c9d6ee", "engine queue"], ["#8fa8d6", "engine prefill"], ["#1f3a68", "engine decode"]] : []
  ).forEach(function (x) {
    var item = h("span"), chip = h("span", "chip");
    chip.style.background = x[0];
    item.appendChild(chip); item.appendChild(document.createTextNode(x[1])); legend.appendChild(item);
  });
  legend.appendChild(h("span", null, "hung first, then by end time, last-ending first; overlapping bars are " +
                                    "parallel calls"));

  // -- axis and grid ---------------------------------------------------------------------------
  var axis = document.getElementById("axis"), grid = document.getElementById("grid");
  var stepS = niceStep(span / 1e3, 8);
  var axisTrack = h("div"); axisTrack.style.cssText = "position:absolute;left:var(--label);right:8px;top:0;bottom:0";
  axis.appendChild(axisTrack);
  for (var t = 0; t <= span / 1e3 + 1e-9; t += stepS) {
    var lab = h("span", null, (+t.toFixed(6)) + " s"); lab.style.left = pct(t * 1e3); axisTrack.appendChild(lab);
    var line = h("i"); line.style.left = pct(t * 1e3); grid.appendChild(line);
  }

  // -- rows --------------------------------------------------------------------------------------
  var rows = document.getElementById("rows"), tip = document.getElementById("tip");
  var selectedRow = null, found = {};
  D.samples.forEach(function (s, n) {
    var row = h("div", "row" + (s.st === "hung" ? " hung" : "") + (s.st === "failed" ? " failed" : ""));
    row.setAttribute("data-sample", s.i + "/" + s.r);
    row.setAttribute("data-trace-id", s.tid);
    row.setAttribute("data-state", s.st);
    if (s.slowest) row.setAttribute("data-slowest", "true");
    var laneH = s.lanes > 1 ? 7 : 12;
    row.style.height = (s.lanes * laneH + 6) + "px";
    var label = h("div", "label");
    label.appendChild(h("span", null, s.i + "/" + s.r));
    if (s.slowest) label.appendChild(h("span", "tag slowest", "slowest"));
    if (s.st === "hung") label.appendChild(h("span", "tag hung", "HUNG"));
    if (s.st === "slow") label.appendChild(h("span", "tag slow", "slow"));
    if (s.st === "failed") label.appendChild(h("span", "tag failed", "failed"));
    row.appendChild(label);
    var track = h("div", "track");
    var life = h("div", "life"); life.style.left = pct(s.s); life.style.width = pct(s.e - s.s); track.appendChild(life);
    s.bars.forEach(function (b, k) {
      var bar = h("div", "bar p" + b[0] + (b[5] ? " err" : "") + (b[6] ? " open" : ""));
      bar.style.left = pct(b[2]); bar.style.width = pct(Math.max(b[3] - b[2], 0));
      bar.style.top = (3 + b[4] * laneH) + "px"; bar.style.height = (laneH - 1) + "px";
      bar.setAttribute("data-bar", String(k));
      engineParts(bar, b[7], b[2], b[3], String(k));
      track.appendChild(bar);
    });
    if (s.snap !== null) {
      var snap = h("div", "snap"); snap.style.left = pct(s.snap); track.appendChild(snap);
    }
    if (s.st === "hung") {
      var mark = h("span", "end-mark", s.ended ? "hung at collect" : "still open"); mark.style.left = pct(s.e);
      if (s.e > 0.8 * span) mark.style.transform = "translate(calc(-100% - 4px), -50%)";  // inside, at the edge
      track.appendChild(mark);
    }
    row.appendChild(track);
    row.addEventListener("mousemove", function (ev) { showTip(s, ev); });
    row.addEventListener("mouseleave", function () { tip.hidden = true; });
    row.addEventListener("click", function () { select(s, row); });
    rows.appendChild(row);
    found[s.i + "/" + s.r] = found[s.i + "/" + s.r] || [s, row];
    found[s.tid] = found[s.tid] || [s, row];
  });

  // -- each engine's load under the samples, on their axis: KV cache usage shaded (0-100 %), running and waiting
  // requests as lines (one scale for every engine), preemptions as red marks; drawn on a canvas per engine --------
  var engines = document.getElementById("engines"), loadDraws = [];
  if (D.engines.length) {
    var loadTop = 1;
    D.engines.forEach(function (g) { loadTop = Math.max(loadTop, Math.max.apply(null, g.running.concat(g.waiting))); });
    var headRow = h("div", "eng-head", "engine load under these samples: ");
    [["#b9cbe8", "KV cache usage (0-100 %)"], ["#1f3a68", "running"], ["#DD8452", "waiting (requests, 0-" + loadTop +
      ")"], ["#C44E52", "preemption"]].forEach(function (x) {
      var chip = h("span", "chip"); chip.style.background = x[0];
      headRow.appendChild(chip); headRow.appendChild(document.createTextNode(x[1] + "  "));
    });
    engines.appendChild(headRow);
    D.engines.forEach(function (g) {
      var peak = Math.max.apply(null, g.kv.concat([0])), pre = g.preempted.reduce(function (a, b) { return a + b; }, 0);
      var row = h("div", "eng-row"); row.setAttribute("data-engine", g.engine);
      var label = h("div", "label eng-label");
      label.appendChild(h("span", "mono", g.engine));
      label.appendChild(h("span", "eng-peak", "KV " + Math.round(peak * 100) + " % · " + pre + " preempted"));
      row.appendChild(label);
      var track = h("div", "track"), canvas = h("canvas", "eng-plot");
      canvas.setAttribute("data-points", String(g.t.length));
      canvas.setAttribute("data-preempted", String(g.preempted.filter(function (p) { return p > 0; }).length));
      track.appendChild(canvas);
      row.appendChild(track);
      loadDraws.push(function () { drawLoad(canvas, g, loadTop); });
      row.addEventListener("mousemove", function (ev) {
        var box = track.getBoundingClientRect(), at = span * (ev.clientX - box.left) / Math.max(box.width, 1), k = 0;
        g.t.forEach(function (t, j) { if (Math.abs(t - at) < Math.abs(g.t[k] - at)) k = j; });
        tip.replaceChildren();
        tip.appendChild(h("div", null, "engine " + g.engine + " at +" + secs(g.t[k] / 1e3)));
        tip.appendChild(h("div", "mono", "running " + g.running[k] + " · waiting " + g.waiting[k] + " · KV cache " +
                                         Math.round(g.kv[k] * 100) + " % · preempted " + g.preempted[k]));
        tip.hidden = false; tip.style.left = (ev.clientX + 14) + "px"; tip.style.top = (ev.clientY + 14) + "px";
      });
      row.addEventListener("mouseleave", function () { tip.hidden = true; });
      engines.appendChild(row);
    });
    var redraw = function () { loadDraws.forEach(function (f) { f(); }); };
    redraw();
    window.addEventListener("resize", redraw);
  }
  function drawLoad(canvas, g, top) {
    var dpr = window.devicePixelRatio || 1, W = canvas.parentElement.clientWidth || 600, H = 40;
    canvas.width = Math.round(W * dpr); canvas.height = Math.round(H * dpr);
    canvas.style.width = W + "px"; canvas.style.height = H + "px";
    var c = canvas.getContext("2d"); c.scale(dpr, dpr);
    var x = function (ms) { return W * ms / span; }, y = function (v, m) { return H - 2 - (H - 4) * v / m; };
    c.fillStyle = "#b9cbe8"; c.beginPath(); c.moveTo(x(g.t[0]), H);
    g.t.forEach(function (t, k) { c.lineTo(x(t), y(g.kv[k], 1)); });
    c.lineTo(x(g.t[g.t.length - 1]), H); c.closePath(); c.fill();
    [["running", "#1f3a68"], ["waiting", "#DD8452"]].forEach(function (s) {
      c.strokeStyle = s[1]; c.lineWidth = 1.5; c.beginPath();
      g.t.forEach(function (t, k) { if (k) c.lineTo(x(t), y(g[s[0]][k], top)); else c.moveTo(x(t), y(g[s[0]][k], top)); });
      c.stroke();
    });
    c.fillStyle = "#C44E52";
    g.t.forEach(function (t, k) { if (g.preempted[k] > 0) c.fillRect(x(t) - 1, 0, 3, 8); });
  }

  // -- a link to one sample's waterfall: page.html#trace=ID&sample=I/R (the sample wins; a trace holds several
  // samples with --trace-per step) ----------------------------------------------------------------------------
  function fromHash() {
    var want = {};
    window.location.hash.replace(/^#/, "").split("&").forEach(function (kv) {
      var at = kv.indexOf("="); if (at > 0) want[kv.slice(0, at)] = decodeURIComponent(kv.slice(at + 1));
    });
    var hit = (want.sample && found[want.sample]) || (want.trace && found[want.trace]);
    if (!hit) return;
    select(hit[0], hit[1]); hit[1].scrollIntoView({block: "center"});
  }
  window.addEventListener("hashchange", fromHash);

  // the engine's queue, prefill and decode drawn inside a turn's bar (parts: [[part, start ms, end ms], ...])
  function engineParts(bar, parts, s, e, k) {
    if (!parts) return;
    var len = Math.max(e - s, 1e-6);
    parts.forEach(function (p) {
      var x = h("span", "eng e" + p[0]);
      x.style.left = (100 * (p[1] - s) / len) + "%"; x.style.width = (100 * (p[2] - p[1]) / len) + "%";
      x.setAttribute("data-engine", ENGINE[p[0]]);
      if (k !== null) x.setAttribute("data-bar", k);
      bar.appendChild(x);
    });
  }

  function showTip(s, ev) {
    tip.replaceChildren();
    tip.appendChild(h("div", null, sampleName(s) + " · step " + D.step + (D.validate ? " (validation)" : "")));
    tip.appendChild(h("div", "mono", "trace " + s.tid));
    tip.appendChild(h("div", null, stateText(s)));
    if (s.cause) tip.appendChild(h("div", null, "cause: " + s.cause));
    tip.appendChild(h("div", null, "start +" + secs(s.s / 1e3) + " · end +" + secs(s.e / 1e3) +
                                   " · gen+tool+score " + secs(s.tot)));
    tip.appendChild(h("div", null, D.phases.map(function (p, k) {
      return PH_LABEL[p] + " " + secs(s.ph[k]);
    }).join(" · ")));
    var k = ev.target && ev.target.getAttribute ? ev.target.getAttribute("data-bar") : null;
    if (k !== null) {
      var b = s.bars[+k];
      tip.appendChild(h("div", "mono", "▶ " + D.names[b[1]] + ": " + secs((b[3] - b[2]) / 1e3) + " (+" +
        secs(b[2] / 1e3) + " → +" + secs(b[3] / 1e3) + ")" + (b[5] ? " ERROR" : "") + (b[6] ? " still open" : "")));
      (b[7] || []).forEach(function (p) {
        tip.appendChild(h("div", "mono", "  engine " + ENGINE[p[0]] + " " + secs((p[2] - p[1]) / 1e3)));
      });
    }
    tip.hidden = false;
    var x = ev.clientX + 14, y = ev.clientY + 14;
    if (x + tip.offsetWidth > window.innerWidth) x = ev.clientX - tip.offsetWidth - 10;
    if (y + tip.offsetHeight > window.innerHeight) y = ev.clientY - tip.offsetHeight - 10;
    tip.style.left = x + "px"; tip.style.top = y + "px";
  }

  // -- histograms ----------------------------------------------------------------------------------
  var finished = D.samples.filter(function (s) { return s.st !== "hung"; });
  var hists = [];
  D.phases.concat(["total"]).forEach(function (p, k) {
    var vals = finished.map(function (s) { return p === "total" ? s.tot : s.ph[k]; });
    var box = h("div", "hist"); box.setAttribute("data-phase", p);
    box.appendChild(h("h3", null, p === "total" ? "sample total (gen+tool+score)" : p + " (per sample)"));
    var sorted = vals.slice().sort(function (a, b) { return a - b; });
    var q = function (f) {
      return sorted.length ? sorted[Math.min(sorted.length - 1, Math.floor(f * sorted.length))] : 0;
    };
    var max = sorted.length ? sorted[sorted.length - 1] : 0;
    box.appendChild(h("div", "stats", "p50 " + secs(q(0.5)) + " · p90 " + secs(q(0.9)) + " · max " + secs(max) +
                                      " · n " + vals.length));
    var plot = h("div", "plot"), nb = 24, counts = new Array(nb).fill(0), top = Math.max(max, 1e-9);
    vals.forEach(function (v) { counts[Math.min(nb - 1, Math.floor(nb * v / top))]++; });
    var cmax = Math.max.apply(null, counts.concat([1]));
    counts.forEach(function (n, i) {
      var b = h("b"); b.style.height = (100 * n / cmax) + "%";
      b.style.background = p === "total" ? "#777" : ["var(--gen)", "var(--tool)", "var(--score)"][k];
      b.title = n + " samples in " + secs(i * top / nb) + " to " + secs((i + 1) * top / nb);
      plot.appendChild(b);
    });
    var marker = h("div", "marker"); marker.hidden = true; plot.appendChild(marker);
    box.appendChild(plot);
    var range = h("div", "range");
    range.appendChild(h("span", null, "0")); range.appendChild(h("span", null, secs(max)));
    box.appendChild(range);
    document.getElementById("hists").appendChild(box);
    hists.push({p: p, k: k, top: top, marker: marker});
  });

  // -- the selected sample's waterfall -----------------------------------------------------------
  function select(s, row) {
    if (selectedRow) selectedRow.classList.remove("selected");
    selectedRow = row; row.classList.add("selected");
    hists.forEach(function (x) {
      var v = x.p === "total" ? s.tot : s.ph[x.k];
      x.marker.hidden = s.st === "hung"; x.marker.style.left = (100 * Math.min(v / x.top, 1)) + "%";
    });
    var d = document.getElementById("detail"); d.replaceChildren();
    d.setAttribute("data-sample", s.i + "/" + s.r);
    d.appendChild(h("h2", null, sampleName(s) + " · step " + D.step + (D.validate ? " (validation)" : "")));
    var ids = h("div", "ids"); ids.appendChild(h("span", "trace-id", s.tid)); d.appendChild(ids);
    d.appendChild(h("div", null, stateText(s) + " · gen+tool+score " + secs(s.tot)));
    if (s.cause) d.appendChild(h("div", "cause", "cause: " + s.cause));
    var own = h("a", "trace-link", "link to this waterfall");
    own.href = "#trace=" + encodeURIComponent(s.tid) + "&sample=" + s.i + "/" + s.r; d.appendChild(own);
    if (D.jaeger) {
      var a = h("a", "jaeger-link", "open this trace in Jaeger");
      a.href = D.jaeger + "/trace/" + encodeURIComponent(s.tid); a.target = "_blank"; a.rel = "noopener noreferrer";
      d.appendChild(document.createTextNode(" · ")); d.appendChild(a);
    }
    var wf = h("div", "waterfall"), t0 = Math.min.apply(null, s.wf.map(function (w) { return w[2]; }));
    var t1 = Math.max.apply(null, s.wf.map(function (w) { return w[3]; })), tot = Math.max(t1 - t0, 1e-3);
    var head = h("div", "wf-row"); head.appendChild(h("span", "wf-name", "span"));
    head.appendChild(h("span", "wf-track-head", "0 … " + secs(tot / 1e3))); wf.appendChild(head);
    s.wf.forEach(function (w) {
      var r = h("div", "wf-row" + (w[4] ? " err" : "") + (w[6] ? " snapshot" : ""));
      var name = h("span", "wf-name", D.names[w[1]]); name.style.paddingLeft = (w[0] * 12) + "px";
      name.title = D.names[w[1]];
      var tr = h("span", "wf-track"), bar = h("span", "bar"), ph = -1;
      s.bars.forEach(function (b) { if (b[1] === w[1] && b[2] === w[2]) ph = b[0]; });
      bar.className = "bar p" + ph + (w[4] ? " err" : "") + (w[6] ? " open" : "");
      bar.style.top = "1px"; bar.style.height = "10px";
      bar.style.left = (100 * (w[2] - t0) / tot) + "%"; bar.style.width = (100 * (w[3] - w[2]) / tot) + "%";
      engineParts(bar, w[7], w[2], w[3], null);
      tr.appendChild(bar);
      r.appendChild(name); r.appendChild(tr); r.appendChild(h("span", "wf-dur", secs((w[3] - w[2]) / 1e3)));
      wf.appendChild(r);
      if (D.names[w[5]]) wf.appendChild(h("div", "wf-info", D.names[w[5]]));
      if (w[7]) wf.appendChild(h("div", "wf-eng", "engine: " + D.names[w[8]]));
    });
    d.appendChild(wf);
  }
  fromHash();
})();
