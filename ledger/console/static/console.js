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

function health(g) {
  // a group's health word and, beside it, why
  return el("span", { class: "health", "data-group": g.group }, word(g.health), " ", el("span", { class: "reason", "data-reason": g.health }, g.health_reason));
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
      ["failed runs", a.failed_runs, "#/runs?status=failed"],
      ["dead-lettered", a.dead_lettered, "#/dead-letters"],
    ].map(([label, n, href]) => el(href ? "a" : "div", { class: `card ${n ? "error" : "ok"}`, "data-attention": label, href }, el("b", {}, n), label)),
  );
  const rows = [];
  for (const s of o.streams) {
    for (const g of s.groups) {
      rows.push([
        streamLink(s.stream),
        g.group,
        health(g),
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
    el("p", { class: "muted", id: "lag-rule" }, `a group is lagging when its oldest unacknowledged message is older than ${age(o.lag_age)}, or its lag rose at each of the last ${o.growing_reads} reads`),
    el("h2", {}, "Consumer groups"),
    rows.length
      ? table(["stream", "group", "health", "lag", "age", "appended", "handled", "exhausted", "dead"], rows)
      : el("p", { class: "muted" }, "no stream has a consumer group"),
    el("h2", {}, "Runs"),
    runs,
    el("h2", {}, "Streams"),
    o.streams.length
      ? table(
          ["stream", "type", "appended", "last appended", "groups", "state"],
          o.streams.map((s) => [streamLink(s.stream), s.dead_letters ? "dead letters" : s.type, s.appended, s.last_appended_at || "-", s.groups.length, s.failed ? word("failed") : s.finished ? "finished" : "open"]),
        )
      : el("p", { class: "muted" }, "no stream"),
    el("p", { class: "muted" }, `read ${o.read_at || "-"} (every ${o.interval} s)`),
  );
}

// -- a stream ------------------------------------------------------------------------------

function plot(points, read, width = 640, height = 160) {
  // points: [when, lag, appended, acked, age]; what `read` takes of them over the time the console watched
  const pad = 30;
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

function handledRates(points) {
  // messages acknowledged per second between samples, at the later one: [when, _, _, _, _, rate]
  const rates = [];
  for (let i = 1; i < points.length; i++) {
    const span = points[i][0] - points[i - 1][0], done = points[i][3] - points[i - 1][3];
    if (span > 0 && done >= 0) rates.push([...points[i], done / span]);
  }
  return rates;
}

function smallPlots(points) {
  // beside the lag: the rate it was handled at and the age of its oldest unacknowledged message
  const rates = handledRates(points);
  return el(
    "div",
    { class: "small-plots" },
    el("figure", { class: "rate-plot", "data-samples": rates.length }, el("figcaption", {}, "handled per second"), plot(rates, (p) => Math.round(p[5]), 312, 110)),
    el("figure", { class: "age-plot", "data-samples": points.length }, el("figcaption", {}, "age of the oldest unacknowledged, seconds"), plot(points, (p) => p[4] ?? 0, 312, 110)),
  );
}

function clock(seconds) {
  return new Date(seconds * 1000).toISOString().slice(0, 19).replace("T", " ") + "Z";
}

function appendsPlot(s) {
  // the kept history of appends, from the stream's append marks: the sequence it reached over time,
  // and each group's position across it (where its line meets the curve: when its next message came)
  const marks = s.appends.filter((m) => m[1] !== null);
  const points = marks.map(([seq, at]) => [at, seq - 1]);
  if (marks.length && s.appended >= marks[marks.length - 1][0]) {
    const last = s.last_appended_at ? Date.parse(s.last_appended_at) / 1000 : marks[marks.length - 1][1];
    points.push([Math.max(last, marks[marks.length - 1][1]), s.appended]);
  }
  const width = 640, height = 160, pad = 30;
  const chart = svg("svg", { width, height, class: "plot", role: "img" });
  chart.append(svg("line", { class: "axis", x1: pad, y1: height - pad, x2: width - 5, y2: height - pad }));
  chart.append(svg("line", { class: "axis", x1: pad, y1: 5, x2: pad, y2: height - pad }));
  const box = el("div", { class: "appends-plot", "data-marks": marks.length, "data-appended": s.appended }, chart);
  if (points.length < 2) {
    chart.append(svg("text", { x: pad + 8, y: height / 2 }, "one append mark so far: the history grows a mark a second"));
    return box;
  }
  const t0 = points[0][0], t1 = Math.max(points[points.length - 1][0], t0 + 1);
  const low = points[0][1], top = Math.max(low + 1, s.appended);
  const x = (t) => pad + ((t - t0) / (t1 - t0)) * (width - pad - 10);
  const y = (v) => height - pad - ((v - low) / (top - low)) * (height - pad - 10);
  const line = points.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
  chart.append(svg("polyline", { class: "appended", points: line }));
  for (const g of s.groups) {
    if (g.acked_through < low) continue; // behind the kept history: its position is off this plot
    const gy = y(g.acked_through).toFixed(1);
    chart.append(svg("line", { class: "position", x1: pad, y1: gy, x2: width - 10, y2: gy, "data-group": g.group }, svg("title", {}, `${g.group}: acknowledged through ${g.acked_through}`)));
    chart.append(svg("text", { x: width - 10 - 7 * g.group.length, y: Number(gy) - 3 }, g.group));
  }
  chart.append(svg("text", { x: 2, y: 14 }, String(top)));
  chart.append(svg("text", { x: pad, y: height - 8 }, `${clock(t0)} to ${clock(t1)}`));
  return box;
}

async function stream(name, withMessages) {
  const s = await get(`api/streams/${encodeURIComponent(name)}${withMessages ? "?messages=1" : ""}`);
  const parts = [
    el("h1", {}, `Stream ${s.stream}`),
    el("p", {}, `${s.type}, ${s.appended} appended, last ${s.last_appended_at || "-"}`, s.failed ? word("failed") : "", s.finished ? " finished" : ""),
  ];
  if (s.dead_letters) {
    parts.push(el("p", {}, "a stream of dead letters: ", el("a", { href: `#/dead-letters?stream=${encodeURIComponent(s.stream)}` }, "show them")));
  }
  parts.push(el("h2", {}, "Appends over the kept history"), appendsPlot(s));
  for (const g of s.groups) {
    const dead = g.dead_lettered ? el("a", { href: `#/dead-letters?source=${encodeURIComponent(s.stream)}`, class: "dead-letters" }, `${g.dead_lettered} dead-lettered`) : "0 dead-lettered";
    parts.push(
      el("h2", {}, `Group ${g.group} `, health(g)),
      el("p", {}, `lag ${g.lag}, oldest unacknowledged ${age(g.age_seconds)} ago, ${rate(g.handled_per_s)} handled, ${g.exhausted} exhausted, `, dead),
      el("p", { class: "muted" }, "lag while the console watched"),
      lagPlot(g.group, s.history[g.group] || []),
      smallPlots(s.history[g.group] || []),
    );
  }
  if (s.groups.length) {
    parts.push(el("p", {}, "keyed state: ", ...s.groups.flatMap((g, i) => [i ? ", " : "", keysLink(s.stream, g.group)])));
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

// -- keyed state ---------------------------------------------------------------------------

function keysPath(name, group) {
  return `/keys/${encodeURIComponent(name)}/${encodeURIComponent(group)}`;
}

function keysLink(name, group) {
  return el("a", { href: `#${keysPath(name, group)}`, "data-keys": group }, group);
}

function keyText(key) {
  return typeof key === "string" ? key : JSON.stringify(key);
}

function keysForm(path, query) {
  // a prefix to page by, or one key to read: the page's address changes, so it can be shared
  const prefix = el("input", { name: "prefix", id: "keys-prefix", placeholder: "prefix", value: query.get("prefix") || "" });
  const key = el("input", { name: "key", id: "keys-key", placeholder: "one key", value: query.get("key") || "" });
  const form = el("form", { id: "keys-form" }, prefix, " ", key, " ", el("button", { type: "submit" }, "show"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    document.activeElement.blur(); // the page is drawn again: see refresh
    location.hash = hashWith(path, new URLSearchParams(), key.value ? { key: key.value } : { prefix: prefix.value });
  });
  return form;
}

async function keys(name, group, query) {
  const path = keysPath(name, group);
  const asked = new URLSearchParams({ stream: name, group });
  for (const k of ["key", "prefix", "cursor", "limit"]) if (query.get(k)) asked.set(k, query.get(k));
  const k = await get(`api/keys?${asked}`);
  const parts = [
    el("h1", {}, `Keyed state of ${group}`),
    el("p", {}, "on ", streamLink(name), ", as confirmed: what its handler committed, read when asked"),
    keysForm(path, query),
  ];
  if (query.get("key")) {
    parts.push(
      k.found
        ? table(["key", "value"], [[keyText(k.key.key), el("pre", { class: "value" }, JSON.stringify(k.key.value, null, 2))]])
        : el("p", { class: "muted", id: "no-key" }, `no key ${query.get("key")}: never written, deleted, or expired`),
    );
  } else {
    const rows = k.keys.map((e) => [el("a", { href: hashWith(path, new URLSearchParams(), { key: keyText(e.key) }) }, keyText(e.key)), el("pre", { class: "value" }, JSON.stringify(e.value))]);
    parts.push(rows.length ? table(["key", "value"], rows) : el("p", { class: "muted" }, query.get("prefix") ? "no key under this prefix" : "no keys"));
    const links = [];
    if (query.get("cursor")) links.push(el("a", { href: hashWith(path, query, { cursor: "" }), id: "keys-first" }, "first page"));
    if (k.next) links.push(el("a", { href: hashWith(path, query, { cursor: k.next }), id: "keys-next" }, "next page"));
    if (links.length) parts.push(el("p", {}, ...links.flatMap((a, i) => [i ? " · " : "", a])));
  }
  page(...parts);
}

// -- dead letters --------------------------------------------------------------------------

function hashWith(path, query, changes) {
  // the page's address with some of its query changed (a value of "" drops it)
  const next = new URLSearchParams(query);
  for (const [k, v] of Object.entries(changes)) {
    if (v) next.set(k, v);
    else next.delete(k);
  }
  const text = next.toString();
  return `#${path}${text ? `?${text}` : ""}`;
}

async function deadLetters(query) {
  const source = query.get("source") || "", only = query.get("stream") || "", withMessages = query.get("messages") === "1";
  const asked = new URLSearchParams();
  if (source) asked.set("source", source);
  if (withMessages) asked.set("messages", "1");
  const d = await get(`api/dead-letters?${asked}`);
  const letters = d.letters.filter((l) => !only || l.stream === only);
  const rows = letters.map((l) => [
    l.stream === only ? l.stream : el("a", { href: hashWith("/dead-letters", query, { stream: l.stream }) }, l.stream),
    l.stream_seq,
    l.appended_at || "-",
    l.source ? streamLink(l.source) : "-",
    l.seq,
    l.group,
    l.node,
    l.attempts,
    l.error_type || "-",
    ...(withMessages ? [el("pre", { class: "message" }, JSON.stringify(l.message, null, 2))] : []),
  ]);
  const headers = ["kept in", "#", "appended", "from", "seq", "group", "node", "attempts", "error", ...(withMessages ? ["message"] : [])];
  page(
    el("h1", {}, "Dead letters", source ? ` of ${source}` : "", only ? ` in ${only}` : ""),
    el("p", { class: "muted" }, `messages that used their whole attempt budget, the latest of each of ${d.streams.length} dead-letter stream(s)`),
    source || only ? el("p", {}, el("a", { href: "#/dead-letters" }, "all dead letters")) : "",
    withMessages
      ? el("p", {}, el("a", { href: hashWith("/dead-letters", query, { messages: "" }) }, "hide the messages"))
      : el("p", {}, el("a", { href: hashWith("/dead-letters", query, { messages: "1" }), id: "show-letters" }, "show the messages")),
    rows.length ? table(headers, rows) : el("p", { class: "muted" }, d.streams.length ? "none kept" : "no stream of dead letters"),
  );
}

// -- runs ----------------------------------------------------------------------------------

const WINDOWS = [["", "any time"], ["3600", "last hour"], ["86400", "last day"], ["604800", "last week"]];

async function runs(query) {
  const status = query.get("status") || "", graph = query.get("graph") || "", within = query.get("within") || "";
  const asked = new URLSearchParams();
  if (status) asked.set("status", status);
  if (graph) asked.set("graph", graph);
  if (within) asked.set("since", new Date(Date.now() - Number(within) * 1000).toISOString().slice(0, 19) + "Z");
  const [list, o] = await Promise.all([get(`api/runs?${asked}`), get("api/overview")]);
  const choice = (name, value, label, current) =>
    el("a", { href: hashWith("/runs", query, { [name]: value }), class: value === current ? "chosen" : "", "data-filter": `${name}=${value}` }, label);
  const filter = el(
    "div",
    { class: "filters" },
    el("p", {}, "status: ", ...["", ...Object.keys(o.runs)].map((s) => choice("status", s, s || "all", status))),
    el("p", {}, "graph: ", ...["", ...o.graphs].map((g) => choice("graph", g, g || "all", graph))),
    el("p", {}, "created: ", ...WINDOWS.map(([w, label]) => choice("within", w, label, within))),
  );
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

function levels(members) {
  // members by level: a member after every member that provides a key it requires
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

function later(a, b) {
  // whether attempt numbers a come after b, mount by mount from the run down
  for (let i = 0; i < Math.min(a.length, b.length); i++) if (a[i] !== b[i]) return a[i] > b[i];
  return a.length > b.length;
}

function nodeStatuses(run) {
  // each node's status by its path in the graph ("sub/node"): a mount's later attempt ("sub#2") wins
  const found = new Map();
  for (const n of run.nodes) {
    if (n.boundary !== "node") continue;
    const parts = n.path.split("/").map((p) => p.split("#"));
    const path = parts.map(([name]) => name).join("/");
    const attempt = parts.map(([, i]) => Number(i || 1));
    const seen = found.get(path);
    if (!seen || later(attempt, seen.attempt)) found.set(path, { status: n.status, attempt });
  }
  return new Map([...found].map(([path, { status }]) => [path, status]));
}

function subStatus(statuses) {
  // a Sub at a glance, from its nodes: failed or running if one is, completed when all are
  if (statuses.includes("failed")) return "failed";
  if (statuses.includes("active")) return "active";
  if (statuses.length && statuses.every((s) => s !== "waiting")) return "completed";
  return statuses.some((s) => s !== "waiting") ? "active" : "waiting";
}

const NODE_W = 150, NODE_H = 40, GAP_X = 60, GAP_Y = 20, SUB_PAD = 12, SUB_TITLE = 22;

function layout(shape, prefix, status) {
  // a graph's members placed by level, Subs expanded into boxes holding their own graph's layout;
  // returns its size, each member's box and status, and a function drawing it at an offset
  const members = shape.members;
  const { level, providers } = levels(members);
  const inner = new Map();
  const size = (m) => {
    if (!m.graph) return [NODE_W, NODE_H];
    const laid = layout(m.graph, `${prefix}${m.name}/`, status);
    inner.set(m.name, laid);
    return [laid.width + 2 * SUB_PAD, laid.height + SUB_TITLE + SUB_PAD];
  };
  const columns = new Map();
  for (const m of members) {
    const d = level.get(m.name);
    if (!columns.has(d)) columns.set(d, []);
    columns.get(d).push([m, size(m)]);
  }
  const boxes = new Map();
  let x = 0, height = 0;
  for (const d of [...columns.keys()].sort((a, b) => a - b)) {
    let y = 0, widest = 0;
    for (const [m, [w, h]] of columns.get(d)) {
      boxes.set(m.name, [x, y, w, h]);
      y += h + GAP_Y;
      widest = Math.max(widest, w);
    }
    height = Math.max(height, y - GAP_Y);
    x += widest + GAP_X;
  }
  const states = new Map();
  for (const m of members) {
    const path = `${prefix}${m.name}`;
    states.set(m.name, m.graph ? subStatus([...inner.get(m.name).states.values()]) : status.get(path) || "waiting");
  }
  const draw = (drawing, ox, oy) => {
    for (const m of members) {
      for (const [key] of m.requires) {
        const from = providers.get(key);
        if (!from || !boxes.has(from)) continue;
        const [x1, y1, w1, h1] = boxes.get(from), [x2, y2, , h2] = boxes.get(m.name);
        const a = [ox + x1 + w1, oy + y1 + h1 / 2], b = [ox + x2, oy + y2 + h2 / 2];
        drawing.append(svg("path", { class: "edge", d: `M${a[0]},${a[1]} C${a[0] + GAP_X / 2},${a[1]} ${b[0] - GAP_X / 2},${b[1]} ${b[0]},${b[1]}` }));
      }
    }
    for (const m of members) {
      const [bx, by, w, h] = boxes.get(m.name);
      const path = `${prefix}${m.name}`, state = states.get(m.name);
      if (m.graph) {
        const group = svg("g", { class: `sub ${state}`, "data-sub": path, "data-status": state }, svg("rect", { x: ox + bx, y: oy + by, width: w, height: h, rx: 6 }), svg("text", { x: ox + bx + 8, y: oy + by + 15 }, `Sub ${m.name} (${m.graph.name}) ${state}`));
        drawing.append(group);
        inner.get(m.name).draw(drawing, ox + bx + SUB_PAD, oy + by + SUB_TITLE);
      } else {
        drawing.append(svg("g", { class: `node ${state}`, "data-node": path, "data-status": state }, svg("rect", { x: ox + bx, y: oy + by, width: w, height: h, rx: 4 }), svg("text", { x: ox + bx + 8, y: oy + by + 17 }, m.name), svg("text", { x: ox + bx + 8, y: oy + by + 32 }, state)));
      }
    }
  };
  return { width: Math.max(x - GAP_X, NODE_W), height: Math.max(height, NODE_H), states, draw };
}

function graphDrawing(run) {
  const topology = run.topology;
  if (!topology) return el("p", { class: "muted" }, "this run's record keeps no topology (written before runs kept one)");
  const laid = layout(topology, "", nodeStatuses(run));
  const drawing = svg("svg", { width: laid.width + 40, height: laid.height + 40, class: "graph" });
  drawing.append(svg("defs", {}, svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 6, markerHeight: 6, orient: "auto" }, svg("path", { d: "M0,0 L10,5 L0,10 z", fill: "#999" }))));
  laid.draw(drawing, 20, 20);
  return drawing;
}

function outputs(run) {
  // each confirmed node's outputs, as runs show --values gives them
  const rows = run.nodes.filter((n) => n.outputs).flatMap((n) => Object.entries(n.outputs).map(([key, value]) => [n.path, key, el("pre", { class: "message" }, JSON.stringify(value, null, 2))]));
  return rows.length ? table(["node", "output", "value"], rows) : el("p", { class: "muted" }, "no node confirmed an output yet");
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

async function run(id, withOutputs) {
  const r = await get(`api/runs/${encodeURIComponent(id)}${withOutputs ? "?values=1" : ""}`);
  const here = `#/run/${encodeURIComponent(id)}`;
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
    el("h2", {}, "Outputs"),
    withOutputs
      ? outputs(r)
      : el("p", {}, el("a", { href: `${here}?outputs=1`, id: "show-outputs" }, "show the nodes' confirmed outputs")),
  );
}

// -- routing and live updates --------------------------------------------------------------

function route() {
  const [path, search] = (location.hash.slice(1) || "/").split("?");
  const query = new URLSearchParams(search || "");
  if (path.startsWith("/stream/")) {
    const name = decodeURIComponent(path.slice("/stream/".length));
    current = () => stream(name, query.get("messages") === "1");
  } else if (path.startsWith("/keys/")) {
    const [name, group] = path.slice("/keys/".length).split("/").map(decodeURIComponent);
    current = () => keys(name, group, query);
  } else if (path.startsWith("/run/")) {
    const id = decodeURIComponent(path.slice("/run/".length));
    current = () => run(id, query.get("outputs") === "1");
  } else if (path === "/runs") {
    current = () => runs(query);
  } else if (path === "/dead-letters") {
    current = () => deadLetters(query);
  } else {
    current = overview;
  }
  refresh();
}

let drawing = false;
let again = false; // a read came while the page was drawing: what it drew may predate it
async function refresh() {
  if (drawing) {
    again = true;
    return;
  }
  if (document.activeElement && document.activeElement.tagName === "INPUT") return; // not while someone types
  drawing = true;
  again = false;
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
  if (again) refresh(); // once more, after the read it missed
}

window.addEventListener("hashchange", route);
window.addEventListener("DOMContentLoaded", () => {
  route();
  const events = new EventSource("api/events");
  events.addEventListener("read", refresh);
});
