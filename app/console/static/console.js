// moerag admin console: fetches the admin JSON API with the session cookie + CSRF header and
// draws its plots as inline SVG (no libraries, nothing from outside the machine).
"use strict";
const CSRF = document.querySelector('meta[name="csrf"]').content;
const $ = (id) => document.getElementById(id);
const state = { experts: [], clusters: [], clusterPage: 0, docPage: 0, proposal: null };
const PAGE = 50;
const PALETTE = ["#3559c7", "#e8590c", "#2f9e44", "#c2255c", "#7048e8", "#1098ad", "#f08c00", "#5c940d",
  "#d6336c", "#4263eb", "#0ca678", "#ae3ec9"];
const colorOf = (expertId) => expertId == null ? "#adb5bd" : PALETTE[expertId % PALETTE.length];
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));

async function api(method, path, body) {
  const opts = { method, headers: { "X-CSRF-Token": CSRF }, credentials: "same-origin" };
  if (body instanceof FormData) opts.body = body;
  else if (body !== undefined) { opts.body = JSON.stringify(body); opts.headers["Content-Type"] = "application/json"; }
  const r = await fetch(path, opts);
  if (r.status === 401) { location.href = "/admin/login"; throw new Error("signed out"); }
  if (r.status === 204) return null;
  const data = await r.json();
  if (!r.ok) { status(data.error ? data.error.message : r.statusText, true); throw new Error(r.statusText); }
  return data;
}
function status(text, error = false) { const s = $("status"); s.textContent = text; s.className = error ? "error" : "muted"; }

async function waitJob(id, bar, label) {
  bar.hidden = false;
  for (;;) {
    const job = await api("GET", `/jobs/${id}`);
    bar.value = job.total ? (100 * job.done) / job.total : 0;
    label.textContent = `job ${id}: ${job.status} ${job.done}/${job.total}`;
    if (job.status === "done" || job.status === "failed") { bar.hidden = true; return job; }
    await new Promise((r) => setTimeout(r, 400));
  }
}

// ---- SVG plots -------------------------------------------------------------------------------------
function svg(w, h, inner) { return `<svg width="${w}" height="${h}" viewBox="0 0 ${w} ${h}" role="img">${inner}</svg>`; }
function scale(values, lo, hi) {
  const min = Math.min(...values), max = Math.max(...values), span = max - min || 1;
  return (v) => lo + ((v - min) / span) * (hi - lo);
}
function scatter(points, w = 420, h = 340) {
  if (!points.length) return '<p class="muted">no clusters yet</p>';
  const sx = scale(points.map((p) => p.x), 20, w - 20), sy = scale(points.map((p) => p.y), h - 20, 20);
  const maxSize = Math.max(...points.map((p) => p.size), 1);
  const dots = points.map((p) => `<circle class="cluster-dot" data-id="${p.id}" cx="${sx(p.x).toFixed(1)}" cy="${sy(p.y).toFixed(1)}"
    r="${(3 + 9 * Math.sqrt(p.size / maxSize)).toFixed(1)}" fill="${colorOf(p.expert_id)}" fill-opacity=".75"><title>cluster ${p.id} (${p.size})</title></circle>`);
  return svg(w, h, dots.join(""));
}
function lineChart(series, { w = 420, h = 280, xLabel = "", yLabel = "", vline = null, diagonal = false } = {}) {
  const pad = 36, X = (v) => pad + v * (w - pad - 10), Y = (v) => h - pad - v * (h - pad - 10);
  let inner = `<line x1="${pad}" y1="${h - pad}" x2="${w - 10}" y2="${h - pad}" stroke="#98a2b3"/><line x1="${pad}" y1="10" x2="${pad}" y2="${h - pad}" stroke="#98a2b3"/>`;
  inner += `<text x="${w / 2}" y="${h - 6}" font-size="11" text-anchor="middle">${xLabel}</text><text x="10" y="${h / 2}" font-size="11" transform="rotate(-90 10 ${h / 2})" text-anchor="middle">${yLabel}</text>`;
  for (const t of [0, 0.5, 1]) inner += `<text x="${X(t)}" y="${h - pad + 14}" font-size="10" text-anchor="middle">${t}</text><text x="${pad - 4}" y="${Y(t) + 3}" font-size="10" text-anchor="end">${t}</text>`;
  if (diagonal) inner += `<line x1="${X(0)}" y1="${Y(0)}" x2="${X(1)}" y2="${Y(1)}" stroke="#d0d5dd" stroke-dasharray="4 3"/>`;
  if (vline != null) inner += `<line class="threshold" x1="${X(vline)}" y1="10" x2="${X(vline)}" y2="${h - pad}" stroke="#b42318" stroke-dasharray="5 3"/><text x="${X(vline) + 4}" y="20" font-size="10" fill="#b42318">threshold ${vline}</text>`;
  series.forEach((s, i) => {
    const pts = s.points.map(([x, y]) => `${X(x).toFixed(1)},${Y(y).toFixed(1)}`).join(" ");
    inner += `<polyline fill="none" stroke="${PALETTE[i]}" stroke-width="2" points="${pts}"/>`;
    s.points.forEach(([x, y]) => { inner += `<circle cx="${X(x).toFixed(1)}" cy="${Y(y).toFixed(1)}" r="2.5" fill="${PALETTE[i]}"/>`; });
    inner += `<text x="${w - 12}" y="${24 + 14 * i}" font-size="11" text-anchor="end" fill="${PALETTE[i]}">${esc(s.name)}</text>`;
  });
  return svg(w, h, inner);
}
function bars(items, { w = 520, h = 220, stacked = null } = {}) {
  if (!items.length) return '<p class="muted">no questions yet</p>';
  const pad = 30, bw = (w - pad - 10) / items.length;
  const max = Math.max(...items.map((it) => stacked ? stacked.reduce((a, k) => a + it[k], 0) : it.value), 1);
  let inner = "";
  items.forEach((it, i) => {
    let y = h - pad;
    const parts = stacked ? stacked.map((k, j) => [it[k], PALETTE[j]]) : [[it.value, PALETTE[0]]];
    for (const [v, c] of parts) {
      const bh = (v / max) * (h - pad - 10);
      inner += `<rect x="${(pad + i * bw + 1).toFixed(1)}" y="${(y - bh).toFixed(1)}" width="${Math.max(bw - 2, 1).toFixed(1)}" height="${bh.toFixed(1)}" fill="${c}"><title>${esc(it.label)}: ${v}</title></rect>`;
      y -= bh;
    }
    if (!stacked) inner += `<text x="${(pad + i * bw + bw / 2).toFixed(1)}" y="${h - pad + 14}" font-size="10" text-anchor="middle">${esc(it.label)}</text>`;
  });
  if (stacked) stacked.forEach((k, j) => { inner += `<text x="${w - 12}" y="${16 + 14 * j}" font-size="11" text-anchor="end" fill="${PALETTE[j]}">${k}</text>`; });
  return svg(w, h, inner);
}

