
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("run-data").textContent);
  var F = {}; D.fields.forEach(function (name, k) { F[name] = k; });
  var PH_LABEL = {generate_sequences: "generation", tool_calls: "tool calls", compute_score: "reward"};
  var PH_COLOR = {generate_sequences: "#4C72B0", tool_calls: "#DD8452", compute_score: "#55A868"};
  var Q_NAMES = ["p50", "p90", "p99", "max"], Q_ALPHA = [0.35, 0.6, 0.85, 1];
  var PALETTE = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C",
                 "#CCB974", "#64B5CD"];
  var tip = document.getElementById("tip");

  function h(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function secs(x) { return x === null || x === undefined ? "-" : (x < 10 ? x.toFixed(3) : x.toFixed(2)) + " s"; }
  function num(x, d) { return x === null || x === undefined ? "-" : x.toFixed(d); }
  function rgba(hex, a) {
    var n = parseInt(hex.slice(1), 16);
    return "rgba(" + (n >> 16) + "," + ((n >> 8) & 255) + "," + (n & 255) + "," + a + ")";
  }
  function niceStep(total, n) {
    var raw = Math.max(total, 1e-9) / n, p = Math.pow(10, Math.floor(Math.log10(raw))), m = raw / p;
    return p * (m < 1.5 ? 1 : m < 3 ? 2 : m < 7 ? 5 : 10);
  }

  // -- the rows ---------------------------------------------------------------------------------
  var all = D.steps.map(function (r, k) { return {r: r, k: k}; });
  var train = all.filter(function (x) { return !x.r[F.validate]; });
  var val = all.filter(function (x) { return x.r[F.validate]; });
  var rowsByKey = {};

  // -- header -------------------------------------------------------------------------------------
  var samples = 0, failed = 0, hung = 0, slowN = 0, wall = 0;
  all.forEach(function (x) {
    samples += x.r[F.samples]; failed += x.r[F.failed]; hung += x.r[F.hung]; slowN += x.r[F.slow];
    if (!x.r[F.validate]) wall += x.r[F.wall_s];
  });
  var first = train.length ? train[0].r[F.step] : null, last = train.length ? train[train.length - 1].r[F.step] : null;
  var counted = function (n, noun, plural) { return n + " " + (n === 1 ? noun : plural || noun + "s"); };
  document.getElementById("title").textContent = "Run " + D.run + ": " + counted(train.length, "training step") +
    (train.length ? " (" + first + " to " + last + ")" : "") +
    (val.length ? " and " + counted(val.length, "validation pass", "validation passes") : "");
  document.getElementById("summary").textContent = counted(samples, "sample") + " · " + failed + " failed · " + hung +
    " hung · " + slowN + " slow · rollout wall time " + secs(wall) + " in all · service " + D.service +
    (D.attempts.length > 1 ? " · attempts " + D.attempts.join(", ") : "") + (D.source ? " · from " + D.source : "");
  var paged = all.filter(function (x) { return x.r[F.page]; }).length;
  document.getElementById("steps-hint").textContent = paged === all.length ? "Click a step to open its timeline page." :
    paged ? "Click a step to open its timeline page (" + paged + " of " + all.length + " steps have one here)." :
    "No step timeline pages were written with this page (--step-pages); click a step for the command that makes one.";
  var notes = document.getElementById("notes");
  D.notes.forEach(function (n) { notes.appendChild(h("li", null, n)); });

  // -- opening a step -------------------------------------------------------------------------------
  function openStep(x) {
    var page = x.r[F.page];
    if (page) { window.location.href = page; return; }
    var row = rowsByKey[x.k];
    if (row) { row.scrollIntoView({block: "center"}); select(row); }
    var d = document.getElementById("detail"); d.replaceChildren(); d.hidden = false;
    d.appendChild(h("div", null, "Step " + x.r[F.step] + " has no timeline page here. Make one with:"));
    d.appendChild(h("div", "trace-id", "otel-agentloop report --step " + x.r[F.step] +
      (x.r[F.validate] ? " --validate" : "") + " --html step.html"));
  }
  var selected = null;
  function select(row) {
    if (selected) selected.classList.remove("selected");
    selected = row; row.classList.add("selected");
  }

  // -- charts ---------------------------------------------------------------------------------------
  // opts: {el, xs: [rows], series: [{name, color, values(k) -> number|null, stack?}], ymin0, fmt}
  function chart(opts) {
    var el = opts.el, canvas = h("canvas"); el.replaceChildren(canvas);
    var n = opts.xs.length, dpr = window.devicePixelRatio || 1;
    var W = el.clientWidth || 600, H = el.clientHeight || 160;
    canvas.width = Math.round(W * dpr); canvas.height = Math.round(H * dpr);
    var g = canvas.getContext("2d"); g.scale(dpr, dpr);
    var L = 52, R = 8, T = 6, B = 20, pw = Math.max(W - L - R, 10), ph = Math.max(H - T - B, 10);
    var top = 0;
    for (var k = 0; k < n; k++) {
      var stack = 0;
      opts.series.forEach(function (s) {
        var v = s.values(opts.xs[k]);
        if (v === null || v === undefined) return;
        if (s.stack) { stack += v; top = Math.max(top, stack); } else top = Math.max(top, v);
      });
    }
    top = top > 0 ? top * 1.05 : 1;
    var yt = opts.integer ? Math.max(1, Math.round(niceStep(top, 4))) : niceStep(top, 4);
    g.font = "11px system-ui,sans-serif"; g.fillStyle = "#555"; g.strokeStyle = "#eee"; g.lineWidth = 1;
    for (var y = 0; y <= top + 1e-12; y += yt) {
      var py = T + ph - ph * y / top;
      g.beginPath(); g.moveTo(L, py + 0.5); g.lineTo(L + pw, py + 0.5); g.stroke();
      g.textAlign = "right"; g.fillText(opts.fmt ? opts.fmt(y) : (+y.toPrecision(3)) + "", L - 4, py + 4);
    }
    var bw = pw / Math.max(n, 1);
    function xOf(k) { return L + bw * (k + 0.5); }
    if (n) {
      var xt = Math.max(1, Math.ceil(n / Math.max(1, Math.floor(pw / 70))));
      g.textAlign = "center";
      for (var k2 = 0; k2 < n; k2 += xt) g.fillText(String(opts.xs[k2].r[F.step]), xOf(k2), H - 5);
    }
    var base = new Float64Array(n);
    opts.series.forEach(function (s) {
      if (s.stack) {
        g.fillStyle = s.color;
        for (var k = 0; k < n; k++) {
          var v = s.values(opts.xs[k]);
          if (!v) continue;
          var y0 = T + ph - ph * base[k] / top, y1 = T + ph - ph * (base[k] + v) / top;
          g.fillRect(L + bw * k + (bw > 3 ? 0.5 : 0), y1, Math.max(bw - (bw > 3 ? 1 : 0), 0.6), y0 - y1);
          base[k] += v;
        }
      } else {
        g.strokeStyle = s.color; g.lineWidth = s.width || 1.4; g.beginPath();
        var pen = false;
        for (var k = 0; k < n; k++) {
          var v = s.values(opts.xs[k]);
          if (v === null || v === undefined) { pen = false; continue; }
          var px = xOf(k), py = T + ph - ph * v / top;
          if (pen) g.lineTo(px, py); else g.moveTo(px, py);
          pen = true;
          if (n < 60) g.fillRect(px - 1.5, py - 1.5, 3, 3);
        }
        g.stroke();
      }
    });
    function at(ev) {
      var rect = canvas.getBoundingClientRect(), k = Math.floor((ev.clientX - rect.left - L) / bw);
      return k >= 0 && k < n ? opts.xs[k] : null;
    }
    canvas.addEventListener("mousemove", function (ev) {
      var x = at(ev);
      if (!x) { tip.hidden = true; return; }
      tip.replaceChildren();
      tip.appendChild(h("div", null, "step " + x.r[F.step] + " · " + x.r[F.samples] + " samples"));
      opts.series.forEach(function (s) {
        var v = s.values(x);
        tip.appendChild(h("div", null, s.name + ": " + (opts.fmt ? opts.fmt(v) : v === null ? "-" : secs(v))));
      });
      if (x.r[F.slowest_trace]) tip.appendChild(h("div", "mono", "slowest " + x.r[F.slowest_index] + "/" +
        x.r[F.slowest_rollout] + " · trace " + x.r[F.slowest_trace]));
      if (x.r[F.slowest_cause]) tip.appendChild(h("div", null, "why: " + x.r[F.slowest_cause]));
      tip.appendChild(h("div", null, x.r[F.page] ? "click: open the step's timeline" : "click: find the step"));
      tip.hidden = false;
      var px = ev.clientX + 14, py = ev.clientY + 14;
      if (px + tip.offsetWidth > window.innerWidth) px = ev.clientX - tip.offsetWidth - 10;
      if (py + tip.offsetHeight > window.innerHeight) py = ev.clientY - tip.offsetHeight - 10;
      tip.style.left = px + "px"; tip.style.top = py + "px";
    });
    canvas.addEventListener("mouseleave", function () { tip.hidden = true; });
    canvas.addEventListener("click", function (ev) { var x = at(ev); if (x) openStep(x); });
    el.setAttribute("data-points", String(n));
  }
  function legend(el, items) {
    el.replaceChildren();
    items.forEach(function (it) {
      var s = h("span"), c = h("span", "chip"); c.style.background = it[1];
      s.appendChild(c); s.appendChild(document.createTextNode(it[0])); el.appendChild(s);
    });
  }
  function q(list, k, i) { var v = list[k]; return v ? v[i] : null; }

  var draws = [];
  legend(document.getElementById("wall-legend"), [["until the median sample finished", "#4C72B0"],
    ["tail (median to the last sample)", "#DD8452"]]);
  draws.push(function () {
    chart({el: document.getElementById("wall"), xs: train, series: [
      {name: "until median", color: "#4C72B0", stack: true, values: function (x) { return x.r[F.median_s]; }},
      {name: "tail", color: "#DD8452", stack: true, values: function (x) { return x.r[F.tail_s]; }}]});
  });
  legend(document.getElementById("verdict-legend"), [["failed", "#C44E52"], ["hung", "#6a1b1d"],
    ["slow", "#b8860b"]]);
  draws.push(function () {
    chart({el: document.getElementById("verdicts"), xs: train, integer: true, fmt: function (v) {
      return v === null ? "-" : String(Math.round(v)); }, series: [
      {name: "failed", color: "#C44E52", stack: true, values: function (x) { return x.r[F.failed]; }},
      {name: "hung", color: "#6a1b1d", stack: true, values: function (x) { return x.r[F.hung]; }},
      {name: "slow", color: "#b8860b", stack: true, values: function (x) { return x.r[F.slow]; }}]});
  });
  var grid = document.getElementById("phase-charts");
  Object.keys(D.phases).forEach(function (p) {
    var box = h("section", "panel"), title = h("h2", null, (PH_LABEL[p] || p) + " per sample: p50/p90/p99/max");
    var lg = h("div", "legend"), el = h("div", "chart");
    el.id = "phase-" + p;
    box.appendChild(title); box.appendChild(lg); box.appendChild(el); grid.appendChild(box);
    legend(lg, Q_NAMES.map(function (name, i) { return [name, rgba(PH_COLOR[p] || "#777777", Q_ALPHA[i])]; }));
    draws.push(function () {
      chart({el: el, xs: train, series: Q_NAMES.map(function (name, i) {
        return {name: name, color: rgba(PH_COLOR[p] || "#777777", Q_ALPHA[i]),
                values: function (x) { return q(D.phases[p], x.k, i); }};
      })});
    });
  });
  var toolNames = Object.keys(D.tools);
  if (!toolNames.length) document.getElementById("tools-panel").hidden = true;
  var toolQ = document.getElementById("tool-q");
  legend(document.getElementById("tool-legend"), toolNames.map(function (t, i) {
    return [t, PALETTE[i % PALETTE.length]]; }));
  function drawTools() {
    if (!toolNames.length) return;
    var i = +toolQ.value;
    chart({el: document.getElementById("tools"), xs: train, series: toolNames.map(function (t, n) {
      return {name: t + " " + Q_NAMES[i], color: PALETTE[n % PALETTE.length],
              values: function (x) { return q(D.tools[t], x.k, i); }};
    })});
  }
  toolQ.addEventListener("change", drawTools);
  draws.push(drawTools);
  if (train.some(function (x) { return x.r[F.staleness_mean] !== null; })) {
    document.getElementById("stale-panel").hidden = false;
    draws.push(function () {
      chart({el: document.getElementById("stale"), xs: train, fmt: function (v) { return num(v, 2); }, series: [
        {name: "mean", color: "#8172B3", values: function (x) { return x.r[F.staleness_mean]; }},
        {name: "max", color: "#C44E52", values: function (x) { return x.r[F.staleness_max]; }}]});
    });
  }

  if (train.some(function (x) { return x.r[F.kv_peak] !== null || x.r[F.preemptions] !== null; })) {
    document.getElementById("engine-panel").hidden = false;
    legend(document.getElementById("engine-legend"), [["peak KV cache usage %", "#4C72B0"],
      ["preemptions", "#C44E52"]]);
    draws.push(function () {
      chart({el: document.getElementById("kv-peak"), xs: train, fmt: function (v) {
        return v === null ? "-" : num(v, 0) + " %"; }, series: [
        {name: "peak KV cache usage", color: "#4C72B0", values: function (x) {
          return x.r[F.kv_peak] === null ? null : 100 * x.r[F.kv_peak]; }}]});
      chart({el: document.getElementById("preempted"), xs: train, integer: true, fmt: function (v) {
        return v === null ? "-" : String(Math.round(v)); }, series: [
        {name: "preemptions", color: "#C44E52", stack: true, values: function (x) { return x.r[F.preemptions]; }}]});
    });
  }

  // -- tables ---------------------------------------------------------------------------------------
  var HEAD = ["step", "samples", "wall", "to median", "tail", "slowest sample", "phase mix (gen/tool/reward)",
              "failed", "hung", "slow", "staleness", "slowest trace", "engine"];
  function table(id, xs) {
    var t = document.getElementById(id), head = t.tHead, body = t.tBodies[0], tr = h("tr");
    HEAD.forEach(function (name, i) { tr.appendChild(h("th", i === 5 || i === 11 ? "id" : null, name)); });
    head.appendChild(tr);
    var frag = document.createDocumentFragment();
    xs.forEach(function (x) {
      var r = x.r, row = h("tr", "step-row");
      row.setAttribute("data-step", String(r[F.step]));
      row.setAttribute("data-validate", r[F.validate] ? "true" : "false");
      var first = h("td");
      if (r[F.page]) {
        var a = h("a", "step-link", String(r[F.step])); a.setAttribute("href", r[F.page]); first.appendChild(a);
      } else first.textContent = String(r[F.step]);
      if (r[F.rebuilt]) {
        var mark = h("span", "rebuilt", " *"); mark.title = "no stored summary: rebuilt from the spans";
        first.appendChild(mark);
      }
      row.appendChild(first);
      row.appendChild(h("td", null, r[F.samples]));
      row.appendChild(h("td", null, secs(r[F.wall_s])));
      row.appendChild(h("td", null, secs(r[F.median_s])));
      row.appendChild(h("td", null, secs(r[F.tail_s])));
      var who = h("td", "id");
      if (r[F.slowest_index] !== null) {
        who.appendChild(document.createTextNode(r[F.slowest_index] + "/" + r[F.slowest_rollout] + " " +
          secs(r[F.gen_s] + r[F.tool_s] + r[F.score_s])));
        if (r[F.slowest_verdict] && r[F.slowest_verdict] !== "ok") {
          who.appendChild(h("span", "verdict " + r[F.slowest_verdict], r[F.slowest_verdict]));
        }
        if (r[F.slowest_cause]) who.appendChild(h("div", "cause", r[F.slowest_cause]));
      } else who.textContent = "-";
      row.appendChild(who);
      var mixCell = h("td"), mix = h("span", "mix"), tot = Math.max(r[F.gen_s] + r[F.tool_s] + r[F.score_s], 1e-9);
      [[F.gen_s, "#4C72B0"], [F.tool_s, "#DD8452"], [F.score_s, "#55A868"]].forEach(function (c) {
        var seg = h("i"); seg.style.width = (100 * r[c[0]] / tot) + "%"; seg.style.background = c[1];
        mix.appendChild(seg);
      });
      mixCell.title = "generation " + secs(r[F.gen_s]) + " · tool " + secs(r[F.tool_s]) + " · reward " +
        secs(r[F.score_s]);
      mixCell.appendChild(mix);
      mixCell.appendChild(document.createTextNode(" " + num(r[F.gen_s], 2) + "/" + num(r[F.tool_s], 2) + "/" +
        num(r[F.score_s], 2)));
      row.appendChild(mixCell);
      [F.failed, F.hung, F.slow].forEach(function (f) { row.appendChild(h("td", r[f] ? "bad" : null, r[f])); });
      row.appendChild(h("td", null, r[F.staleness_mean] === null ? "-" : num(r[F.staleness_mean], 2) + " (max " +
        num(r[F.staleness_max], 2) + ")"));
      var trace = h("td", "id");
      if (r[F.slowest_trace]) {
        trace.appendChild(h("span", "trace-id", r[F.slowest_trace]));
        if (D.jaeger) {
          var j = h("a", "jaeger-link", " Jaeger");
          j.setAttribute("href", D.jaeger + "/trace/" + encodeURIComponent(r[F.slowest_trace]));
          j.target = "_blank"; j.rel = "noopener noreferrer"; trace.appendChild(j);
        } else if (r[F.page]) {  // the sample's waterfall on the step's timeline page
          var w = h("a", "trace-link", " waterfall");
          w.setAttribute("href", r[F.page] + "#trace=" + encodeURIComponent(r[F.slowest_trace]) + "&sample=" +
            r[F.slowest_index] + "/" + r[F.slowest_rollout]);
          trace.appendChild(w);
        }
      } else trace.textContent = "-";
      row.appendChild(trace);
      var kv = r[F.kv_peak], pre = r[F.preemptions];
      row.appendChild(h("td", pre ? "bad engine" : "engine", kv === null && pre === null ? "-" :
        (kv === null ? "" : "KV " + Math.round(100 * kv) + " %") + (kv !== null && pre !== null ? " · " : "") +
        (pre === null ? "" : pre + " preempted")));
      row.addEventListener("click", function (ev) {
        if (ev.target && ev.target.tagName === "A") return;  // the link itself navigates
        select(row); openStep(x);
      });
      rowsByKey[x.k] = row;
      frag.appendChild(row);
    });
    body.appendChild(frag);
  }
  table("steps", train);
  if (val.length) { document.getElementById("val-panel").hidden = false; table("val-steps", val); }

  function drawAll() { draws.forEach(function (f) { f(); }); }
  drawAll();
  var pending = null;
  window.addEventListener("resize", function () {
    if (pending) clearTimeout(pending);
    pending = setTimeout(drawAll, 120);
  });
  document.body.setAttribute("data-ready", "true");
})();
