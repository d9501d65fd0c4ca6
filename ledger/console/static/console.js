// The streamledger console: pages built from the server's JSON, updated on each of its reads.
// Text from the ledger is only ever set as text (textContent), never parsed as markup.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const token = new URLSearchParams(location.search).get("token");
let current = null; // the page shown: a function that fetches and draws it again

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== null && v !== undefined) node.setAttribute(k, v);
  }
  for (const child of children) node.append(child instanceof Node ? child : String(child ?? ""));
  return node;
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const child of children) node.append(child instanceof Node ? child : String(child));
  return node;
}

async function get(path) {
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  const answer = await fetch(path, { headers });
  if (!answer.ok) throw new Error(`${path}: ${answer.status}`);
  return answer.json();
}

function word(text) {
  return el("span", { class: text, "data-status": text }, text);
}

function table(headers, rows) {
  return el(
    "table",
    {},
    el("thead", {}, el("tr", {}, ...headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, ...rows.map((cells) => el("tr", {}, ...cells.map((c) => el("td", {}, c))))),
  );
}

function page(...children) {
  const main = document.getElementById("page");
  main.replaceChildren(...children);
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  const s = Math.floor(seconds);
  return s < 60 ? `${s}s` : s < 3600 ? `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s` : `${Math.floor(s / 3600)}h`;
}

function rate(value) {
  return value === null || value === undefined ? "-" : `${value}/s`;
}

function streamLink(name) {
  return el("a", { href: `#/stream/${encodeURIComponent(name)}` }, name);
}

// -- overview ------------------------------------------------------------------------------

async function overview() {
  const o = await get("api/overview");
  const owner = o.owner ? ` (owned by process ${o.owner.pid} on ${o.owner.host}${o.owner.running === false ? ", gone" : ""})` : "";
  document.getElementById("ledger").textContent = o.ledger + owner;
  const a = o.attention;
  const cards = el(
    "div",
    { class: "cards", id: "attention" },
    ...[
      ["lagging", a.lagging],
      ["exhausted", a.exhausted],
      ["stopped", a.stopped],
      ["failed runs", a.failed_runs],
    ].map(([label, n]) => el("div", { class: `card ${n ? "error" : "ok"}`, "data-attention": label }, el("b", {}, n), label)),
  );
  const rows = [];
  for (const s of o.streams) {
    for (const g of s.groups) {
      rows.push([
        streamLink(s.stream),
        g.group,
        word(g.health),
        g.lag,
        age(g.age_seconds),
        rate(g.appended_per_s),
        rate(g.handled_per_s),
        g.exhausted,
        g.dead_lettered,
      ]);
    }
  }
  const runs = el(
    "div",
    { class: "cards" },
    ...Object.entries(o.runs).map(([status, n]) =>
      el("a", { class: "card", href: `#/runs?status=${status}` }, el("b", {}, n), word(status)),
    ),
  );
  page(
    el("h1", {}, "Overview"),
    o.error ? el("p", { class: "error" }, `the last read failed: ${o.error}`) : "",
    cards,
    el("h2", {}, "Consumer groups"),
    rows.length
      ? table(["stream", "group", "health", "lag", "age", "appended", "handled", "exhausted", "dead"], rows)
      : el("p", { class: "muted" }, "no stream has a consumer group"),
    el("h2", {}, "Runs"),
    runs,
    el("p", { class: "muted" }, `read ${o.read_at || "-"} (every ${o.interval} s)`),
  );
}

// -- a stream ------------------------------------------------------------------------------

function plot(points, read) {
  // points: [when, lag, appended, acked]; the lag over the time the console watched
  const width = 640, height = 160, pad = 30;
  const chart = svg("svg", { width, height, class: "plot", role: "img" });
  chart.append(svg("line", { class: "axis", x1: pad, y1: height - pad, x2: width - 5, y2: height - pad }));
  chart.append(svg("line", { class: "axis", x1: pad, y1: 5, x2: pad, y2: height - pad }));
  if (points.length === 0) return chart;
  const t0 = points[0][0], t1 = Math.max(points[points.length - 1][0], t0 + 1);
  const top = Math.max(1, ...points.map((p) => read(p)));
  const x = (t) => pad + ((t - t0) / (t1 - t0)) * (width - pad - 10);
  const y = (v) => height - pad - (v / top) * (height - pad - 10);
  const line = points.map((p) => `${x(p[0]).toFixed(1)},${y(read(p)).toFixed(1)}`).join(" ");
  chart.append(svg("polyline", { class: "lag", points: line }));
  chart.append(svg("text", { x: 2, y: 14 }, String(top)));
  chart.append(svg("text", { x: pad, y: height - 8 }, `${Math.round(t1 - t0)} s watched`));
  return chart;
}

function lagPlot(group, points) {
  // the plot, and what it shows as attributes: how many samples, the lag now and at its highest
  const lags = points.map((p) => p[1]);
  return el(
    "div",
    {
      class: "lag-plot",
      "data-group": group,
      "data-samples": points.length,
      "data-last-lag": lags.length ? lags[lags.length - 1] : "",
      "data-max-lag": lags.length ? Math.max(...lags) : "",
    },
    plot(points, (p) => p[1]),
  );
}

async function stream(name, withMessages) {
  const s = await get(`api/streams/${encodeURIComponent(name)}${withMessages ? "?messages=1" : ""}`);
  const parts = [
    el("h1", {}, `Stream ${s.stream}`),
    el("p", {}, `${s.type}, ${s.appended} appended, last ${s.last_appended_at || "-"}`, s.failed ? word("failed") : "", s.finished ? " finished" : ""),
  ];
  for (const g of s.groups) {
    parts.push(
      el("h2", {}, `Group ${g.group} `, word(g.health)),
      el("p", {}, `lag ${g.lag}, oldest unacknowledged ${age(g.age_seconds)} ago, ${rate(g.handled_per_s)} handled, ${g.exhausted} exhausted, ${g.dead_lettered} dead-lettered`),
      lagPlot(g.group, s.history[g.group] || []),
    );
  }
  if (withMessages) {
    parts.push(el("h2", {}, "Latest messages"));
    if (!s.messages.length) parts.push(el("p", { class: "muted" }, "none kept: every group acknowledged them, and they were compacted away"));
    for (const m of s.messages) {
      parts.push(el("pre", { class: "message" }, `#${m.seq} ${m.appended_at || ""}\n${JSON.stringify(m.value, null, 2)}`));
    }
  } else {
    parts.push(el("p", {}, el("a", { href: `#/stream/${encodeURIComponent(name)}?messages=1`, id: "show-messages" }, "show the latest messages")));
  }
  page(...parts);
}

// -- runs ----------------------------------------------------------------------------------

async function runs(query) {
  const status = query.get("status") || "";
  const list = await get(`api/runs${status ? `?status=${encodeURIComponent(status)}` : ""}`);
  const filter = el("p", {}, "status: ", ...["", "running", "completed", "failed", "cancelled"].map((s) => el("a", { href: `#/runs${s ? `?status=${s}` : ""}`, style: "margin-right:.8em" }, s || "all")));
  page(
    el("h1", {}, "Runs"),
    filter,
    list.length
      ? table(
          ["run", "graph", "status", "attempt", "created", "updated", "seconds", "error"],
          list.map((r) => [el("a", { href: `#/run/${encodeURIComponent(r.run_id)}` }, r.run_id), r.graph, word(r.status), r.attempt + 1, r.created_at || "-", r.updated_at || "-", r.seconds ?? "-", r.error || "-"]),
        )
      : el("p", { class: "muted" }, "no run"),
  );
}

function levels(topology) {
  // members by level: a member after every member that provides a key it requires
  const members = topology.members;
  const providers = new Map();
  for (const m of members) for (const [key] of m.provides) providers.set(key, m.name);
  const level = new Map();
  const depth = (m, seen) => {
    if (level.has(m.name)) return level.get(m.name);
    if (seen.has(m.name)) return 0;
    seen.add(m.name);
    let d = 0;
    for (const [key] of m.requires) {
      const from = members.find((x) => x.name === providers.get(key));
      if (from) d = Math.max(d, depth(from, seen) + 1);
    }
    level.set(m.name, d);
    return d;
  };
  for (const m of members) depth(m, new Set());
  return { level, providers };
}

function graphDrawing(run) {
  const topology = run.topology;
  if (!topology) return el("p", { class: "muted" }, "this run's record keeps no topology (written before runs kept one)");
  const status = new Map(run.nodes.filter((n) => n.boundary === "node").map((n) => [n.path.split("/")[0], n.status]));
  const { level, providers } = levels(topology);
  const columns = new Map();
  for (const m of topology.members) {
    const d = level.get(m.name);
    if (!columns.has(d)) columns.set(d, []);
    columns.get(d).push(m);
  }
  const w = 150, h = 40, gx = 60, gy = 20;
  const where = new Map();
  let rows = 0;
  for (const [d, ms] of columns) ms.forEach((m, i) => { where.set(m.name, [20 + d * (w + gx), 20 + i * (h + gy)]); rows = Math.max(rows, i + 1); });
  const drawing = svg("svg", { width: 40 + columns.size * (w + gx), height: 40 + rows * (h + gy), class: "graph" });
  drawing.append(svg("defs", {}, svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 6, markerHeight: 6, orient: "auto" }, svg("path", { d: "M0,0 L10,5 L0,10 z", fill: "#999" }))));
  for (const m of topology.members) {
    for (const [key] of m.requires) {
      const from = providers.get(key);
      if (!from || !where.has(from)) continue;
      const [x1, y1] = where.get(from), [x2, y2] = where.get(m.name);
      drawing.append(svg("path", { class: "edge", d: `M${x1 + w},${y1 + h / 2} C${x1 + w + gx / 2},${y1 + h / 2} ${x2 - gx / 2},${y2 + h / 2} ${x2},${y2 + h / 2}` }));
    }
  }
  for (const m of topology.members) {
    const [x, y] = where.get(m.name);
    const state = status.get(m.name) || "waiting";
    const kind = m.graph ? "Sub " : "";
    drawing.append(svg("g", { class: `node ${state}`, "data-node": m.name, "data-status": state }, svg("rect", { x, y, width: w, height: h, rx: 4 }), svg("text", { x: x + 8, y: y + 17 }, `${kind}${m.name}`), svg("text", { x: x + 8, y: y + 32 }, state)));
  }
  return drawing;
}