// ---- pages -----------------------------------------------------------------------------------------
async function loadExperts() { state.experts = await api("GET", "/admin/api/experts"); return state.experts; }
const expertName = (id) => (state.experts.find((e) => e.id === id) || {}).name || "—";
const expertOptions = (selected, withNone = true) =>
  (withNone ? `<option value="">— none —</option>` : "") +
  state.experts.map((e) => `<option value="${e.id}" ${e.id === selected ? "selected" : ""}>${esc(e.name)}</option>`).join("");

const pages = {
  async overview() {
    const ov = await api("GET", "/admin/api/overview");
    const s = ov.stats;
    $("ov-cards").innerHTML = [["documents", s.documents], ["chunks", s.chunks], ["clusters", s.clusters],
      ["experts", state.experts.length], ["questions", ov.questions], ["kernels", ov.kernels]]
      .map(([k, v]) => `<div class="card"><span class="muted">${k}</span><b id="ov-${k}">${v}</b></div>`).join("");
    const m = ov.router && ov.router.metrics;
    $("ov-router").innerHTML = ov.router ? `version <b>${ov.router.id}</b> — accuracy ${m.accuracy?.toFixed(3)}, ECE ${m.ece_before?.toFixed(3)} → ${m.ece_after?.toFixed(3)},
      coverage at ${m.threshold} ${(100 * m.coverage_at_threshold).toFixed(1)}% (accuracy ${(100 * m.accuracy_at_threshold).toFixed(1)}%)` : '<span class="muted">no router trained yet</span>';
    $("ov-share").innerHTML = bars(ov.share.map((b) => ({ label: new Date(b.start * 1000).toLocaleTimeString(), expert: b.expert, fallback: b.fallback })), { stacked: ["expert", "fallback"] });
    $("ov-load").innerHTML = bars(ov.load.map((l) => ({ label: l.expert, value: l.hits })));
  },
  async clusters() {
    const [clusters, map] = await Promise.all([api("GET", "/admin/api/clusters"), api("GET", "/admin/api/clusters-map")]);
    state.clusters = clusters;
    const outside = clusters.reduce((n, c) => n + c.outside, 0), total = clusters.reduce((n, c) => n + c.size, 0);
    $("cl-leak").textContent = `Scope leakage: ${outside} chunks (${(100 * outside / Math.max(total, 1)).toFixed(2)}%) sit outside the expert that holds most of their document` +
      (outside ? " — remapping re-places them (a realign job)." : ".");
    $("cl-map").innerHTML = scatter(map);
    document.querySelectorAll(".cluster-dot").forEach((d) => d.addEventListener("click", () => showCluster(+d.dataset.id)));
    $("cl-target").innerHTML = expertOptions(null);
    const filter = $("cl-filter");
    const current = filter.value;
    filter.innerHTML = `<option value="all">all</option><option value="none">unmapped</option>` +
      state.experts.map((e) => `<option value="${e.id}">${esc(e.name)}</option>`).join("");
    filter.value = [...filter.options].some((o) => o.value === current) ? current : "all";
    renderClusters();
  },
  async experts() {
    const rows = state.experts.map((e) => `<tr data-id="${e.id}">
      <td>${e.id}</td><td><input data-f="name" value="${esc(e.name)}"></td><td><input data-f="description" value="${esc(e.description)}"></td>
      <td><input data-f="system_prompt" value="${esc(e.system_prompt)}"></td><td><input data-f="generator" value="${esc(e.generator)}"></td>
      <td><input data-f="top_k" type="number" min="1" max="50" value="${e.top_k}"></td>
      <td><input data-f="threshold" type="number" step="0.01" min="0" max="1" value="${e.threshold ?? ""}"></td>
      <td>${e.clusters.length}</td><td><button class="ex-save">Save</button> <button class="ex-delete">Delete</button></td></tr>`);
    $("ex-rows").innerHTML = rows.join("") || '<tr><td colspan="9" class="muted">no experts yet</td></tr>';
    document.querySelectorAll(".ex-save").forEach((b) => b.addEventListener("click", async () => {
      const tr = b.closest("tr"), body = {};
      tr.querySelectorAll("input").forEach((i) => { body[i.dataset.f] = i.type === "number" ? (i.value === "" ? null : +i.value) : i.value; });
      await api("PATCH", `/admin/api/experts/${tr.dataset.id}`, body); status("saved"); await refresh("experts");
    }));
    document.querySelectorAll(".ex-delete").forEach((b) => b.addEventListener("click", async () => {
      if (!confirm("Delete this expert? Its clusters become unmapped.")) return;
      await api("DELETE", `/admin/api/experts/${b.closest("tr").dataset.id}`); status("deleted"); await refresh("experts");
    }));
  },
  async router() {
    const versions = await api("GET", "/admin/api/router/versions");
    $("rt-rows").innerHTML = versions.map((v) => {
      const m = v.metrics;
      return `<tr data-id="${v.id}"><td>${v.id}${v.active ? " <b>(active)</b>" : ""}</td><td>${new Date(v.created_at).toLocaleString()}</td>
        <td>${m.accuracy?.toFixed(3)}</td><td>${m.ece_before?.toFixed(3)} → ${m.ece_after?.toFixed(3)}</td>
        <td>${(100 * m.coverage_at_threshold).toFixed(1)}%</td><td>${(100 * m.accuracy_at_threshold).toFixed(1)}%</td>
        <td>${v.active ? "" : `<button class="rt-activate" id="activate-${v.id}">Activate</button>`}</td></tr>`;
    }).join("") || '<tr><td colspan="7" class="muted">no versions yet</td></tr>';
    document.querySelectorAll(".rt-activate").forEach((b) => b.addEventListener("click", async () => {
      await api("POST", `/admin/api/router/versions/${b.closest("tr").dataset.id}/activate`); status("activated"); await refresh("router");
    }));
    const active = versions.find((v) => v.active);
    if (active) {
      const rel = active.metrics.reliability.filter((b) => b.count);
      $("rt-reliability").innerHTML = lineChart([{ name: "held-out samples", points: rel.map((b) => [b.confidence, b.accuracy]) }],
        { xLabel: "confidence", yLabel: "accuracy", diagonal: true });
      const cov = active.metrics.coverage_curve;
      $("rt-coverage").innerHTML = lineChart([{ name: "coverage", points: cov.map((c) => [c.threshold, c.coverage]) },
        { name: "accuracy", points: cov.filter((c) => c.coverage > 0).map((c) => [c.threshold, c.accuracy]) }],
        { xLabel: "threshold", yLabel: "share", vline: active.metrics.threshold });
    } else { $("rt-reliability").innerHTML = $("rt-coverage").innerHTML = '<p class="muted">train a router first</p>'; }
  },
  async questions() {
    const qs = await api("GET", "/admin/api/questions?limit=100");
    $("q-rows").innerHTML = qs.map((q) => `<tr data-id="${q.id}"><td>${new Date(q.created_at).toLocaleTimeString()}</td><td>${esc(q.question)}</td>
      <td class="path-${q.path}">${q.path}${q.expert_id ? " · " + esc(expertName(q.expert_id)) : ""}</td><td>${esc(q.reason)}</td>
      <td>${q.confidence == null ? "—" : q.confidence.toFixed(2)}</td><td>${(q.timings.total ?? 0).toFixed(0)}</td>
      <td><select class="q-label">${expertOptions(q.feedback_expert_id)}</select></td></tr>`).join("") || '<tr><td colspan="7" class="muted">no questions yet</td></tr>';
    document.querySelectorAll(".q-label").forEach((s) => s.addEventListener("change", async () => {
      if (!s.value) return;
      await api("POST", `/admin/api/questions/${s.closest("tr").dataset.id}/label`, { expert_id: +s.value });
      status("labelled: the question is now router training data");
    }));
  },
  async documents() {
    const page = await api("GET", `/documents?offset=${state.docPage * PAGE}&limit=${PAGE}`);
    $("doc-page").textContent = `${page.total ? page.offset + 1 : 0}–${page.offset + page.items.length} of ${page.total}`;
    $("doc-rows").innerHTML = page.items.map((d) => `<tr data-id="${d.id}"><td>${d.id}</td><td>${esc(d.source)}</td><td>${esc(d.title)}</td>
      <td>${esc(d.mime)}</td><td>${d.chunks}</td><td><button class="doc-delete">Delete</button></td></tr>`).join("");
    document.querySelectorAll(".doc-delete").forEach((b) => b.addEventListener("click", async () => {
      if (!confirm("Delete this document and its chunks?")) return;
      await api("DELETE", `/documents/${b.closest("tr").dataset.id}`); status("deleted"); await refresh("documents");
    }));
  },
};

