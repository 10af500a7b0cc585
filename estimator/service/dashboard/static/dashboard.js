// The estimator's dashboard: reads this service's JSON API and draws it as SVG. No libraries, no network
// beyond the service itself. Every shown number keeps the API's value in a data-value attribute, and the
// CSV download is written from the same values (docs/DASHBOARD.md).
"use strict";
(function () {
  const SVGNS = "http://www.w3.org/2000/svg";
  const COLORS = ["#1f5f99", "#b03a2e", "#2e7d32", "#7b3fa0", "#b8860b", "#00838f", "#6d4c41", "#c2185b"];
  const SERIES_ITEMS = 5; // items drawn over days
  const CHART_ITEMS = 100; // items drawn in the chart at most (the table can list them all)
  const HH_TOP = 50; // values a heavy-hitter discovery asks for (the Rows control limits what is shown)
  const $ = (id) => document.getElementById(id);
  const S = {
    defs: {}, // metric name -> /v1/metrics entry
    available: [], // /v1/estimates entries
    metric: null,
    entry: null, // the selected {metric, spec_id, day, n, batches}
    normSub: false,
    includeNoise: false, // heavy hitters: list values that could be noise too
    rows: 25,
    discovery: null, // the heavy-hitter discovery of the selected day (or {missing})
    shown: null, // {columns, rows, name} of the table on screen (what the CSV holds)
  };

  // -- the API ----------------------------------------------------------------------------------------

  // the answer's JSON; with allow404, {missing: reason} instead of an error when the service answers 404
  // (a heavy-hitter discovery where the service has no dataset or no part files of that day)
  async function getJSON(path, { allow404 = false } = {}) {
    const r = await fetch(path, { headers: { Accept: "application/json" }, cache: "no-store" });
    if (!r.ok) {
      let detail = r.statusText;
      let parsed = false;
      try {
        detail = (await r.json()).detail;
        parsed = true;
      } catch (e) {
        /* keep the status text */
      }
      if (allow404 && r.status === 404) return { missing: String(detail) };
      throw new Error(`GET ${path}: ${r.status} ${parsed ? JSON.stringify(detail) : detail}`);
    }
    return r.json();
  }

  function estimateURL(metric, day, specId, normSub) {
    const q = new URLSearchParams({ day: String(day), spec_id: specId });
    if (normSub) q.set("norm_sub", "true");
    return `v1/estimates/${encodeURIComponent(metric)}?${q}`;
  }

  function heavyHittersURL(metric, day, specId, includeNoise) {
    const q = new URLSearchParams({ day: String(day), spec_id: specId, top: String(HH_TOP) });
    if (includeNoise) q.set("include_noise", "true");
    return `v1/heavy-hitters/${encodeURIComponent(metric)}?${q}`;
  }

  // -- formatting ---------------------------------------------------------------------------------------

  // A device-supplied string as text (pipeline/text.py's rule): control, format (bidi overrides, zero-width)
  // and separator characters are written as visible escapes, a backslash as two; the raw value stays in the
  // API's JSON and in the CSV. Everything is inserted as text, never as HTML.
  function printable(v) {
    if (typeof v !== "string") return v;
    let out = "";
    for (const ch of v) {
      const cp = ch.codePointAt(0);
      if (ch === "\\") out += "\\\\";
      else if (/[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}]/u.test(ch)) {
        out += cp < 0x100 ? `\\x${cp.toString(16).padStart(2, "0")}` : cp < 0x10000 ? `\\u${cp.toString(16).padStart(4, "0")}` : `\\U${cp.toString(16).padStart(8, "0")}`;
      } else out += ch;
    }
    return out;
  }

  const fixed = (d) => (x) =>
    x === null || x === undefined
      ? "—"
      : x.toLocaleString("en-US", { minimumFractionDigits: d, maximumFractionDigits: d });
  const fmtCount = fixed(1);
  const fmtValue = fixed(3);
  const fmtShare = (x) => (x === null || x === undefined ? "—" : (100 * x).toFixed(2) + "%");
  const fmtInt = (x) => (x === null || x === undefined ? "—" : x.toLocaleString("en-US"));
  const fmtEps = (x) => (x === null || x === undefined ? "n/a" : String(Number(x.toPrecision(3))));
  const includesZero = (lo, hi) => lo !== null && hi !== null && lo <= 0 && 0 <= hi;

  function isoTime(t) {
    return new Date(t * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
  }

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null) continue;
      if (k === "class") e.className = v;
      else e.setAttribute(k, v);
    }
    for (const c of children) e.append(c);
    return e;
  }

  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) if (v !== undefined && v !== null) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // -- scales and axes ----------------------------------------------------------------------------------

  function ticks(lo, hi, n) {
    const span = hi - lo || Math.abs(hi) || 1;
    const raw = span / n;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const r = raw / mag;
    const step = mag * (r >= 7.5 ? 10 : r >= 3.5 ? 5 : r >= 1.5 ? 2 : 1);
    const out = [];
    for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push(Number(t.toPrecision(12)));
    return out;
  }

  function linear(d0, d1, r0, r1) {
    const k = d1 === d0 ? 0 : (r1 - r0) / (d1 - d0);
    return (x) => r0 + (x - d0) * k;
  }

  function extent(values, withZero) {
    let lo = withZero ? 0 : Infinity;
    let hi = withZero ? 0 : -Infinity;
    for (const v of values) {
      if (v === null || v === undefined || !isFinite(v)) continue;
      lo = Math.min(lo, v);
      hi = Math.max(hi, v);
    }
    if (!isFinite(lo)) return [0, 1];
    if (lo === hi) return [lo - 1, hi + 1];
    const pad = (hi - lo) * 0.05;
    return [lo - (withZero && lo === 0 ? 0 : pad), hi + pad];
  }

  function yAxis(g, y, lo, hi, x0, x1, fmt) {
    for (const t of ticks(lo, hi, 5)) {
      g.append(svg("line", { x1: x0, x2: x1, y1: y(t), y2: y(t), class: t === 0 ? "zero" : "grid" }));
      g.append(svg("text", { x: x0 - 6, y: y(t) + 4, class: "tick", "text-anchor": "end" }, fmt(t)));
    }
  }

  const shortFmt = (t) => {
    const a = Math.abs(t);
    if (a >= 1e6) return (t / 1e6).toPrecision(3) + "M";
    if (a >= 1e4) return (t / 1e3).toPrecision(3) + "k";
    return String(Number(t.toPrecision(4)));
  };

  // -- charts -------------------------------------------------------------------------------------------

  // points: [{label, value, lo, hi}]: a dot per point with its interval as a bar; grey when it includes 0
  function intervalChart(points, fmtTick) {
    const W = 960, H = 300, L = 64, R = 12, T = 12, B = 86;
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img" });
    const [lo, hi] = extent(points.flatMap((p) => [p.lo, p.hi, p.value]), true);
    const y = linear(lo, hi, H - B, T);
    const step = (W - L - R) / Math.max(points.length, 1);
    yAxis(root, y, lo, hi, L, W - R, fmtTick || shortFmt);
    points.forEach((p, i) => {
      const x = L + step * (i + 0.5);
      const grey = p.grey !== undefined ? p.grey : includesZero(p.lo, p.hi);
      const g = svg("g", { class: grey ? "point grey" : "point", "data-label": p.label });
      const shown = printable(p.label);
      const title = svg("title", {}, `${shown}: ${p.text} (95% CI ${p.loText} .. ${p.hiText})${grey && p.grey !== undefined ? " — could be noise" : ""}`);
      g.append(title);
      if (p.lo !== null && p.hi !== null) {
        g.append(svg("line", { x1: x, x2: x, y1: y(p.lo), y2: y(p.hi), class: "ci" }));
        for (const v of [p.lo, p.hi]) g.append(svg("line", { x1: x - 3, x2: x + 3, y1: y(v), y2: y(v), class: "ci" }));
      }
      if (p.value !== null) g.append(svg("circle", { cx: x, cy: y(p.value), r: 3.2, class: "dot" }));
      const lab = shown.length > 14 ? shown.slice(0, 13) + "…" : shown;
      g.append(svg("text", { x, y: H - B + 12, class: "xlabel", transform: `rotate(-50 ${x} ${H - B + 12})`, "text-anchor": "end" }, lab));
      root.append(g);
    });
    return root;
  }

  // series: [{name, points: [{x (index into xs), value, lo, hi}]}]; xs: labels of the x positions
  function seriesChart(series, xs, fmtTick) {
    const W = 960, H = 260, L = 64, R = 150, T = 12, B = 36;
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart series", role: "img" });
    const all = series.flatMap((s) => s.points.flatMap((p) => [p.lo, p.hi, p.value]));
    const [lo, hi] = extent(all, true);
    const y = linear(lo, hi, H - B, T);
    const x = xs.length > 1 ? linear(0, xs.length - 1, L + 20, W - R - 20) : () => (L + W - R) / 2;
    yAxis(root, y, lo, hi, L, W - R, fmtTick || shortFmt);
    xs.forEach((lab, i) => root.append(svg("text", { x: x(i), y: H - B + 16, class: "tick", "text-anchor": "middle" }, lab)));
    series.forEach((s, k) => {
      const color = COLORS[k % COLORS.length];
      const pts = s.points.filter((p) => p.value !== null);
      const g = svg("g", { class: "line", "data-name": s.name });
      const banded = pts.filter((p) => p.lo !== null && p.hi !== null);
      if (banded.length > 1) {
        const up = banded.map((p) => `${x(p.x)},${y(p.hi)}`);
        const down = banded.slice().reverse().map((p) => `${x(p.x)},${y(p.lo)}`);
        g.append(svg("polygon", { points: up.concat(down).join(" "), fill: color, class: "band" }));
      } else {
        for (const p of banded) g.append(svg("line", { x1: x(p.x), x2: x(p.x), y1: y(p.lo), y2: y(p.hi), stroke: color, class: "ci" }));
      }
      if (pts.length > 1) g.append(svg("polyline", { points: pts.map((p) => `${x(p.x)},${y(p.value)}`).join(" "), stroke: color, class: "path" }));
      for (const p of pts) g.append(svg("circle", { cx: x(p.x), cy: y(p.value), r: 3, fill: color }));
      g.append(svg("rect", { x: W - R + 10, y: T + 16 * k, width: 10, height: 10, fill: color }));
      g.append(svg("text", { x: W - R + 26, y: T + 16 * k + 9, class: "legend" }, s.name.length > 18 ? s.name.slice(0, 17) + "…" : s.name));
      root.append(g);
    });
    return root;
  }

  // a histogram: one bar per bin with its band as an interval
  function histChart(edges, hist, lo, hi) {
    const W = 960, H = 280, L = 64, R = 12, T = 12, B = 36;
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img" });
    const [y0, y1] = extent(hist.concat(lo, hi), true);
    const y = linear(y0, y1, H - B, T);
    const x = linear(edges[0], edges[edges.length - 1], L, W - R);
    yAxis(root, y, y0, y1, L, W - R, (t) => (100 * t).toPrecision(3) + "%");
    for (const t of ticks(edges[0], edges[edges.length - 1], 8))
      root.append(svg("text", { x: x(t), y: H - B + 16, class: "tick", "text-anchor": "middle" }, shortFmt(t)));
    hist.forEach((h, i) => {
      const grey = includesZero(lo[i], hi[i]);
      const g = svg("g", { class: grey ? "bin grey" : "bin" });
      g.append(svg("title", {}, `[${edges[i]}, ${edges[i + 1]}): ${fmtShare(h)} (95% band ${fmtShare(lo[i])} .. ${fmtShare(hi[i])})`));
      const xa = x(edges[i]), xb = x(edges[i + 1]);
      g.append(svg("rect", { x: xa + 0.5, width: Math.max(xb - xa - 1, 0.5), y: y(Math.max(h, 0)), height: Math.abs(y(0) - y(h)), class: "bar" }));
      const xm = (xa + xb) / 2;
      g.append(svg("line", { x1: xm, x2: xm, y1: y(lo[i]), y2: y(hi[i]), class: "ci" }));
      root.append(g);
    });
    return root;
  }

  // -- the table and its CSV ----------------------------------------------------------------------------

  // columns: [{key, title, fmt, csv, perRow}]; rows: [{key, values: {key: value}, grey, fmt}]
  function renderTable(columns, rows) {
    const thead = $("table").tHead;
    const tbody = $("table").tBodies[0];
    thead.replaceChildren(el("tr", {}, ...columns.map((c) => el("th", { scope: "col" }, c.title))));
    tbody.replaceChildren(
      ...rows.map((r) =>
        el(
          "tr",
          { class: r.grey ? "grey" : null, "data-key": r.key },
          ...columns.map((c) => {
            const v = r.values[c.key];
            const num = typeof v === "number";
            const fmt = (c.perRow && r.fmt) || c.fmt; // distribution: quantiles are values, bins are shares
            const text = fmt ? fmt(v) : v === null || v === undefined ? "—" : printable(String(v));
            return el("td", { "data-col": c.key, "data-value": num ? String(v) : null, class: num ? "num" : null }, text);
          }),
        ),
      ),
    );
  }

  // A string a spreadsheet would run as a formula (a device can send one as a heavy hitter: "=SUM(40,2)")
  // gets a leading ' (the rule of pipeline/csv_export.py); numbers stay numbers. A field with a comma, a
  // quote, CR or LF is quoted.
  function csvField(v) {
    if (v === null || v === undefined) return "";
    let s = String(v);
    if (typeof v === "string" && /^[=+\-@\t\r]/.test(s)) s = "'" + s;
    return /[",\n\r]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
  }

  function toCSV(shown) {
    const keys = shown.context.map((c) => c[0]).concat(shown.columns.filter((c) => c.csv !== false).map((c) => c.key));
    const lines = [keys.join(",")];
    for (const r of shown.rows) {
      const ctx = shown.context.map((c) => csvField(c[1]));
      const vals = shown.columns.filter((c) => c.csv !== false).map((c) => csvField(r.values[c.key]));
      lines.push(ctx.concat(vals).join(","));
    }
    return lines.join("\r\n") + "\r\n";
  }

  function download() {
    if (!S.shown) return;
    const blob = new Blob([toCSV(S.shown)], { type: "text/csv" });
    const a = el("a", { href: URL.createObjectURL(blob), download: S.shown.name });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 10000);
  }

  // -- the summary cards -------------------------------------------------------------------------------

  function card(id, key, value, text, note, title) {
    return el(
      "div",
      { class: "card", "data-testid": id, title },
      el("div", { class: "k" }, key),
      el("div", { class: "v", "data-value": value === null || value === undefined ? null : String(value) }, text),
      el("div", { class: "note" }, note || ""),
    );
  }

  function renderSummary(e) {
    const def = S.defs[e.metric];
    const r = def ? def.max_reports_per_day : null;
    const cards = [
      card("date", "day", e.day, e.date, `day ${e.day}`),
      card("n", "n (reports)", e.n, fmtInt(e.n), `${fmtInt(e.batches)} shuffled batches`),
      card("local-epsilon", "local ε₀", e.epsilon, fmtEps(e.epsilon), r ? `per report; up to ${r} a day: ${fmtEps(r * e.epsilon)} per person and day` : "per report",
        "the ε of one privatized report, on the device"),
      card("central-epsilon", "central ε per person", e.central_epsilon, fmtEps(e.central_epsilon),
        e.central_delta !== null ? `δ = ${e.central_delta < 1e-3 ? e.central_delta.toExponential() : e.central_delta}` : "the shuffler attached none",
        e.central_bound ? `the weakest batch's amplification bound: ${e.central_bound}` : null),
      card("mechanism", "mechanism", null, e.mechanism, `spec ${e.spec_id}`, JSON.stringify(e.spec)),
    ];
    if (e.kind === "heavy_hitters" && S.discovery) {
      const f = S.discovery;
      cards.push(f.missing
        ? card("hh-source", "discovered from", null, "streaming only", "first-level prefixes; whole values need the dataset", f.missing)
        : card("hh-source", "discovered from", f.n, `${fmtInt(f.n)} reports`, `${f.parts} part file(s), written ${isoTime(f.dataset_time)}; decoded in ${f.seconds.toFixed(2)} s${f.cached ? " (cached)" : ""}`,
          "the Parquet sink's part files of this day, decoded as `ldp heavy-hitters` does; n above counts the stream"));
    }
    if (e.partial || (e.merged_instances || 1) > 1) {
      const missing = e.missing_peers || [];
      cards.push(card("group", "estimator members", e.merged_instances, `${e.merged_instances} merged`,
        missing.length ? `partial: ${missing.length} peer(s) did not answer` : "the whole group",
        missing.length ? `not counted: ${missing.join(", ")}` + ((e.missing_partitions || []).length ? `; missing partitions: ${e.missing_partitions.join(", ")}` : "") : "every --peer answered"));
    }
    if (e.kind === "frequency") cards.push(card("postprocessing", "post-processing", null, e.postprocessing, e.postprocessing === "norm-sub" ? "non-negative, sums to n" : "unbiased counts"));
    $("summary").replaceChildren(...cards);
  }

  // -- the views ---------------------------------------------------------------------------------------

  function itemLabel(e, i) {
    return e.labels ? e.labels[i] : `#${i}`;
  }

  function frequencyView(e, days) {
    const order = e.counts.map((_, i) => i);
    const key = (i) => (e.counts[i] === null ? -Infinity : e.counts[i]);
    order.sort((a, b) => key(b) - key(a) || a - b);
    const top = S.rows > 0 ? order.slice(0, S.rows) : order;
    const columns = [
      { key: "rank", title: "rank", csv: false },
      { key: "index", title: "index" },
      { key: "label", title: "item" },
      { key: "estimate", title: "estimate", fmt: fmtCount },
      { key: "std_error", title: "std. error", fmt: fmtCount },
      { key: "ci_low", title: "95% CI low", fmt: fmtCount },
      { key: "ci_high", title: "95% CI high", fmt: fmtCount },
      { key: "includes_zero", title: "CI includes 0", fmt: (v) => (v ? "yes" : "no") },
      { key: "adjusted_ci_low", title: `low, all ${e.counts.length} items`, fmt: fmtCount },
      { key: "could_be_noise", title: "could be noise", fmt: (v) => (v ? "yes" : "no") },
    ];
    // grey: could be noise, i.e. the interval widened for all d items (Bonferroni) reaches 0 (the API's flag)
    const noise = (i) => (e.could_be_noise ? e.could_be_noise[i] : includesZero(e.ci_low[i], e.ci_high[i]));
    const rows = top.map((i, rank) => ({
      key: String(i),
      grey: noise(i),
      values: {
        rank: rank + 1, index: i, label: itemLabel(e, i), estimate: e.counts[i], std_error: e.std_error[i],
        ci_low: e.ci_low[i], ci_high: e.ci_high[i], includes_zero: includesZero(e.ci_low[i], e.ci_high[i]),
        adjusted_ci_low: e.adjusted_ci_low ? e.adjusted_ci_low[i] : null, could_be_noise: noise(i),
      },
    }));
    const drawnTop = top.slice(0, CHART_ITEMS);
    $("chart-title").textContent = `Estimated counts, top ${drawnTop.length} of ${e.counts.length} items, with 95% confidence intervals`;
    $("chart").replaceChildren(intervalChart(drawnTop.map((i) => ({
      label: itemLabel(e, i), value: e.counts[i], lo: e.ci_low[i], hi: e.ci_high[i], grey: noise(i),
      text: fmtCount(e.counts[i]), loText: fmtCount(e.ci_low[i]), hiText: fmtCount(e.ci_high[i]),
    }))));
    const drawn = top.slice(0, SERIES_ITEMS);
    $("series-title").textContent = `The top ${drawn.length} items over ${days.length} day(s), with 95% bands`;
    $("series").replaceChildren(seriesChart(
      drawn.map((i) => ({ name: itemLabel(e, i), points: days.map((d, k) => ({ x: k, value: d.counts[i], lo: d.ci_low[i], hi: d.ci_high[i] })) })),
      days.map((d) => d.date),
    ));
    return { columns, rows };
  }

  function meanView(e, days) {
    const columns = [
      { key: "attribute", title: "attribute" },
      { key: "mean", title: "mean", fmt: fmtValue },
      { key: "std_error", title: "std. error", fmt: fmtValue },
      { key: "ci_low", title: "95% CI low", fmt: fmtValue },
      { key: "ci_high", title: "95% CI high", fmt: fmtValue },
      { key: "includes_zero", title: "CI includes 0", fmt: (v) => (v ? "yes" : "no") },
    ];
    const rows = e.mean.map((m, i) => ({
      key: String(i),
      grey: includesZero(e.ci_low[i], e.ci_high[i]),
      values: { attribute: i, mean: m, std_error: e.std_error[i], ci_low: e.ci_low[i], ci_high: e.ci_high[i], includes_zero: includesZero(e.ci_low[i], e.ci_high[i]) },
    }));
    $("chart-title").textContent = "Mean per attribute, with 95% confidence intervals";
    $("chart").replaceChildren(intervalChart(e.mean.map((m, i) => ({
      label: `attribute ${i}`, value: m, lo: e.ci_low[i], hi: e.ci_high[i], text: fmtValue(m), loText: fmtValue(e.ci_low[i]), hiText: fmtValue(e.ci_high[i]),
    }))));
    $("series-title").textContent = `The mean over ${days.length} day(s), with 95% bands`;
    $("series").replaceChildren(seriesChart(
      e.mean.slice(0, SERIES_ITEMS).map((_, i) => ({ name: `attribute ${i}`, points: days.map((d, k) => ({ x: k, value: d.mean[i], lo: d.ci_low[i], hi: d.ci_high[i] })) })),
      days.map((d) => d.date),
    ));
    return { columns, rows };
  }

  function distributionView(e, days) {
    const qs = Object.keys(e.quantiles);
    const columns = [
      { key: "row", title: "row" },
      { key: "low_edge", title: "from", fmt: fmtValue },
      { key: "high_edge", title: "to", fmt: fmtValue },
      { key: "estimate", title: "estimate", perRow: true },
      { key: "ci_low", title: "95% low", perRow: true },
      { key: "ci_high", title: "95% high", perRow: true },
    ];
    // quantiles are values (3 decimals), bins are shares (percent): the row says which
    const rows = qs.map((q) => {
      const v = e.quantiles[q];
      return { key: q, grey: false, fmt: fmtValue, values: { row: q, low_edge: null, high_edge: null, estimate: v.value, ci_low: v.ci_low, ci_high: v.ci_high } };
    }).concat(e.hist.map((h, i) => ({
      key: `bin${i}`, grey: includesZero(e.hist_low[i], e.hist_high[i]), fmt: fmtShare,
      values: { row: `bin ${i}`, low_edge: e.edges[i], high_edge: e.edges[i + 1], estimate: h, ci_low: e.hist_low[i], ci_high: e.hist_high[i] },
    })));
    $("chart-title").textContent = `Distribution over ${e.hist.length} bins (share of users), with 95% bootstrap bands; quantiles in the table`;
    $("chart").replaceChildren(histChart(e.edges, e.hist, e.hist_low, e.hist_high));
    $("series-title").textContent = `Quantiles over ${days.length} day(s), with 95% intervals`;
    $("series").replaceChildren(seriesChart(
      qs.map((q) => ({ name: q, points: days.map((d, k) => { const v = d.quantiles[q]; return v ? { x: k, value: v.value, lo: v.ci_low, hi: v.ci_high } : { x: k, value: null, lo: null, hi: null }; }) })),
      days.map((d) => d.date),
    ));
    return { columns, rows };
  }

  // heavy hitters: the discovered values by name (from the dataset), or the stream's first-level prefixes
  function heavyHittersView(e, found, foundDays, days) {
    const ciCols = (fmt) => [
      { key: "estimate", title: "estimate", fmt },
      { key: "std_error", title: "std. error", fmt },
      { key: "ci_low", title: "95% CI low", fmt },
      { key: "ci_high", title: "95% CI high", fmt },
    ];
    const yes = (v) => (v ? "yes" : "no");
    if (found.missing) {
      const pre = e.first_level_prefixes || [];
      const shown = S.rows > 0 ? pre.slice(0, S.rows) : pre;
      const columns = [{ key: "rank", title: "rank", csv: false }, { key: "prefix", title: "prefix (hex)" }, { key: "bits", title: "bits" }]
        .concat(ciCols(fmtCount).filter((c) => c.key !== "std_error"), [{ key: "includes_zero", title: "CI includes 0", fmt: yes }]);
      const pNoise = (p) => (p.length > 5 ? p[5] : includesZero(p[3], p[4])); // Bonferroni over 2^bits
      const rows = shown.map((p, k) => ({
        key: p[0], grey: pNoise(p),
        values: { rank: k + 1, prefix: p[0], bits: p[1], estimate: p[2], ci_low: p[3], ci_high: p[4], includes_zero: includesZero(p[3], p[4]) },
      }));
      $("chart-title").textContent = `First-level prefixes (the stream's linear part), with 95% intervals: ${found.missing}`;
      $("chart").replaceChildren(intervalChart(shown.slice(0, CHART_ITEMS).map((p) => ({
        label: `${p[0]}/${p[1]}`, value: p[2], lo: p[3], hi: p[4], grey: pNoise(p), text: fmtCount(p[2]), loText: fmtCount(p[3]), hiText: fmtCount(p[4]),
      }))));
      $("series-title").textContent = `Reports over ${days.length} day(s)`;
      $("series").replaceChildren(seriesChart([{ name: "reports", points: days.map((d, k) => ({ x: k, value: d.n, lo: null, hi: null })) }], days.map((d) => d.date)));
      return { columns, rows, source: "stream" };
    }
    const list = S.rows > 0 ? found.found.slice(0, S.rows) : found.found;
    const columns = [{ key: "rank", title: "rank" }, { key: "value", title: "value" }]
      .concat(ciCols(fmtCount), [{ key: "frequency", title: "share", fmt: fmtShare }, { key: "includes_zero", title: "CI includes 0", fmt: yes },
        { key: "adjusted_ci_low", title: `low, best of ${found.candidates}`, fmt: fmtCount }, { key: "selected_by_noise", title: "could be noise", fmt: yes }]);
    const rows = list.map((h) => ({
      // grey: not told apart from noise once the selection is allowed for (the adjusted interval reaches 0;
      // it contains the 95% one, so every value whose own interval includes 0 is grey too). The API lists
      // such values only when asked (the "could be noise" box: include_noise=true)
      key: h.value, grey: h.could_be_noise,
      values: { rank: h.rank, value: h.value, estimate: h.estimate, std_error: h.std_error, ci_low: h.ci_low, ci_high: h.ci_high, frequency: h.frequency, includes_zero: includesZero(h.ci_low, h.ci_high),
        adjusted_ci_low: h.adjusted_ci_low, selected_by_noise: h.could_be_noise },
    }));
    $("chart-title").textContent = `Discovered values, top ${Math.min(list.length, CHART_ITEMS)} of ${found.found.length} (${found.mechanism}), estimated counts with 95% confidence intervals`
      + (found.include_noise ? "; grey: could be noise" : `; only values that stand out from ${found.candidates} candidates (Bonferroni)`);
    $("chart").replaceChildren(intervalChart(list.slice(0, CHART_ITEMS).map((h) => ({
      label: h.value, value: h.estimate, lo: h.ci_low, hi: h.ci_high, grey: h.could_be_noise, text: fmtCount(h.estimate), loText: fmtCount(h.ci_low), hiText: fmtCount(h.ci_high),
    }))));
    // each day's own discovery; a value a day did not discover has no point that day
    const drawn = list.slice(0, SERIES_ITEMS).map((h) => h.value);
    $("series-title").textContent = `The top ${drawn.length} values over ${foundDays.length} day(s), each day discovered on its own, with 95% bands`;
    $("series").replaceChildren(seriesChart(
      drawn.map((v) => ({ name: v, points: foundDays.map((d, k) => {
        const h = d.missing ? null : d.found.find((x) => x.value === v);
        return h ? { x: k, value: h.estimate, lo: h.ci_low, hi: h.ci_high } : { x: k, value: null, lo: null, hi: null };
      }) })),
      foundDays.map((d, k) => days[k].date),
    ));
    return { columns, rows, source: "dataset" };
  }

  // -- loading and selection ---------------------------------------------------------------------------

  function entriesOf(metric) {
    return S.available.filter((a) => a.metric === metric);
  }

  function renderNav() {
    const names = Array.from(new Set(Object.keys(S.defs).concat(S.available.map((a) => a.metric)))).sort();
    $("metrics").replaceChildren(
      ...names.map((name) => {
        const def = S.defs[name];
        const has = entriesOf(name).length > 0;
        const b = el("button", { type: "button", "data-metric": name, class: name === S.metric ? "on" : null, title: def ? def.description : null },
          name, el("span", { class: "kind" }, def ? def.kind : ""));
        if (!has) b.disabled = true;
        b.addEventListener("click", () => selectMetric(name));
        return b;
      }),
    );
  }

  function selectMetric(name, day) {
    S.metric = name;
    const entries = entriesOf(name).sort((a, b) => a.day - b.day || a.spec_id.localeCompare(b.spec_id));
    const sel = $("day");
    sel.replaceChildren(
      ...entries.map((a, i) => {
        const several = entries.filter((b) => b.day === a.day).length > 1;
        return el("option", { value: String(i) }, dateOf(a.day) + (several ? ` (spec ${a.spec_id})` : ""));
      }),
    );
    let pick = entries.length - 1;
    if (day !== undefined) {
      const k = entries.findIndex((a) => String(a.day) === String(day));
      if (k >= 0) pick = k;
    }
    sel.value = String(pick);
    S.entries = entries;
    S.entry = entries[pick] || null;
    renderNav();
    return show();
  }

  function dateOf(day) {
    return new Date(day * 86400000).toISOString().slice(0, 10);
  }

  let showing = 0; // the latest show(): an older answer that arrives late is dropped

  async function show() {
    const e0 = S.entry;
    if (!e0) return;
    const seq = ++showing;
    $("error").hidden = true;
    document.body.classList.add("loading");
    try {
      const same = S.entries.filter((a) => a.spec_id === e0.spec_id);
      const days = await Promise.all(same.map((a) => getJSON(estimateURL(a.metric, a.day, a.spec_id, S.normSub))));
      if (seq !== showing) return;
      const e = days[same.indexOf(e0)];
      let foundDays = null;
      S.discovery = null;
      if (e.kind === "heavy_hitters") {
        // only where the service discovers (it says so in discovery_url); otherwise the stream's prefixes
        foundDays = await Promise.all(same.map((a, k) => (days[k].discovery_url
          ? getJSON(heavyHittersURL(a.metric, a.day, a.spec_id, S.includeNoise), { allow404: true })
          : { missing: days[k].discovery })));
        if (seq !== showing) return;
        S.discovery = foundDays[same.indexOf(e0)];
      }
      const numeric = e.kind !== "frequency";
      $("normsub").disabled = numeric;
      $("rows").disabled = numeric && e.kind !== "heavy_hitters";
      $("noise").disabled = e.kind !== "heavy_hitters";
      renderSummary(e);
      const view = e.kind === "mean" ? meanView(e, days) : e.kind === "distribution" ? distributionView(e, days)
        : e.kind === "heavy_hitters" ? heavyHittersView(e, S.discovery, foundDays, days) : frequencyView(e, days);
      $("table-title").textContent = `${e.metric} on ${e.date}` + (e.kind === "frequency" ? ` (${e.postprocessing === "norm-sub" ? "Norm-Sub" : "unbiased"})` : "");
      renderTable(view.columns, view.rows);
      const context = [["metric", e.metric], ["date", e.date], ["spec_id", e.spec_id], ["kind", e.kind]];
      if (e.kind === "frequency") context.push(["postprocessing", e.postprocessing]);
      if (view.source) context.push(["source", view.source]);
      S.shown = { columns: view.columns, rows: view.rows, context, name: `${e.metric}-${e.date}${e.postprocessing === "norm-sub" ? "-normsub" : ""}.csv` };
      location.hash = new URLSearchParams({ metric: e.metric, day: String(e.day) }).toString();
      document.body.dataset.shown = `${e.metric}/${e.day}/${e.postprocessing || e.kind}`;
    } catch (err) {
      showError(err);
    } finally {
      if (seq === showing) document.body.classList.remove("loading");
    }
  }

  function showError(err) {
    $("error").textContent = String(err.message || err);
    $("error").hidden = false;
  }

  async function refreshFreshness() {
    try {
      const f = await getJSON("v1/freshness");
      const parts = f.partitions.map((p) => el("tr", { "data-partition": String(p.partition) },
        el("td", {}, `${p.topic}[${p.partition}]`),
        el("td", { class: "num", "data-value": String(p.committed) }, fmtInt(p.committed)),
        el("td", { class: "num", "data-value": String(p.read) }, fmtInt(p.read))));
      const age = f.snapshot_time === null ? null : Math.max(0, f.now - f.snapshot_time);
      $("freshness").replaceChildren(
        el("div", { "data-testid": "snapshot-time", "data-value": f.snapshot_time === null ? null : String(f.snapshot_time) },
          f.snapshot_time === null ? "no snapshot yet" : `snapshot ${isoTime(f.snapshot_time)} (${age.toFixed(0)} s ago)`),
        el("div", { "data-testid": "consumer-state", class: f.ready ? "ok" : f.state === "waiting" || f.state === "lost" ? "bad" : null }, `consumer ${f.state}${f.member ? " · " + f.member : ""}`),
        el("table", { class: "offsets" },
          el("thead", {}, el("tr", {}, el("th", {}, "partition"), el("th", { title: "counted in the last snapshot and committed" }, "committed"), el("th", { title: "read and counted in the figures shown" }, "read"))),
          el("tbody", {}, ...parts)),
      );
    } catch (err) {
      $("freshness").textContent = `freshness unknown: ${err.message || err}`;
    }
  }

  async function reload() {
    try {
      const [defs, avail] = await Promise.all([getJSON("v1/metrics"), getJSON("v1/estimates")]);
      S.defs = Object.fromEntries(defs.metrics.map((m) => [m.name, m]));
      S.available = avail.estimates;
      await refreshFreshness();
      const h = new URLSearchParams(location.hash.slice(1));
      const want = S.metric || h.get("metric");
      const name = want && entriesOf(want).length ? want : (S.available[0] || {}).metric;
      if (!name) {
        renderNav();
        showError(new Error("no estimates yet: no shuffled batch has been counted"));
        return;
      }
      await selectMetric(name, S.entry && S.entry.metric === name ? S.entry.day : h.get("day") || undefined);
    } catch (err) {
      showError(err);
    }
  }

  $("day").addEventListener("change", () => {
    S.entry = S.entries[Number($("day").value)];
    show();
  });
  $("normsub").addEventListener("change", () => {
    S.normSub = $("normsub").checked;
    show();
  });
  $("noise").addEventListener("change", () => {
    S.includeNoise = $("noise").checked;
    show();
  });
  $("rows").addEventListener("change", () => {
    S.rows = Number($("rows").value);
    show();
  });
  window.addEventListener("hashchange", () => {
    // a link or the back button: #metric=NAME&day=N (show() writes the same form, which changes nothing here)
    const h = new URLSearchParams(location.hash.slice(1));
    const m = h.get("metric");
    const d = h.get("day");
    if (!m || !entriesOf(m).length) return;
    if (m !== S.metric || (d && S.entry && String(S.entry.day) !== d)) selectMetric(m, d || undefined);
  });
  $("download").addEventListener("click", download);
  $("refresh").addEventListener("click", reload);
  setInterval(refreshFreshness, 5000);
  reload();
})();