function timeline(run) {
  // one bar per node attempt: its confirmed run, and each failed attempt
  const bars = [];
  for (const n of run.nodes) {
    for (const f of n.failed) bars.push({ label: `${n.path} #${f.attempt}`, start: f.started_at, end: f.failed_at, kind: "failed", text: `${f.error_type}: ${f.message}` });
    if (n.boundary === "node" && n.ended_at) bars.push({ label: n.path, start: n.started_at, end: n.ended_at, kind: n.status, text: n.status });
    if (n.boundary === "node" && n.status === "active") bars.push({ label: n.path, start: null, end: null, kind: "active", text: "running" });
  }
  const when = (s) => (s ? Date.parse(s) / 1000 : null);
  const known = bars.flatMap((b) => [when(b.start), when(b.end)]).filter((t) => t !== null);
  const t0 = known.length ? Math.min(...known) : 0, t1 = known.length ? Math.max(...known, t0 + 1) : 1;
  const width = 700, row = 22, left = 180;
  const chart = svg("svg", { width, height: 10 + bars.length * row, class: "timeline" });
  bars.forEach((b, i) => {
    const y = 5 + i * row;
    const x0 = b.start ? left + ((when(b.start) - t0) / (t1 - t0)) * (width - left - 10) : left;
    const x1 = b.end ? left + ((when(b.end) - t0) / (t1 - t0)) * (width - left - 10) : width - 10;
    chart.append(svg("text", { x: 4, y: y + 14 }, b.label));
    chart.append(svg("rect", { class: `bar ${b.kind}`, x: x0, y, width: Math.max(3, x1 - x0), height: row - 6, "data-bar": b.label }, svg("title", {}, b.text)));
  });
  return chart;
}