function renderClusters() {
  const f = $("cl-filter").value;
  const rows = state.clusters.filter((c) => f === "all" || (f === "none" ? c.expert_id == null : c.expert_id === +f));
  const pages = Math.max(1, Math.ceil(rows.length / PAGE));
  state.clusterPage = Math.min(state.clusterPage, pages - 1);
  $("cl-page").textContent = `page ${state.clusterPage + 1} / ${pages} (${rows.length} clusters)`;
  $("cl-rows").innerHTML = rows.slice(state.clusterPage * PAGE, (state.clusterPage + 1) * PAGE).map((c) => `<tr data-id="${c.id}">
    <td><input type="checkbox" class="cl-check" value="${c.id}"></td><td><a href="#" class="cl-open">${c.id}</a></td><td>${c.size}</td><td>${c.outside || ""}</td>
    <td>${c.keywords.map((k) => `<span class="pill">${esc(k)}</span>`).join("")}</td>
    <td><select class="cl-expert" style="border-left: 6px solid ${colorOf(c.expert_id)}">${expertOptions(c.expert_id)}</select></td></tr>`).join("");
  document.querySelectorAll(".cl-expert").forEach((s) => s.addEventListener("change", async () => {
    await api("PUT", `/admin/api/clusters/${s.closest("tr").dataset.id}`, { expert_id: s.value ? +s.value : null });
    status("cluster mapped"); await refresh("clusters");
  }));
  document.querySelectorAll(".cl-open").forEach((a) => a.addEventListener("click", (e) => { e.preventDefault(); showCluster(+a.closest("tr").dataset.id); }));
}
async function showCluster(id) {
  const c = await api("GET", `/admin/api/clusters/${id}?samples=3`);
  $("cl-detail").innerHTML = `<h2>Cluster ${c.id} — ${c.size} chunks — ${esc(expertName(c.expert_id))}</h2>` +
    c.samples.map((s) => `<p><b>${esc(s.source)}</b>: ${esc(s.text.slice(0, 300))}…</p>`).join("");
}

