// DeepPod console: live charts (uPlot) and the few behaviours htmx does not give by itself.
// Every poll pauses while the tab is hidden and stops once a job has ended.
(function () {
  "use strict";
  document.addEventListener("DOMContentLoaded", function () {
    // show refusals (4xx) where the answer would have gone, not nowhere
    htmx.config.responseHandling = [{code: "204", swap: false}, {code: "[23]..", swap: true},
                                    {code: "[45]..", swap: true, error: true}];
    document.querySelectorAll("table[data-table]").forEach(smallTable);
  });

  // the pages' smaller tables sort (click a heading), filter (the box above) and page in the
  // browser; the jobs table, which can hold thousands, does all three on the server
  const PAGE_ROWS = 25;
  function smallTable(table) {
    const body = table.tBodies[0];
    const rows = [...body.rows].filter(r => !r.querySelector("td[colspan]"));
    if (!rows.length) return;
    let shown = rows, page = 0, by = -1, asc = true;
    const bar = document.createElement("div"); bar.className = "row table-tools";
    const filter = document.createElement("input"); filter.type = "search"; filter.placeholder = "filter";
    filter.setAttribute("aria-label", "filter " + (table.id || "table")); filter.style.width = "14rem";
    const prev = document.createElement("button"), next = document.createElement("button"), where = document.createElement("span");
    prev.type = next.type = "button"; prev.textContent = "←"; next.textContent = "→"; prev.className = next.className = "small-button";
    where.className = "muted";
    bar.append(filter, where, prev, next);
    table.parentNode.insertBefore(bar, table);
    const text = (r, i) => (r.cells[i] ? r.cells[i].innerText.trim() : "");
    function draw() {
      const pages = Math.max(1, Math.ceil(shown.length / PAGE_ROWS));
      page = Math.min(page, pages - 1);
      body.replaceChildren(...shown.slice(page * PAGE_ROWS, (page + 1) * PAGE_ROWS));
      where.textContent = shown.length + " of " + rows.length + (pages > 1 ? " · page " + (page + 1) + " of " + pages : "");
      prev.disabled = page === 0; next.disabled = page >= pages - 1;
      prev.hidden = next.hidden = pages < 2;
    }
    filter.addEventListener("input", () => {
      const q = filter.value.toLowerCase();
      shown = rows.filter(r => r.innerText.toLowerCase().includes(q)); page = 0; draw();
    });
    prev.onclick = () => { page--; draw(); }; next.onclick = () => { page++; draw(); };
    [...table.tHead.rows[0].cells].forEach((th, i) => {
      if (!th.innerText.trim()) return;
      th.classList.add("sortable"); th.tabIndex = 0;
      th.onclick = () => {
        asc = by === i ? !asc : true; by = i;
        const num = v => parseFloat(v.replace(/[^0-9.eE+-]/g, ""));
        shown.sort((a, b) => {
          const x = text(a, i), y = text(b, i), nx = num(x), ny = num(y);
          const c = !isNaN(nx) && !isNaN(ny) ? nx - ny : x.localeCompare(y, undefined, {numeric: true});
          return asc ? c : -c;
        });
        table.tHead.querySelectorAll("th").forEach(h => h.removeAttribute("aria-sort"));
        th.setAttribute("aria-sort", asc ? "ascending" : "descending");
        draw();
      };
    });
    draw();
  }
  const visible = () => document.visibilityState === "visible";
  const PALETTE = ["#2364aa", "#d1495b", "#3da35d", "#edae49", "#6f4e9c", "#00798c", "#8c6b3f", "#e76f51"];

  function every(ms, fn) {
    // fn() returns false to stop; skipped while hidden
    let stopped = false;
    async function tick() {
      if (stopped) return;
      if (visible()) {
        try { if ((await fn()) === false) { stopped = true; return; } } catch (e) { console.warn(e); }
      }
      setTimeout(tick, ms);
    }
    tick();
    document.addEventListener("visibilitychange", () => { /* next tick runs on its own */ });
  }

  // window (seconds, time charts): the x axis always spans the last `window` seconds and the y
  // axis starts at 0, so a chart with one point or none still has sensible axes (uPlot's own
  // range around a single time spans years)
  // the metrics a job's page shows first, and a y axis that does not make 0.33-0.40 look like a
  // cliff: accuracies span 0-1, anything that is never negative starts at 0
  const FIRST = ["loss", "accuracy"];
  const chartRank = n => (FIRST.indexOf(n) >= 0 ? FIRST.indexOf(n) : FIRST.length);
  function yRangeOf(name) {
    return (u, lo, hi) => {
      if (lo === null || hi === null) return [0, 1];
      if (/acc/.test(name) && lo >= 0 && hi <= 1) return [0, 1];
      if (lo >= 0) return [0, hi > 0 ? hi * 1.1 : 1];
      const pad = (hi - lo) * 0.1 || 1;
      return [lo - pad, hi + pad];
    };
  }

  function lineChart(el, title, xLabel, names, time, window, yLabel, xRange, yRange) {
    const width = time ? Math.max(320, el.clientWidth - 8) : Math.max(280, Math.min(el.clientWidth || 520, 560));
    const scales = {x: {time: !!time}};
    if (window) {
      scales.x.range = (u, lo, hi) => { const end = hi || Date.now() / 1000; return [end - window, end]; };
    } else if (xRange) {
      scales.x.range = xRange;
    }
    if (yRange) {
      scales.y = {range: yRange};
    } else if (window || yLabel) {  // counts from zero: 0.06 GPUs is not a peak
      scales.y = {range: (u, lo, hi) => [0, hi > 0 ? hi * 1.1 : 1]};
    }
    const opts = {
      title: title, width: width, height: 220, scales: scales,
      series: [{label: xLabel}].concat(names.map((n, i) => ({label: n, stroke: PALETTE[i % PALETTE.length], width: 1.5, spanGaps: true}))),
      axes: [{label: time ? "" : xLabel}, yLabel ? {label: yLabel} : {}],
    };
    const chart = new uPlot(opts, [[]].concat(names.map(() => [])), el);
    el.uplot = chart;  // for the browser tests: the scales the chart drew
    return chart;
  }

  // one chart per metric, x = step; the server downsamples long series
  function jobCharts(jobId) {
    const box = document.getElementById("charts");
    const charts = {};
    let endedRead = false;  // the last points of an ended job are read: nothing new until it runs again
    every(2000, async function () {
      const status = document.getElementById("job-status");
      if (endedRead && status && status.dataset.final) return true;  // resumed: the status part clears the flag
      const r = await fetch("/jobs/" + jobId + "/metrics.json?max_points=1000", {credentials: "same-origin"});
      if (!r.ok) return true;
      const body = await r.json();
      const names = Object.keys(body.metrics);
      if (names.length) { const empty = document.getElementById("charts-empty"); if (empty) empty.remove(); }
      // a chart per quantity: training and validation together (loss with val_loss); the epoch
      // is how far the steps went, not a curve of its own
      const groups = {};
      for (const name of names) {
        if (name === "epoch") continue;
        const base = name.startsWith("val_") && names.includes(name.slice(4)) ? name.slice(4) : name;
        (groups[base] = groups[base] || []).push(name);
      }
      const order = Object.keys(groups).sort((a, b) => chartRank(a) - chartRank(b) || a.localeCompare(b));
      for (const base of order) {
        const members = groups[base].sort((a, b) => a.length - b.length);  // loss, then val_loss
        const series = members.map(n => body.metrics[n].series.filter(p => p[1] !== null));
        const steps = [...new Set(series.flatMap(pts => pts.map(p => p[0])))].sort((a, b) => a - b);
        const data = [steps].concat(series.map(pts => { const at = new Map(pts); return steps.map(x => at.has(x) ? at.get(x) : null); }));
        const key = members.join(",");
        if (!charts[base] || charts[base].key !== key) {  // new, or a validation series joined it: drawn again in place
          let holder = charts[base] ? charts[base].root.parentElement : null;
          if (holder) { charts[base].destroy(); holder.replaceChildren(); } else {
            holder = document.createElement("div");
            holder.className = "chart"; holder.dataset.metric = base;
            box.appendChild(holder);
          }
          holder.dataset.series = key;
          charts[base] = lineChart(holder, base, "step", members, false, null, null, null, yRangeOf(base));
          charts[base].key = key;
        }
        charts[base].setData(data);
        charts[base].root.parentElement.dataset.points = String(series[0].length);
      }
      histograms(jobId);
      endedRead = !!body.final;
      return true;
    });
  }

  // a job's CPU (cores), memory (MiB) and GPUs (utilization %) over time, as the monitor samples them
  function usageCharts(jobId) {
    const box = document.getElementById("usage");
    const charts = {}, ORDER = ["cpu", "memory", "gpus"];
    // a job's first samples span seconds: drawn across a minute, not across uPlot's guess of years
    const atLeastAMinute = (u, lo, hi) => (lo === null || hi === null ? [Date.now() / 1000 - 60, Date.now() / 1000]
      : hi - lo < 60 ? [hi - 60, hi] : [lo, hi]);
    let endedRead = false;
    function draw(key, title, yLabel, names, data) {
      if (!data[0].length) return;
      const empty = document.getElementById("usage-empty"); if (empty) empty.remove();
      if (!charts[key] || charts[key].names !== names.join()) {
        let holder = charts[key] ? charts[key].root.parentElement : null;
        if (holder) { charts[key].destroy(); holder.replaceChildren(); } else {
          holder = document.createElement("div"); holder.className = "chart"; holder.dataset.usage = key;
          const after = [...box.querySelectorAll(".chart")].find(c => ORDER.indexOf(c.dataset.usage) > ORDER.indexOf(key));
          box.insertBefore(holder, after || null);  // CPU, memory, GPUs, whichever has points first
        }
        charts[key] = lineChart(holder, title, "time", names, true, null, yLabel, atLeastAMinute);
        charts[key].names = names.join();
      }
      const points = data[0].length;  // one point: a blank time a minute before it, as uPlot draws one x as years
      charts[key].setData(points > 1 ? data : data.map((col, i) => [i ? null : col[0] - 60].concat(col)));
      charts[key].root.parentElement.dataset.points = String(points);
    }
    every(5000, async function () {
      const status = document.getElementById("job-status");
      if (endedRead && status && status.dataset.final) return true;
      const r = await fetch("/jobs/" + jobId + "/usage.json", {credentials: "same-origin"});
      if (!r.ok) return true;
      const u = await r.json();
      draw("cpu", "CPU", "cores", ["cores"], [u.cpu.map(p => p[0]), u.cpu.map(p => p[1])]);
      draw("memory", "memory", "MiB", ["resident"], [u.memory_mb.map(p => p[0]), u.memory_mb.map(p => p[1])]);
      const gpus = Object.keys(u.gpus).sort();
      if (gpus.length) {
        const times = [...new Set(gpus.flatMap(g => u.gpus[g].map(p => p[0])))].sort((a, b) => a - b);
        draw("gpus", "GPU utilization", "%", gpus, [times].concat(gpus.map(g => {
          const at = new Map(u.gpus[g].map(p => [p[0], p[1]])); return times.map(t => at.has(t) ? at.get(t) : null);
        })));
      }
      endedRead = !!u.final;
      return true;
    });
  }

  // a search's page: the best value so far over time, every trial's curve of the metric on one
  // chart (x = step; a log scale on demand), and parallel coordinates of parameters to value
  function searchCharts(name, tenant) {
    const url = "/experiments/" + encodeURIComponent(name) + "/data.json?tenant=" + encodeURIComponent(tenant);
    const logBox = document.getElementById("exp-curves-log");
    let best = null, curves = null, last = null, drawnCurves = "", drawnLines = "";
    function drawCurves(d) {
      const numbers = Object.keys(d.curves).map(Number).sort((a, b) => a - b);
      const log = logBox.checked, key = JSON.stringify(d.curves) + log;
      if (!numbers.length || key === drawnCurves) return;
      drawnCurves = key;
      const box = document.getElementById("exp-curves");
      const steps = [...new Set(numbers.flatMap(n => d.curves[n].map(p => p[0])))].sort((a, b) => a - b);
      const data = [steps].concat(numbers.map(n => {
        const at = new Map(d.curves[n].map(p => [p[0], p[1]]));
        return steps.map(s => (at.get(s) != null && (!log || at.get(s) > 0)) ? at.get(s) : null);
      }));
      if (curves && (curves.series.length !== numbers.length + 1 || curves.log !== log)) { curves.destroy(); curves = null; }
      if (!curves) {
        box.querySelectorAll("p.muted").forEach(p => p.remove());
        curves = log ? logChart(box, d.metric + " by trial (log scale)", numbers)
                     : lineChart(box, d.metric + " by trial", "step", numbers.map(n => "trial " + n), false);
        curves.log = log;
      }
      curves.setData(data);
      box.dataset.trials = String(numbers.length);
    }
    logBox.addEventListener("change", () => { if (last) drawCurves(last); });
    every(3000, async function () {
      const r = await fetch(url, {credentials: "same-origin"});
      if (!r.ok) return true;
      const d = last = await r.json();
      const bestBox = document.getElementById("exp-best-chart");
      if (d.best_so_far.length) {
        if (!best) {
          bestBox.replaceChildren();
          best = lineChart(bestBox, "best " + d.metric + " so far", "time", ["best " + d.metric], true);
        }
        // from the search's start to its end (or now), a step at each trial that ended better than all before
        const xs = [d.created_at], ys = [null];
        let prev = null;
        for (const [at, value] of d.best_so_far) {
          if (prev !== null) { xs.push(at); ys.push(prev); }
          xs.push(at); ys.push(value); prev = value;
        }
        xs.push(Math.max(d.ended_at || Date.now() / 1000, xs[xs.length - 1])); ys.push(prev);
        best.setData([xs, ys]);
        bestBox.dataset.points = String(d.best_so_far.length);
      }
      drawCurves(d);
      const lines = JSON.stringify(d.trials.map(t => [t.number, t.value]));
      if (lines !== drawnLines) { drawnLines = lines; parallel(document.getElementById("exp-parallel"), d); }
      document.getElementById("exp-state").textContent = d.state;
      return ["running", "stopping"].includes(d.state);  // an ended search changes no more
    });
  }

  function logChart(el, title, numbers) {
    const opts = {title: title, width: Math.max(280, Math.min(el.clientWidth || 520, 560)), height: 220,
                  scales: {x: {time: false}, y: {distr: 3}},
                  series: [{label: "step"}].concat(numbers.map((n, i) => ({label: "trial " + n, stroke: PALETTE[i % PALETTE.length], width: 1.5, spanGaps: true}))),
                  axes: [{label: "step"}, {}]};
    const chart = new uPlot(opts, [[]].concat(numbers.map(() => [])), el);
    el.uplot = chart;
    return chart;
  }

  // parallel coordinates, drawn as SVG: an axis per parameter (a log axis for a log-scaled one,
  // evenly spaced choices for a categorical one) and one for the value; a line per trial
  function parallel(box, d) {
    const NS = "http://www.w3.org/2000/svg";
    const params = Object.keys(d.space), rows = d.trials.filter(t => t.value !== null);
    if (!rows.length) return;
    const W = Math.max(480, box.clientWidth || 720), H = 260, top = 24, bottom = H - 30;
    const axes = params.map(p => {
      const spec = d.space[p];
      if (spec.type === "categorical") {
        const choices = spec.choices.map(String);
        const pos = v => choices.indexOf(String(v)) / Math.max(1, choices.length - 1);
        return {name: p, pos: pos, ticks: choices.map(c => [c, pos(c)])};
      }
      const lo = Number(spec.low), hi = Number(spec.high), lg = !!spec.log && lo > 0;
      const f = v => lg ? Math.log(v) : v;
      return {name: p, pos: v => (f(v) - f(lo)) / ((f(hi) - f(lo)) || 1), ticks: [[String(lo), 0], [String(hi), 1]]};
    });
    const values = rows.map(t => t.value), vlo = Math.min(...values), vhi = Math.max(...values);
    axes.push({name: d.metric, pos: v => (v - vlo) / ((vhi - vlo) || 1),
               ticks: [[vlo.toPrecision(3), 0], [vhi.toPrecision(3), 1]]});
    const x = i => 40 + i * (W - 80) / Math.max(1, axes.length - 1), y = f => bottom - Math.min(1, Math.max(0, f)) * (bottom - top);
    const svg = document.createElementNS(NS, "svg");
    svg.setAttribute("width", W); svg.setAttribute("height", H); svg.setAttribute("id", "exp-parallel-svg");
    const add = (tag, attrs, text) => { const e = document.createElementNS(NS, tag); for (const k in attrs) e.setAttribute(k, attrs[k]); if (text !== undefined) e.textContent = text; svg.appendChild(e); return e; };
    const better = v => (d.mode === "max" ? (v - vlo) : (vhi - v)) / ((vhi - vlo) || 1);
    rows.slice().sort((a, b) => better(a.value) - better(b.value)).forEach(t => {  // the best drawn last, on top
      const pts = axes.map((a, i) => x(i) + "," + y(i < params.length ? a.pos(t.params[a.name]) : a.pos(t.value)));
      const line = add("polyline", {points: pts.join(" "), fill: "none", stroke: "rgb(35,100,170)", "stroke-width": 1.5,
                                    "stroke-opacity": (0.15 + 0.85 * better(t.value)).toFixed(3), "data-trial": t.number});
      const tip = document.createElementNS(NS, "title"); tip.textContent = "trial " + t.number + ": " + d.metric + " " + t.value.toPrecision(4);
      line.appendChild(tip);
    });
    axes.forEach((a, i) => {
      add("line", {x1: x(i), x2: x(i), y1: top, y2: bottom, stroke: "#888"});
      add("text", {x: x(i), y: H - 10, "text-anchor": "middle", "font-size": 12}, a.name);
      a.ticks.forEach(([label, at]) => add("text", {x: x(i) + 4, y: Math.min(bottom - 2, Math.max(top + 10, y(at) + 4)),
                                                   "font-size": 10, fill: "#666"}, label));
    });
    box.replaceChildren(svg);
    box.dataset.lines = String(rows.length);
  }

  // the jobs page: jobs ticked for a side-by-side view, kept across the table's refreshes and pages
  function pickJobs() {
    const KEY = "deeppod.picked", link = document.getElementById("compare-link");
    const picked = new Set(JSON.parse(sessionStorage.getItem(KEY) || "[]"));
    function show() {
      document.querySelectorAll("#jobs input.pick").forEach(b => { b.checked = picked.has(b.value); });
      link.hidden = picked.size < 2;
      link.href = "/jobs/compare?ids=" + [...picked].join(",");
      document.getElementById("compare-count").textContent = String(picked.size);
    }
    document.addEventListener("change", e => {
      if (!e.target.classList || !e.target.classList.contains("pick")) return;
      if (e.target.checked) picked.add(e.target.value); else picked.delete(e.target.value);
      sessionStorage.setItem(KEY, JSON.stringify([...picked]));
      show();
    });
    document.body.addEventListener("htmx:afterSwap", show);  // the table is redrawn every 5 s
    show();
  }

  // runs side by side: a chart per metric, a line per job; x = step or seconds since the job's
  // first report, exponential smoothing (as TensorBoard's), a log scale
  function compareRuns(ids) {
    const box = document.getElementById("compare-charts");
    const xSel = document.getElementById("compare-x"), smooth = document.getElementById("compare-smooth");
    const logBox = document.getElementById("compare-log");
    let last = null, charts = [];
    const ema = (ys, a) => { let m = null; return ys.map(y => (y === null ? null : (m = m === null ? y : a * m + (1 - a) * y))); };
    function draw() {
      if (!last) return;
      const names = Object.keys(last.metrics).sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
      if (!names.length) return;
      charts.forEach(c => c.destroy());
      charts = [];
      box.replaceChildren();
      const a = Number(smooth.value), byTime = xSel.value === "time", log = logBox.checked;
      document.getElementById("compare-smooth-value").textContent = a.toFixed(2);
      for (const name of names) {
        const runs = last.jobs.filter(j => last.metrics[name][String(j.id)]);
        const xs = [...new Set(runs.flatMap(j => last.metrics[name][String(j.id)].map(p => byTime ? p[2] : p[0])))].sort((p, q) => p - q);
        const data = [xs].concat(runs.map(j => {
          const pts = last.metrics[name][String(j.id)];
          const smoothed = ema(pts.map(p => p[1]), a), at = new Map(pts.map((p, i) => [byTime ? p[2] : p[0], smoothed[i]]));
          return xs.map(x => { const v = at.get(x); return v == null || (log && v <= 0) ? null : v; });
        }));
        const holder = document.createElement("div");
        holder.className = "chart"; holder.dataset.metric = name; holder.dataset.runs = String(runs.length);
        box.appendChild(holder);
        const opts = {title: name, width: Math.max(280, Math.min(holder.clientWidth || 520, 560)), height: 220,
                      scales: {x: {time: false}, y: log ? {distr: 3} : {}},
                      series: [{label: byTime ? "s" : "step"}].concat(runs.map((j, i) => ({label: j.id + " " + j.name, stroke: PALETTE[i % PALETTE.length], width: 1.5, spanGaps: true}))),
                      axes: [{label: byTime ? "seconds since its first report" : "step"}, {}]};
        holder.uplot = new uPlot(opts, data, holder);
        charts.push(holder.uplot);
      }
    }
    const rank = n => ["loss", "val_loss", "accuracy", "val_accuracy"].indexOf(n) >= 0 ? ["loss", "val_loss", "accuracy", "val_accuracy"].indexOf(n) : 9;
    [xSel, smooth, logBox].forEach(el => el.addEventListener("input", draw));
    every(5000, async function () {
      const r = await fetch("/jobs/compare.json?ids=" + encodeURIComponent(ids), {credentials: "same-origin"});
      if (!r.ok) return true;
      last = await r.json();
      draw();
      return last.jobs.some(j => !j.final);  // a job still running: its curves grow
    });
  }

  // weight/gradient histograms over steps: a heat map per name (x = step, y = bin)
  async function histograms(jobId) {
    const r = await fetch("/jobs/" + jobId + "/histograms.json", {credentials: "same-origin"});
    if (!r.ok) return;
    const rows = await r.json();
    if (!rows.length) return;
    const box = document.getElementById("histograms");
    const byName = {};
    rows.forEach(h => (byName[h.name] = byName[h.name] || []).push(h));
    box.querySelectorAll("p.muted").forEach(p => p.remove());
    for (const [name, hs] of Object.entries(byName)) {
      let c = box.querySelector('canvas[data-name="' + CSS.escape(name) + '"]');
      if (!c) {
        const fig = document.createElement("figure");
        c = document.createElement("canvas"); c.width = 360; c.height = 160; c.dataset.name = name;
        const cap = document.createElement("figcaption");
        fig.appendChild(c); fig.appendChild(cap); box.appendChild(fig);
      }
      const lo = Math.min(...hs.map(h => h.min)), hi = Math.max(...hs.map(h => h.max));
      c.nextSibling.textContent = name + ": steps " + hs[0].step + "–" + hs[hs.length - 1].step + ", values " + lo.toPrecision(3) + " to " + hi.toPrecision(3);
      const g = c.getContext("2d"); g.clearRect(0, 0, c.width, c.height);
      const w = c.width / hs.length;
      hs.forEach((h, i) => {
        const n = h.counts.length, peak = Math.max(1, ...h.counts);
        h.counts.forEach((count, b) => {
          const v0 = h.min + (h.max - h.min) * b / n, v1 = h.min + (h.max - h.min) * (b + 1) / n;
          const y0 = c.height * (1 - (v1 - lo) / ((hi - lo) || 1)), y1 = c.height * (1 - (v0 - lo) / ((hi - lo) || 1));
          g.fillStyle = "rgba(35,100,170," + (count / peak).toFixed(3) + ")";
          g.fillRect(i * w, y0, Math.ceil(w), Math.max(1, y1 - y0));
        });
      });
    }
  }

  function showRank(button) {
    document.querySelectorAll("button.tab").forEach(b => b.classList.toggle("on", b === button));
    const log = document.getElementById("log");
    const url = log.getAttribute("hx-get").replace(/rank=\d+/, "rank=" + button.dataset.rank);
    log.setAttribute("hx-get", url);
    htmx.process(log);
    htmx.ajax("GET", url, {target: log});
  }

  // GPUs held per tenant over time (cluster page)
  function gpuChart(el, hoursSelect) {
    let chart = null, shown = "";
    const hours = () => (hoursSelect ? hoursSelect.value : "24");
    if (hoursSelect) hoursSelect.addEventListener("change", () => { shown = ""; refresh(); });
    async function refresh() {
      const r = await fetch("/cluster/gpus.json?hours=" + encodeURIComponent(hours()), {credentials: "same-origin"});
      if (!r.ok) return true;
      const body = await r.json();
      const names = Object.keys(body.tenants);
      if (!names.length) { el.innerHTML = '<p class="muted">No GPUs were held in this time.</p>'; return true; }
      if (!chart || shown !== names.join()) {
        el.innerHTML = ""; chart = lineChart(el, "", "time", names, true, null, "GPUs held"); shown = names.join();
      }
      chart.setData([body.t].concat(names.map(n => body.tenants[n])));
      return true;
    }
    every(15000, refresh);
  }

  // sizing: the simulated p95 and mean wait for GPUs at each cluster size tried
  function waitChart(el, waits) {
    const chart = lineChart(el, "", "GPUs", ["p95 wait (min)", "mean wait (min)"], false);
    chart.setData([waits.map(w => w.gpus), waits.map(w => w.p95_wait_min), waits.map(w => w.mean_wait_min)]);
  }

  function csrf() {
    try { return JSON.parse(document.body.getAttribute("hx-headers"))["X-CSRF-Token"]; } catch (e) { return ""; }
  }

  function say(id, text) {
    const el = document.getElementById(id);
    el.textContent = text || ""; el.hidden = !text;
    const input = document.getElementById(id.replace(/^e-/, "f-"));
    if (input) { if (text) input.setAttribute("aria-invalid", "true"); else input.removeAttribute("aria-invalid"); }
  }

  // upload an archive with a progress bar; the server streams it to disk and ingests it
  function ingest(event) {
    event.preventDefault();
    const name = document.getElementById("f-name").value.trim();
    const file = document.getElementById("f-file").files[0];
    ["e-name", "e-file", "e-val", "form-error"].forEach(id => say(id, ""));
    if (!/^[a-z0-9][a-z0-9._-]{0,62}$/.test(name)) { say("e-name", "use 1-63 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit"); return; }
    if (!file) { say("e-file", "choose a zip or tar archive of class folders, or a .jsonl file of text examples"); return; }
    const params = new URLSearchParams({val: document.getElementById("f-val").value.trim(),
                                        description: document.getElementById("f-description").value});
    const bar = document.getElementById("ingest-progress"), status = document.getElementById("ingest-status");
    const button = document.getElementById("ingest-submit");
    const xhr = new XMLHttpRequest();
    xhr.open("POST", "/datasets/" + encodeURIComponent(name) + "/upload?" + params);
    xhr.setRequestHeader("X-CSRF-Token", csrf());
    xhr.setRequestHeader("Content-Type", "application/octet-stream");
    xhr.setRequestHeader("Accept", "application/json");
    bar.hidden = false; bar.value = 0; button.disabled = true;
    xhr.upload.onprogress = e => { if (e.lengthComputable) { bar.value = 100 * e.loaded / e.total; status.textContent = "uploading " + Math.round(bar.value) + "%"; } };
    xhr.upload.onload = () => { status.textContent = "ingesting: decoding, checking and sharding the images..."; bar.removeAttribute("value"); };
    xhr.onload = () => {
      button.disabled = false;
      let body = {};
      try { body = JSON.parse(xhr.responseText); } catch (e) { /* not JSON */ }
      if (xhr.status >= 200 && xhr.status < 300) {
        status.textContent = body.ref + ": " + body.samples + " images, " + body.classes + " classes" + (body.quarantined ? ", " + body.quarantined + " quarantined" : "");
        bar.value = 100; window.location.href = body.url; return;
      }
      bar.hidden = true; status.textContent = "";
      const message = (body.error || {}).message || ("the server answered " + xhr.status);
      if (/name/i.test(message) && !/file|archive|image/i.test(message)) say("e-name", message);
      else if (/validation|val\b|split/i.test(message)) say("e-val", message);
      else if (/archive|upload|image|zip|tar/i.test(message)) say("e-file", message);
      else say("form-error", message);
    };
    xhr.onerror = () => { button.disabled = false; bar.hidden = true; say("form-error", "the upload did not reach the server; try again"); };
    xhr.send(file);
  }

  // a deployment's request rate and latency from the router's running totals (direct predictions
  // included, as replicas report them; "direct" shows their share): the last ten minutes the
  // server kept, then as they come; times are the server's
  function traffic(name) {
    const rate = lineChart(document.getElementById("rate-chart"), "requests / s", "time", ["ok", "errors", "of which direct"], true, 600);
    const lat = lineChart(document.getElementById("latency-chart"), "latency (ms)", "time", ["mean", "p95"], true, 600);
    const rows = [[], [], [], [], [], []];  // t, ok/s, errors/s, mean, p95, direct/s
    let last = null;
    function p95(buckets, counts) {
      const total = counts.reduce((a, b) => a + b, 0);
      if (!total) return null;
      let seen = 0;
      for (let i = 0; i < counts.length; i++) { seen += counts[i]; if (seen >= 0.95 * total) return 1000 * (buckets[i] !== undefined ? buckets[i] : buckets[buckets.length - 1]); }
      return null;
    }
    function point(a, b) {  // the rates between two snapshots of the totals, at the later one
      if (b.at <= a.at) return;
      const dt = b.at - a.at, n = b.latency_count - a.latency_count, errors = b.errors - a.errors;
      rows[0].push(b.at); rows[1].push((b.requests - a.requests - errors) / dt); rows[2].push(errors / dt);
      rows[3].push(n ? 1000 * (b.latency_sum - a.latency_sum) / n : null);
      rows[4].push(p95(b.buckets, b.counts.map((c, i) => c - a.counts[i])));
      rows[5].push((b.direct - a.direct) / dt);
      if (rows[0].length > 400) rows.forEach(r => r.shift());
    }
    every(2000, async function () {
      const r = await fetch("/deployments/" + encodeURIComponent(name) + "/traffic.json", {credentials: "same-origin"});
      if (!r.ok) return true;
      const t = await r.json();
      if (!last) (t.history || []).forEach(h => { if (last) point(last, h); last = h; });
      if (last) point(last, t);
      last = t;
      if (rows[0].length) {
        rate.setData([rows[0], rows[1], rows[2], rows[5]]); lat.setData([rows[0], rows[3], rows[4]]);
        document.getElementById("rate-chart").dataset.points = String(rows[0].length);
      }
      document.getElementById("rate-chart").dataset.requests = String(t.requests);
      document.getElementById("rate-chart").dataset.direct = String(t.direct);
      return true;
    });
  }

  async function predict(event, name) {
    event.preventDefault();
    const file = document.getElementById("predict-file").files[0];
    say("predict-error", "");
    const answer = document.getElementById("predict-answer"); answer.innerHTML = "";
    if (!file) { say("predict-error", "choose an image first"); return; }
    const data = new FormData(); data.append("image", file); data.append("top_k", document.getElementById("predict-k").value);
    const r = await fetch("/deployments/" + encodeURIComponent(name) + "/predict", {method: "POST", body: data,
      credentials: "same-origin", headers: {"X-CSRF-Token": csrf(), "Accept": "application/json"}});
    let body = {};
    try { body = await r.json(); } catch (e) { /* not JSON */ }
    if (!r.ok) { say("predict-error", (body.error || {}).message || ("the server answered " + r.status)); return; }
    const top = body.predictions[0].top_k;
    const table = document.createElement("table"); table.className = "grid"; table.id = "predictions";
    table.innerHTML = "<thead><tr><th>label</th><th>confidence</th><th></th></tr></thead>";
    const tbody = document.createElement("tbody");
    top.forEach(x => {
      const tr = document.createElement("tr");
      [x.label, (100 * x.confidence).toFixed(1) + "%"].forEach(v => { const td = document.createElement("td"); td.textContent = v; tr.appendChild(td); });
      const td = document.createElement("td"); const bar = document.createElement("div"); bar.className = "bar";
      bar.style.width = (100 * x.confidence) + "%"; td.appendChild(bar); tr.appendChild(td); tbody.appendChild(tr);
    });
    table.appendChild(tbody);
    const p = document.createElement("p"); p.textContent = "Answered by version " + body.version;
    answer.appendChild(p); answer.appendChild(table);
  }

  // labeling: every image of a version with its label; keys assign classes; a deployed model
  // proposes a class for each; the changes are saved as the next version
  const labels = {
    base: "", classes: [], items: [], byKey: new Map(), order: [], at: 0, model: null, tiles: new Map(),
    async open(base) {
      this.base = base;
      const r = await fetch(base + "/label/items.json", {credentials: "same-origin"});
      const body = await r.json();
      if (!r.ok) { say("label-error", (body.error || {}).message || "could not load the images"); return; }
      this.classes = body.classes;
      this.items = body.items.map(([key, path, label]) => ({key, path, label, now: label, proposed: null, conf: null}));
      this.byKey = new Map(this.items.map(it => [it.key, it]));
      const keys = document.getElementById("label-classes");
      // digit keys: a class named by one digit gets that digit ("3" is key 3); otherwise the
      // first ten classes get 1-9 and 0 in order
      const digits = this.classes.length <= 10 && this.classes.every(c => /^[0-9]$/.test(c));
      this.keyOf = new Map(); this.byDigit = new Map();
      this.classes.forEach((c, i) => {
        const d = digits ? c : (i < 10 ? String((i + 1) % 10) : null);
        if (d !== null) { this.keyOf.set(c, d); this.byDigit.set(d, c); }
      });
      this.classes.forEach((c, i) => {
        const b = document.createElement("button"); b.type = "button"; b.className = "cls"; b.dataset.cls = c;
        if (this.keyOf.has(c)) { const k = document.createElement("kbd"); k.textContent = this.keyOf.get(c); b.appendChild(k); }
        b.appendChild(document.createTextNode(" " + c)); b.onclick = () => this.set(c); keys.appendChild(b);
      });
      document.addEventListener("keydown", e => this.key(e));
      this.arrange();
    },
    thumb(it) {
      return it.key.startsWith("i:") ? this.base + "/thumbs/" + it.key.slice(2) : this.base + "/label/image?key=" + encodeURIComponent(it.key);
    },
    arrange() {
      const sort = document.getElementById("label-sort").value, show = document.getElementById("label-show").value;
      const disagree = it => it.proposed !== null && it.proposed !== it.now;
      let order = this.items.map((it, i) => i).filter(i => {
        const it = this.items[i];
        return show === "all" || (show === "unlabeled" && !it.now) || (show === "changed" && it.now !== it.label) ||
               (show === "disagree" && disagree(it));
      });
      if (sort === "confidence") order.sort((a, b) => (this.items[a].conf ?? 2) - (this.items[b].conf ?? 2));
      if (sort === "disagree") order.sort((a, b) => disagree(this.items[b]) - disagree(this.items[a]));
      this.order = order; this.at = 0;
      const strip = document.getElementById("label-strip"); strip.innerHTML = ""; this.tiles.clear();
      const frag = document.createDocumentFragment();
      order.forEach((i, n) => {
        const it = this.items[i], tile = document.createElement("figure");
        tile.className = "tile"; tile.dataset.key = it.key; tile.onclick = () => this.go(n);
        const img = document.createElement("img"); img.loading = "lazy"; img.src = this.thumb(it); img.alt = it.path;
        const lab = document.createElement("span"); lab.className = "lab";
        tile.appendChild(img); tile.appendChild(lab); frag.appendChild(tile); this.tiles.set(it.key, tile); this.paint(it);
      });
      strip.appendChild(frag);
      this.go(0);
    },
    paint(it) {
      const tile = this.tiles.get(it.key);
      if (tile) {
        tile.querySelector(".lab").textContent = (it.now || "?") + (it.proposed !== null && it.proposed !== it.now ? " → " + it.proposed : "");
        tile.classList.toggle("changed", it.now !== it.label);
        tile.classList.toggle("disagree", it.proposed !== null && it.proposed !== it.now);
      }
      const changed = this.items.filter(x => x.now !== x.label).length;
      document.getElementById("label-count").textContent = changed + " change" + (changed === 1 ? "" : "s") + " of " + this.items.length + " images";
      const save = document.getElementById("label-save"); if (save) save.disabled = !changed;
    },
    go(n) {
      if (!this.order.length) { document.getElementById("label-info").textContent = "No image to show."; return; }
      this.at = Math.max(0, Math.min(this.order.length - 1, n));
      const it = this.items[this.order[this.at]];
      document.querySelectorAll(".tile.on").forEach(t => t.classList.remove("on"));
      const tile = this.tiles.get(it.key); if (tile) { tile.classList.add("on"); tile.scrollIntoView({block: "nearest"}); }
      document.getElementById("label-big").src = this.base + "/label/image?key=" + encodeURIComponent(it.key);
      const info = document.getElementById("label-info");
      info.textContent = (this.at + 1) + " / " + this.order.length + " · " + it.path + " · label " + (it.now || "none") +
        (it.now !== it.label ? " (was " + (it.label || "none") + ")" : "") +
        (it.proposed !== null ? " · model: " + it.proposed + " (" + (100 * it.conf).toFixed(1) + "%)" : "");
      info.dataset.key = it.key; info.dataset.label = it.now || "";
      document.querySelectorAll("button.cls").forEach(b => b.classList.toggle("on", b.dataset.cls === it.now));
    },
    current() { return this.items[this.order[this.at]]; },
    set(cls) { const it = this.current(); if (!it) return; it.now = cls; this.paint(it); this.go(this.at + 1); },
    key(e) {
      if (e.target.closest("input, select, textarea")) return;
      const it = this.current(); if (!it) return;
      if (/^[0-9]$/.test(e.key)) { if (this.byDigit.has(e.key)) { this.set(this.byDigit.get(e.key)); e.preventDefault(); } }
      else if (e.key === "ArrowRight") { this.go(this.at + 1); e.preventDefault(); }
      else if (e.key === "ArrowLeft") { this.go(this.at - 1); e.preventDefault(); }
      else if (e.key === "a" && it.proposed !== null) { this.set(it.proposed); }
      else if (e.key === "u") { it.now = it.label; this.paint(it); this.go(this.at); }
    },
    async post(path, doc) {
      const r = await fetch(this.base + path, {method: "POST", credentials: "same-origin",
        headers: {"Content-Type": "application/json", "Accept": "application/json", "X-CSRF-Token": csrf()},
        body: JSON.stringify(doc)});
      return [r, await r.json().catch(() => ({}))];
    },
    async propose() {
      let name = document.getElementById("label-deployment").value;
      const bar = document.getElementById("propose-progress"), status = document.getElementById("propose-status");
      say("label-error", "");
      if (name.startsWith("champion:")) {  // no deployment yet: one replica of the champion, started for this
        const [r, body] = await this.post("/label/serve", {model: name.slice(9)});
        if (!r.ok) { say("label-error", (body.error || {}).message || ("the server answered " + r.status)); return; }
        name = body.deployment;
        for (let waited = 0; ; waited += 2) {
          status.textContent = "starting deployment " + name + " (" + waited + " s)...";
          const [p] = await this.post("/label/propose", {deployment: name, keys: [this.items[0].key]});
          if (p.ok) break;
          if (![404, 503].includes(p.status) || waited > 300) {  // not routed yet, or no replica ready yet
            say("label-error", "deployment " + name + " did not start: see its page"); return;
          }
          await new Promise(done => setTimeout(done, 2000));
        }
      }
      bar.hidden = false; bar.value = 0;
      const keys = this.items.map(it => it.key), batch = 64;
      for (let i = 0; i < keys.length; i += batch) {
        const r = await fetch(this.base + "/label/propose", {method: "POST", credentials: "same-origin",
          headers: {"Content-Type": "application/json", "Accept": "application/json", "X-CSRF-Token": csrf()},
          body: JSON.stringify({deployment: name, keys: keys.slice(i, i + batch)})});
        const body = await r.json().catch(() => ({}));
        if (!r.ok) { say("label-error", (body.error || {}).message || ("the server answered " + r.status)); bar.hidden = true; return; }
        this.model = "deployment " + name + " (" + body.model + "@" + body.version + ")";
        for (const [key, [label, conf]] of Object.entries(body.proposals)) {
          const it = this.byKey.get(key); it.proposed = label; it.conf = conf; this.paint(it);
        }
        bar.value = 100 * Math.min(keys.length, i + batch) / keys.length;
        status.textContent = Math.min(keys.length, i + batch) + " of " + keys.length + " images proposed by " + this.model;
      }
      bar.hidden = true; document.getElementById("label-propose").dataset.done = "1";
      this.go(this.at);
    },
    async save() {
      const changes = {};
      this.items.forEach(it => { if (it.now !== it.label) changes[it.key] = it.now; });
      const button = document.getElementById("label-save"); button.disabled = true;
      const status = document.getElementById("propose-status"); status.textContent = "saving a new version...";
      const r = await fetch(this.base + "/label/save", {method: "POST", credentials: "same-origin",
        headers: {"Content-Type": "application/json", "Accept": "application/json", "X-CSRF-Token": csrf()},
        body: JSON.stringify({labels: changes, model: this.model})});
      const body = await r.json().catch(() => ({}));
      if (!r.ok) { button.disabled = false; status.textContent = ""; say("label-error", (body.error || {}).message || ("the server answered " + r.status)); return; }
      window.location.href = body.url;
    },
  };

  window.DeepPod = {labels: labels, jobCharts: jobCharts, usageCharts: usageCharts, searchCharts: searchCharts, pickJobs: pickJobs,
                    compareRuns: compareRuns, showRank: showRank, gpuChart: gpuChart, ingest: ingest, traffic: traffic,
                    predict: predict, waitChart: waitChart};
})();