async function run(id) {
  const r = await get(`api/runs/${encodeURIComponent(id)}`);
  const failures = r.nodes.flatMap((n) => n.failed.map((f) => [n.path, n.boundary, f.attempt, f.error_type, f.message, f.failed_at]));
  page(
    el("h1", {}, `Run ${r.run_id} `, word(r.status)),
    el("p", {}, `graph ${r.graph} version ${r.version}, root attempt ${r.attempt + 1}, started ${r.starts} time(s), created ${r.created_at || "-"}, updated ${r.updated_at || "-"}`, r.error ? ` — failed with ${r.error}` : ""),
    el("h2", {}, "Graph"),
    graphDrawing(r),
    el("h2", {}, "Timeline"),
    r.nodes.length ? timeline(r) : el("p", { class: "muted" }, "no node attempt confirmed yet"),
    el("h2", {}, "Failures"),
    failures.length ? table(["node", "boundary", "attempt", "error", "message", "at"], failures) : el("p", { class: "muted" }, "none"),
  );
}

// -- routing and live updates --------------------------------------------------------------

function route() {
  const [path, search] = (location.hash.slice(1) || "/").split("?");
  const query = new URLSearchParams(search || "");
  if (path.startsWith("/stream/")) {
    const name = decodeURIComponent(path.slice("/stream/".length));
    current = () => stream(name, query.get("messages") === "1");
  } else if (path.startsWith("/run/")) {
    const id = decodeURIComponent(path.slice("/run/".length));
    current = () => run(id);
  } else if (path === "/runs") {
    current = () => runs(query);
  } else {
    current = overview;
  }
  refresh();
}

let drawing = false;
async function refresh() {
  if (drawing) return;
  drawing = true;
  const status = document.getElementById("status");
  try {
    await current();
    status.textContent = `updated ${new Date().toISOString().slice(11, 19)}Z`;
    document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
    window.dispatchEvent(new Event("console:updated")); // what a watcher of the page waits on
  } catch (error) {
    status.textContent = String(error);
  } finally {
    drawing = false;
  }
}

window.addEventListener("hashchange", route);
window.addEventListener("DOMContentLoaded", () => {
  route();
  const events = new EventSource("api/events");
  events.addEventListener("read", refresh);
});
