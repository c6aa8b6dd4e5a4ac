// courier dashboard: redraws the sections from /api/state every 2 s and draws the charts.
(function () {
  "use strict";
  const actions = document.body.dataset.actions === "true";
  const el = (tag, text, cls) => {
    const e = document.createElement(tag);
    if (text !== undefined) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  };
  const time = (t) => t ? new Date(t).toISOString().replace("T", " ").slice(0, 19) + " UTC" : "-";
  const dash = (v) => v === null || v === undefined ? "-" : String(v);
  const rate = (r) => r.toFixed(1) + "/s";
  function table(headers, rows) {
    const t = el("table"), head = el("thead"), tr = el("tr"), body = el("tbody");
    headers.forEach((h) => tr.appendChild(el("th", h)));
    head.appendChild(tr); t.appendChild(head);
    rows.forEach((row) => {
      const r = el("tr");
      row.forEach((cell) => {
        const td = el("td");
        if (cell instanceof Node) td.appendChild(cell); else td.textContent = cell;
        r.appendChild(td);
      });
      body.appendChild(r);
    });
    t.appendChild(body);
    return t;
  }
  function put(id, ...nodes) {
    const body = document.querySelector("#" + id + " .body");
    body.replaceChildren(...nodes);
  }
  function button(label, path) {
    const b = el("button", label, "act");
    b.type = "button";
    b.addEventListener("click", () => act(path, label));
    return b;
  }
  function buttons(list) {
    const span = el("span");
    list.forEach(([label, path]) => span.appendChild(button(label, path)));
    return span;
  }
  async function act(path, label) {
    const out = document.getElementById("action-result");
    const token = document.getElementById("token").value;
    try {
      const res = await fetch(path, { method: "POST", headers: { "Authorization": "Bearer " + token } });
      out.textContent = label + ": " + (await res.text());
    } catch (e) {
      out.textContent = label + ": " + e;
    }
    refresh();
  }
  const svgNs = "http://www.w3.org/2000/svg";
  function svgEl(tag, attrs, text) {
    const e = document.createElementNS(svgNs, tag);
    Object.entries(attrs).forEach(([k, v]) => e.setAttribute(k, v));
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function chart(svg, b, s) {
    const W = 640, H = 160, L = 40, R = 10, T = 10, B = 22;
    const now = Date.parse(s.now) / 1000, start = now - s.chart_window;
    const byBucket = new Map(b.series.map(([t, v]) => [t, v]));
    const points = [];
    // Whole buckets inside the window; the current one is still filling and is left out.
    for (let t = Math.ceil(start / s.chart_step) * s.chart_step; t + s.chart_step <= now; t += s.chart_step) {
      points.push([t, byBucket.get(t) || 0]);
    }
    // The frame holds every line drawn: the calls, the declared and the effective pace.
    const top = Math.max(b.declared_per_second * 1.25, b.effective_per_second * 1.25, ...points.map((p) => p[1]), 1);
    const x = (t) => L + (t - start) / s.chart_window * (W - L - R);
    const y = (v) => H - B - v / top * (H - T - B);
    const parts = [
      svgEl("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis" }),
      svgEl("line", { x1: L, y1: T, x2: L, y2: H - B, class: "axis" }),
      svgEl("text", { x: 2, y: y(top) + 10 }, top.toFixed(1)),
      svgEl("text", { x: 2, y: H - B }, "0"),
      svgEl("text", { x: L, y: H - 6 }, "-" + Math.round(s.chart_window / 60) + " min"),
      svgEl("text", { x: W - R - 24, y: H - 6 }, "now"),
      svgEl("line", { x1: L, x2: W - R, y1: y(b.declared_per_second), y2: y(b.declared_per_second), class: "declared" }),
      svgEl("line", { x1: L, x2: W - R, y1: y(b.effective_per_second), y2: y(b.effective_per_second), class: "effective" }),
      svgEl("polyline", { class: "calls", points: points.map(([t, v]) => x(t).toFixed(1) + "," + y(v).toFixed(1)).join(" ") }),
      svgEl("text", { x: L + 8, y: T + 12 }, "calls/s (blue), declared " + rate(b.declared_per_second) + " (green), paced " + rate(b.effective_per_second) + " (red)"),
    ];
    svg.replaceChildren(...parts);
  }
  // A table the server laid out, each row with its action buttons, if any.
  function laidOut(t, actionsOf) {
    const headers = t.headers.concat(actionsOf ? [""] : []);
    return table(headers, t.rows.map((row, i) => actionsOf ? row.concat([actionsOf(i)]) : row));
  }
  function draw(s) {
    const conns = s.connections.map((c) => [
      c.name, c.writer, c.budget_key, c.circuit, c.paused ? "paused" : "-",
    ].concat(actions ? [buttons([
      ["pause", "/api/connections/" + encodeURIComponent(c.name) + "/pause"],
      ["resume", "/api/connections/" + encodeURIComponent(c.name) + "/resume"],
      ["lift block", "/api/connections/" + encodeURIComponent(c.name) + "/unblock"],
    ])] : []));
    put("connections", table(["connection", "writer", "budget", "circuit", "paused"]
      .concat(actions ? [""] : []), conns));
    const charts = el("div", undefined, "charts");
    s.budgets.filter((b) => b.busy).forEach((b) => {
      const fig = el("figure", undefined, "chart");
      fig.dataset.budget = b.key;
      fig.appendChild(el("figcaption", b.key + ": calls per second (last " + Math.round(s.chart_window / 60) + " min)"));
      const svg = svgEl("svg", { viewBox: "0 0 640 160", role: "img" });
      fig.appendChild(svg);
      chart(svg, b, s);
      charts.appendChild(fig);
    });
    put("budgets", laidOut(s.tables.budgets), charts);
    const blocked = s.budgets.filter((b) => b.blocked_until);
    put("blocks", blocked.length === 0 ? el("p", "No rate-limit block in force.", "none") :
      table(["budget", "connection", "until", "set by rule", "why"],
        blocked.map((b) => [b.key, b.connection, time(b.blocked_until), dash(b.blocked_by), dash(b.block_reason)])));
    put("circuits", table(["connection", "circuit", "failures in a row", "open until"],
      s.connections.map((c) => [c.name, c.circuit, String(c.consecutive_failures), time(c.open_until)])));
    put("rules", laidOut(s.tables.rules, actions ? (i) => {
      const name = encodeURIComponent(s.rules[i].name);
      return buttons([
        ["retry exhausted", "/api/rules/" + name + "/retry?outcome=exhausted"],
        ["retry rejected", "/api/rules/" + name + "/retry?outcome=rejected"],
        ["pause", "/api/rules/" + name + "/pause"],
        ["resume", "/api/rules/" + name + "/resume"],
      ]);
    } : undefined));
    put("problems", ...(s.problems.length === 0 ? [] : [table(["what", "left alone until", "reason"],
      s.problems.map((p) => [p.what, time(p.until), p.reason]))]));
    put("jobs", el("h3", "In flight"),
      s.jobs_in_flight.length === 0 ? el("p", "No job in flight.", "none") : laidOut(s.tables.jobs_in_flight),
      el("h3", "Ended lately"),
      s.jobs_ended.length === 0 ? el("p", "No job ended.", "none") : laidOut(s.tables.jobs_ended));
    put("erasures", s.erasures.length === 0 ? el("p", "No erasure open.", "none") : laidOut(s.tables.erasures));
    put("runs", laidOut(s.tables.runs));
    document.getElementById("updated").textContent = "as of " + time(s.now);
    // Whether the page fits its window's width, nothing cut off at the right edge (read by
    // the browser test, and by anyone inspecting the page).
    document.body.dataset.fits = String(document.documentElement.scrollWidth <= window.innerWidth);
    document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes) + 1);
  }
  async function refresh() {
    try {
      const res = await fetch("/api/state", { cache: "no-store" });
      if (!res.ok) throw new Error(await res.text());
      draw(await res.json());
    } catch (e) {
      document.getElementById("updated").textContent = "not updated: " + e.message;
    }
  }
  async function showHistory(key) {
    const res = await fetch("/api/history?key=" + encodeURIComponent(key), { cache: "no-store" });
    if (!res.ok) { put("history", el("p", await res.text(), "none")); return; }
    const h = await res.json();
    put("history", h.lines.length === 0 ?
      el("p", "No delivery with record key " + h.key + " (never enqueued, or removed by retention).", "none") :
      table(["at", "rule", "delivery", "event", "run", "attempt", "http", "detail", "status now"],
        h.lines.map((l) => [time(l.at), l.rule, String(l.delivery_id), l.outcome || "enqueued",
          l.run_id ? "#" + l.run_id : "-", dash(l.attempt), dash(l.http_status), dash(l.detail), l.status])));
    history.replaceState(null, "", "/?key=" + encodeURIComponent(key));
  }
  document.getElementById("history-form").addEventListener("submit", (ev) => {
    const key = document.getElementById("history-key").value.trim();
    if (key) { ev.preventDefault(); showHistory(key); }
  });
  refresh();
  setInterval(refresh, 2000);
})();