async function refresh(tab) {
  await loadExperts();
  await pages[tab]();
  await checkStaleness();
}

// The active router keeps the mapping it was trained on: say so when the mapping has moved on.
async function checkStaleness() {
  const st = await api("GET", "/admin/api/router/staleness");
  $("stale-banner").hidden = !st.stale;
  if (st.stale) {
    const shown = st.changed_clusters.slice(0, 12).join(", ") + (st.changed_clusters.length > 12 ? ", …" : "");
    $("stale-text").textContent = `Router version ${st.router_version} routes by an older mapping: ${st.reason} (clusters: ${shown}).`;
  }
}
function show(tab) {
  document.querySelectorAll(".page").forEach((p) => { p.hidden = p.id !== tab; });
  document.querySelectorAll(".tab").forEach((t) => t.classList.toggle("active", t.dataset.tab === tab));
  history.replaceState(null, "", `#${tab}`);
  refresh(tab).catch((e) => console.error(e));
}

// ---- actions ---------------------------------------------------------------------------------------
document.querySelectorAll(".tab").forEach((t) => t.addEventListener("click", () => show(t.dataset.tab)));
$("cl-filter").addEventListener("change", () => { state.clusterPage = 0; renderClusters(); });
$("cl-prev").addEventListener("click", () => { state.clusterPage = Math.max(0, state.clusterPage - 1); renderClusters(); });
$("cl-next").addEventListener("click", () => { state.clusterPage += 1; renderClusters(); });
$("cl-all").addEventListener("change", (e) => document.querySelectorAll(".cl-check").forEach((c) => { c.checked = e.target.checked; }));
$("cl-assign").addEventListener("click", async () => {
  const ids = [...document.querySelectorAll(".cl-check:checked")].map((c) => +c.value);
  if (!ids.length) return status("select clusters first", true);
  const target = $("cl-target").value;
  const r = await api("POST", "/admin/api/clusters/assign", { cluster_ids: ids, expert_id: target ? +target : null });
  status(`${r.assigned} clusters assigned`); await refresh("clusters");
});
$("pr-run").addEventListener("click", async () => {
  const r = await api("POST", "/admin/api/experts/propose", { n: +$("pr-n").value, apply: false });
  state.proposal = r.proposals;
  $("pr-list").innerHTML = r.proposals.map((p) => `<li><b>${esc(p.name)}</b>: ${p.cluster_ids.length} clusters</li>`).join("");
  $("pr-accept").disabled = !r.proposals.length;
});
$("pr-accept").addEventListener("click", async () => {
  const r = await api("POST", "/admin/api/experts/propose", { n: +$("pr-n").value, apply: true });
  status(`${r.proposals.length} experts created`); $("pr-accept").disabled = true; await refresh("clusters");
});
$("ex-new").addEventListener("submit", async (e) => {
  e.preventDefault();
  const body = {};
  new FormData(e.target).forEach((v, k) => { body[k] = v; });
  body.top_k = +body.top_k; body.threshold = body.threshold === "" ? null : +body.threshold;
  await api("POST", "/admin/api/experts", body); e.target.reset(); status("expert created"); await refresh("experts");
});
$("stale-retrain").addEventListener("click", () => { show("router"); $("rt-train").click(); });
$("rt-train").addEventListener("click", async () => {
  status("training the router…");
  const job = await api("POST", "/admin/api/router/train", {});
  const done = await waitJob(job.id, $("rt-progress"), $("rt-job"));
  if (done.status !== "done") status(`training failed: ${done.error}`, true);
  else if (done.result.held_back) status(`router version ${done.result.version} trained but not activated: ${done.result.held_back.reason}`, true);
  else status(`router version ${done.result.version} trained`);
  await refresh("router");
});
$("try-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const r = await api("POST", "/admin/api/router/try", { question: $("try-q").value });
  const rt = r.route;
  $("try-out").innerHTML = `<p id="try-path" class="path-${rt.path}">${rt.path}${rt.expert ? " → " + esc(rt.expert.name) : ""} (${esc(rt.detail)})</p>` +
    bars(rt.top.map((t) => ({ label: t.expert ? t.expert.name : "none", value: +t.p.toFixed(3) })), { w: 360, h: 180 });
});
$("doc-upload").addEventListener("submit", async (e) => {
  e.preventDefault();
  const form = new FormData();
  [...$("doc-files").files].forEach((f) => form.append("files", f, f.name));
  const job = await api("POST", "/documents/bulk", form);
  const done = await waitJob(job.id, $("doc-progress"), $("doc-job"));
  status(done.status === "done" ? `ingested: ${done.result.created} new, ${done.result.duplicate} already there, ${done.result.failed} failed` : done.error, done.status !== "done");
  await refresh("documents");
});
$("doc-prev").addEventListener("click", () => { state.docPage = Math.max(0, state.docPage - 1); refresh("documents"); });
$("doc-next").addEventListener("click", () => { state.docPage += 1; refresh("documents"); });

show((location.hash || "#overview").slice(1) in pages ? location.hash.slice(1) || "overview" : "overview");
