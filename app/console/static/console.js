// moerag admin console: one page per tab, each drawn from the admin JSON API (see api.js).
import { $, all, api, esc, status, waitJob } from "./api.js";
import { bars, colorOf, lineChart, scatter } from "./plots.js";
import { ask, newConversation, openChunk, routeProbabilities } from "./viewer.js";

const state = { experts: [], clusters: [], clusterPage: 0, docPage: 0, docQuery: "", proposal: null };
const PAGE = 50;

async function loadExperts() { state.experts = await all("/admin/api/experts"); return state.experts; }
const expertName = (id) => id == null ? "unmapped" : (state.experts.find((e) => e.id === id) || {}).name || `expert ${id}`;
const expertOptions = (selected, withNone = true) =>
  (withNone ? `<option value="">— none —</option>` : "") +
  state.experts.map((e) => `<option value="${e.id}" ${e.id === selected ? "selected" : ""}>${esc(e.name)}</option>`).join("");
const plural = (n, one, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;
const pct = (v) => v == null ? "—" : `${(100 * v).toFixed(1)}%`;
const signed = (v, scale = 100, unit = " pts") => `${v >= 0 ? "+" : "−"}${Math.abs(v * scale).toFixed(1)}${unit}`;

const pages = {
  async overview() {
    const ov = await api("GET", "/admin/api/overview");
    const s = ov.stats;
    $("ov-cards").innerHTML = [["documents", s.documents], ["chunks", s.chunks], ["clusters", s.clusters],
      ["experts", state.experts.length], ["questions", ov.questions], ["kernels", ov.kernels]]
      .map(([k, v]) => `<div class="card"><span class="muted">${k}</span><b id="ov-${k}">${v}</b></div>`).join("");
    const m = ov.router && ov.router.metrics, mapped = state.experts.filter((e) => e.clusters.length).length;
    const next = !s.documents ? "Next step: upload your documents (Documents, or POST /documents/bulk)."
      : !mapped ? "Next step: Clusters › Create experts from my documents — one expert per topic of your documents."
      : mapped < 2 ? "One expert owns lists: there is no gate to route between, so every question searches the whole store. Re-fit when you have more topics." : "";
    $("ov-next").hidden = !next; $("ov-next").textContent = next;
    if (mapped < 2) $("ov-router").innerHTML = '<span class="muted">no gate: fewer than two experts own lists (no accuracy or confidence to show)</span>';
    else $("ov-router").innerHTML = ov.router ? `version <b>${ov.router.id}</b> — accuracy ${m.accuracy?.toFixed(3)}, ECE ${m.ece_before?.toFixed(3)} → ${m.ece_after?.toFixed(3)},
      coverage at ${m.threshold} ${pct(m.coverage_at_threshold)} (accuracy ${pct(m.accuracy_at_threshold)})` : '<span class="muted">no router trained yet</span>';
    const span = ov.share.length > 1 ? ov.share[1].start - ov.share[0].start : 0;
    const when = (t) => new Date(t * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", ...(span < 120 ? { second: "2-digit" } : {}) });
    const width = span < 120 ? `${Math.max(1, Math.round(span))} s` : span < 7200 ? `${Math.round(span / 60)} min` : `${(span / 3600).toFixed(1)} h`;
    $("ov-share").innerHTML = bars(ov.share.map((b) => ({ label: when(b.start), expert: b.expert, fallback: b.fallback })),
      { stacked: ["expert", "fallback"], xLabel: `time (local), one bar per ${width}`, yLabel: "questions", empty: "no questions yet", counts: true });
    $("ov-load").innerHTML = bars(ov.load.map((l) => ({ label: l.expert, value: l.hits })),
      { xLabel: "expert", yLabel: "questions answered", empty: "no questions on the expert path yet", counts: true });
  },
  async ask() {
    $("pg-expert").innerHTML = expertOptions(null, false);
  },
  async clusters() {
    const [clusters, map] = await Promise.all([all("/admin/api/clusters"), api("GET", "/admin/api/clusters-map")]);
    state.clusters = clusters;
    const outside = clusters.reduce((n, c) => n + c.outside, 0), total = clusters.reduce((n, c) => n + c.size, 0);
    $("cl-leak").textContent = `Scope leakage: ${outside} chunks (${(100 * outside / Math.max(total, 1)).toFixed(2)}%) sit outside the expert that holds most of their document` +
      (outside ? " — remapping re-places them (a realign job)." : ".");
    $("cl-map").innerHTML = scatter(map, expertName);
    document.querySelectorAll(".cluster-dot").forEach((d) => d.addEventListener("click", () => showCluster(+d.dataset.id)));
    $("cl-target").innerHTML = expertOptions(null);
    const filter = $("cl-filter"), current = filter.value;
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
      <td title="${e.documents ? esc(`defined by documents: ${JSON.stringify(e.documents)}`) : "defined by its clusters"}">${e.clusters.length}${e.documents ? " (by documents)" : ""}</td>
      <td class="ex-owned">${e.owned ? "team's" : '<span class="muted">automatic</span>'}</td><td><button class="ex-save">Save</button> <button class="ex-delete danger">Delete</button></td></tr>`);
    $("ex-rows").innerHTML = rows.join("") || '<tr><td colspan="10" class="muted">no experts yet: upload documents, then Clusters › Create experts from my documents</td></tr>';
    const past = (await api("GET", "/admin/api/experts/history?limit=20")).items;
    $("ex-history").innerHTML = past.map((v) => `<tr><td>${v.id}</td><td>${new Date(v.created_at).toLocaleString()}</td><td>${esc(v.summary)}</td>
      <td class="small">${esc(v.experts.join(", ")) || '<span class="muted">none</span>'}</td></tr>`).join("") || '<tr><td colspan="4" class="muted">no change to undo</td></tr>';
    $("ex-undo").disabled = !past.length;
    $("ex-undo").title = past.length ? `undo: ${past[0].summary}` : "nothing to undo";
    const chosen = $("ex-def-expert").value;
    $("ex-def-expert").innerHTML = expertOptions(chosen ? +chosen : null, false);
    document.querySelectorAll(".ex-save").forEach((b) => b.addEventListener("click", async () => {
      const tr = b.closest("tr"), body = {};
      tr.querySelectorAll("input").forEach((i) => { body[i.dataset.f] = i.type === "number" ? (i.value === "" ? null : +i.value) : i.value; });
      await api("PATCH", `/admin/api/experts/${tr.dataset.id}`, body); status("saved"); await refresh("experts");
    }));
    document.querySelectorAll(".ex-delete").forEach((b) => b.addEventListener("click", async () => {
      const e = state.experts.find((x) => x.id === +b.closest("tr").dataset.id);
      if (!confirm(`Delete expert "${e.name}"${e.owned ? " (owned by the team)" : ""}? It is deleted; its ${plural(e.clusters.length, "cluster")} become unmapped, so the fallback answers its documents' questions until they are mapped or a re-fit places them. Undo brings it back.`)) return;
      const r = await api("DELETE", `/admin/api/experts/${e.id}`);
      status(`deleted “${r.deleted.name}”: ${plural(r.documents, "document")} go to ${r.documents_go_to}`); await refresh("experts");
    }));
  },
  async router() {
    const versions = await all("/admin/api/router/versions");
    const gate = state.experts.filter((e) => e.clusters.length).length >= 2;
    const active = gate ? versions.find((v) => v.active) : null;  // one expert: no gate, no figures claimed
    $("rt-rows").innerHTML = versions.map((v) => {
      const m = v.metrics, held = m.held_back;
      const note = v.active ? " <b>(active)</b>" : held ? ` <span class="badge warn" title="${esc(held.reason)}">held back</span>` : "";
      return `<tr data-id="${v.id}"><td>${v.id}${note}</td><td>${new Date(v.created_at).toLocaleString()}</td>
        ${gate ? `<td>${m.accuracy?.toFixed(3)}</td><td>${m.ece_before?.toFixed(3)} → ${m.ece_after?.toFixed(3)}</td>
        <td>${pct(m.coverage_at_threshold)}</td><td>${pct(m.accuracy_at_threshold)}</td>` : '<td colspan="4" class="muted">no gate: fewer than two experts own lists</td>'}
        <td>${v.active ? "" : `<button class="rt-activate" id="activate-${v.id}">Activate</button>`}</td></tr>`;
    }).join("") || '<tr><td colspan="7" class="muted">no versions yet</td></tr>';
    document.querySelectorAll(".rt-activate").forEach((b) => b.addEventListener("click", () => activate(+b.closest("tr").dataset.id, versions)));
    if (active) {
      const rel = active.metrics.reliability.filter((b) => b.count);
      $("rt-reliability").innerHTML = lineChart([{ name: "held-out documents", points: rel.map((b) => [b.confidence, b.accuracy]) }],
        { xLabel: "confidence (calibrated)", yLabel: "accuracy", diagonal: true });
      const cov = active.metrics.coverage_curve;
      $("rt-coverage").innerHTML = lineChart([{ name: "share on the expert path", points: cov.map((c) => [c.threshold, c.coverage]) },
        { name: "accuracy there", points: cov.filter((c) => c.coverage > 0).map((c) => [c.threshold, c.accuracy]) }],
        { xLabel: "confidence threshold", yLabel: "share of questions", vline: active.metrics.threshold });
    } else {
      $("rt-reliability").innerHTML = $("rt-coverage").innerHTML = gate ? '<p class="muted">train a router first</p>'
        : '<p class="muted">fewer than two experts own lists: there is no gate to train, and every question searches the whole store</p>';
    }
  },
  async questions() {
    const qs = (await api("GET", "/admin/api/questions?limit=100")).items;
    $("q-rows").innerHTML = qs.map((q) => `<tr data-id="${q.id}"><td>${new Date(q.created_at).toLocaleTimeString()}</td><td>${esc(q.question)}</td>
      <td class="path-${q.path}">${q.path}${q.expert_id ? " · " + esc(expertName(q.expert_id)) : ""}</td><td>${esc(q.reason)}</td>
      <td>${q.confidence == null ? "—" : q.confidence.toFixed(2)}</td><td>${(q.timings.total ?? 0).toFixed(0)}</td>
      <td><select class="q-label"><option value="">—</option><option value="new" ${q.feedback_new_topic ? "selected" : ""}>none of these / new topic</option>${expertOptions(q.feedback_expert_id, false)}</select></td></tr>`).join("") || '<tr><td colspan="7" class="muted">no questions yet</td></tr>';
    document.querySelectorAll(".q-label").forEach((s) => s.addEventListener("change", async () => {
      if (!s.value) return;
      await api("POST", `/admin/api/questions/${s.closest("tr").dataset.id}/label`, { expert_id: s.value === "new" ? null : +s.value });
      status(s.value === "new" ? "labelled as a new topic: the router learns that no expert fits it" : "labelled: the question is now router training data");
    }));
  },
  async shards() {
    const sh = await api("GET", "/admin/api/shards");
    $("sh-map").textContent = sh.shard_map ? `Shard map ${sh.shard_map}: each shard holds only its experts' lists (Ray Serve).`
      : "This server searches its own full replica of the index: no shard map is set (MOERAG_SHARD_MAP, see the README's Scaling out).";
    const num = (v) => v == null ? "—" : v.toLocaleString();
    // running now (Serve's count) of the map's; an autoscaled shard shows its bounds
    const replicas = (r) => `${num(r.running_replicas)} of ${r.autoscaling ? r.autoscaling.join("–") : r.replicas}`;
    $("sh-rows").innerHTML = sh.shards.map((r) => `<tr><td>${esc(r.shard)}</td><td>${esc(r.experts.join(", "))}</td><td>${replicas(r)}</td>
      <td>${num(r.lists)}</td><td>${num(r.vectors)}</td><td>${num(r.position)}</td><td>${num(r.searches)}</td><td>${num(r.reasked)}</td>
      <td>${r.reachable ? "answering" : '<span class="danger">not answering</span>'}</td></tr>`).join("") ||
      `<tr><td colspan="8" class="muted">no shards</td></tr>`;
  },
  async tokens() {
    $("tk-experts").innerHTML = state.experts.map((e) => `<option value="${e.id}">${esc(e.name)}</option>`).join("");
    const tokens = await api("GET", "/admin/api/tokens");
    const scopeText = (s) => !s ? "whole store" : [
      ...s.experts.map((id) => `expert “${expertName(id)}”`), ...s.tags.map((t) => `tag ${t}`), ...s.source_prefixes.map((p) => `source ${p}…`)].join(", ");
    const when = (t) => t ? new Date(t).toLocaleString() : "never";
    const stateOf = (t) => t.revoked ? "revoked" : t.expires_at && new Date(t.expires_at) <= new Date() ? "expired" : "active";
    $("tk-rows").innerHTML = tokens.map((t) => `<tr data-id="${t.id}"><td>${t.id}</td><td>${esc(t.name)}</td><td>${t.role}</td><td>${esc(scopeText(t.scope))}</td>
      <td>${when(t.created_at)}</td><td>${when(t.expires_at)}</td><td>${stateOf(t)}</td>
      <td>${stateOf(t) === "active" ? '<button class="tk-revoke danger">Revoke</button>' : ""}</td></tr>`).join("") ||
      '<tr><td colspan="8" class="muted">no tokens: the admin token and MOERAG_READ_TOKEN (if set) are the only ones</td></tr>';
    document.querySelectorAll(".tk-revoke").forEach((b) => b.addEventListener("click", async () => {
      const tr = b.closest("tr");
      if (!confirm(`Revoke token “${tr.children[1].textContent}”? Every request with it is refused from the next one on; this cannot be undone (create a new token instead).`)) return;
      await api("DELETE", `/admin/api/tokens/${tr.dataset.id}`); status("token revoked"); await refresh("tokens");
    }));
  },
  async documents() {
    const q = state.docQuery ? `&q=${encodeURIComponent(state.docQuery)}` : "";
    const page = await api("GET", `/documents?offset=${state.docPage * PAGE}&limit=${PAGE}${q}`);
    $("doc-page").textContent = `${page.total ? page.offset + 1 : 0}–${page.offset + page.items.length} of ${page.total}` + (state.docQuery ? ` matching “${state.docQuery}”` : "");
    $("doc-rows").innerHTML = page.items.map((d) => `<tr data-id="${d.id}"><td>${d.id}</td><td>${esc(d.source)}</td><td>${esc(d.title)}</td>
      <td>${esc(d.mime)}</td><td>${d.chunks}</td><td><button class="doc-chunks">Chunks</button> <button class="doc-delete danger">Delete</button></td></tr>`).join("") ||
      `<tr><td colspan="6" class="muted">${state.docQuery ? "no document matches" : "no documents yet"}</td></tr>`;
    document.querySelectorAll(".doc-delete").forEach((b) => b.addEventListener("click", async () => {
      const tr = b.closest("tr");
      if (!confirm(`Delete document ${tr.dataset.id} (${tr.children[1].textContent}) and its ${tr.children[4].textContent} chunks?`)) return;
      await api("DELETE", `/documents/${tr.dataset.id}`); status("deleted"); await refresh("documents");
    }));
    document.querySelectorAll(".doc-chunks").forEach((b) => b.addEventListener("click", async () => {
      const doc = await api("GET", `/documents/${b.closest("tr").dataset.id}`);
      if (doc.chunk_list.length) await openChunk(doc.chunk_list[0].id, state);
      else status("this document has no chunks", true);
    }));
  },
};

async function activate(id, versions) {
  const v = versions.find((x) => x.id === id), active = versions.find((x) => x.active);
  const held = v.metrics.held_back;
  let question = `Activate router version ${id}? Every worker routes with it at once.`;
  if (held) question = `Version ${id} was held back: ${held.reason}.\n\nActivate it anyway?`;
  else if (active && v.metrics.accuracy < active.metrics.accuracy) {
    question += `\n\nIt is less accurate than the active version ${active.id} (${signed(v.metrics.accuracy - active.metrics.accuracy)}).`;
  }
  if (!confirm(question)) { status(`version ${id} not activated`); return; }
  await api("POST", `/admin/api/router/versions/${id}/activate`); status(`router version ${id} activated`); await refresh("router");
}

function renderClusters() {
  const f = $("cl-filter").value;
  const rows = state.clusters.filter((c) => f === "all" || (f === "none" ? c.expert_id == null : c.expert_id === +f));
  const count = Math.max(1, Math.ceil(rows.length / PAGE));
  state.clusterPage = Math.min(state.clusterPage, count - 1);
  $("cl-page").textContent = `page ${state.clusterPage + 1} / ${count} (${rows.length} clusters)`;
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
  const c = await api("GET", `/admin/api/clusters/${id}?samples=5`);
  $("cl-detail").innerHTML = `<h2>Cluster ${c.id} — ${c.size} chunks — ${esc(expertName(c.expert_id))}</h2>` +
    c.samples.map((s) => `<p><b>${esc(s.source)}</b>: ${esc(s.text.slice(0, 300))}… <button class="open-chunk link" data-chunk="${s.chunk_id}">open</button></p>`).join("");
  $("cl-detail").querySelectorAll(".open-chunk").forEach((b) => b.addEventListener("click", () => openChunk(+b.dataset.chunk, state)));
  $("cl-detail").scrollIntoView({ behavior: "smooth", block: "start" });
}

function showProposal(r) {
  state.proposal = r;
  const d = r.diff, moves = d.moved.length;
  $("pr-diff").innerHTML = `<p id="pr-summary">${plural(r.proposals.length, "new expert")} over ${plural(r.proposals.reduce((n, p) => n + p.cluster_ids.length, 0), "cluster")};
    ${d.keep_mapped ? `keeps the ${plural(d.kept_clusters, "cluster")} experts already own.` : `${plural(moves, "cluster")} taken from existing experts` +
      (d.emptied_experts.length ? `; ${d.emptied_experts.map((e) => `“${esc(e.name)}”`).join(", ")} would be left empty and deleted.` : ".")}
    ${d.owned_kept && d.owned_kept.length ? ` Owned experts keep their clusters: ${d.owned_kept.map((e) => `“${esc(e.name)}”`).join(", ")}.` : ""}</p>` +
    (r.note ? `<p id="pr-note" class="muted">${esc(r.note)}</p>` : "");
  $("pr-rows").innerHTML = r.proposals.map((p, i) => `<tr><td><input class="pr-name" data-i="${i}" value="${esc(p.name)}" aria-label="name of proposed expert ${i + 1}"></td>
    <td>${p.cluster_ids.length} <span class="muted small">(${p.chunks} chunks)</span></td>
    <td class="small">${p.titles.slice(0, 3).map(esc).join("<br>")}</td>
    <td class="small">${Object.entries(p.takes_from).map(([e, n]) => `${n} from “${esc(e)}”`).join("<br>") || '<span class="muted">unmapped only</span>'}</td></tr>`).join("") ||
    '<tr><td colspan="4" class="muted">nothing to propose: every cluster is mapped (untick “keep” to regroup them all)</td></tr>';
  $("pr-accept").disabled = !r.proposals.length;
}

async function refresh(tab) {
  await loadExperts();
  await pages[tab]();
  await checkStaleness();
}

// The active router keeps the mapping it was trained on: say so when the mapping has moved on.
async function checkStaleness() {
  const st = await api("GET", "/admin/api/router/staleness");
  $("stale-banner").hidden = !st.stale && !st.outgrown;
  $("stale-retrain").hidden = !st.stale;
  $("stale-refit").hidden = !st.outgrown;
  const said = [];
  if (st.stale) {
    const shown = st.changed_clusters.slice(0, 12).join(", ") + (st.changed_clusters.length > 12 ? ", …" : "");
    said.push(`Router version ${st.router_version} routes by an older mapping: ${st.reason} (clusters: ${shown}).`);
  }
  if (st.outgrown) {
    const docs = st.drift.shown.slice(0, 5).map((d) => `“${d.title}”`).join(", ") + (st.drift.documents > 5 ? ", …" : "");
    said.push(`${st.drift.summary}: ${docs}. Re-fit the experts to give them experts of their own.`);
  }
  $("stale-text").textContent = said.join(" ");
}

// The re-fit: a plan job (nothing changes), its diff, a confirmation, then the apply job.
function describeRefit(plan) {
  const rows = plan.experts.map((e) => `${e.new ? "new" : e.owned ? "owned, unchanged" : "keeps"} “${e.name}”: ${plural(e.documents, "document")}, ${plural(e.lists, "list")}, ${e.chunks} chunks`);
  const gone = plan.emptied_experts.map((e) => `emptied “${e.name}”${$("rf-delete").checked ? " (deleted; its documents go to the groups above or the fallback)" : " (kept, empty)"}`);
  const left = plan.unassigned.documents ? [`${plural(plan.unassigned.documents, "document")} unassigned (${plan.unassigned.why}): ${plan.unassigned.titles.slice(0, 5).join(", ")}`] : [];
  return [`${plan.chunks} chunks into ${plural(plan.clusters, "list")}, ${plural(plan.experts.length, "expert")}:`, ...rows, ...gone, ...left, ...(plan.note ? [plan.note] : [])];
}
async function refit() {
  const body = { experts: $("rf-experts").value ? +$("rf-experts").value : null, clusters: $("rf-clusters").value ? +$("rf-clusters").value : null };
  status("planning the re-fit…");
  const planned = await waitJob((await api("POST", "/admin/api/experts/refit", { ...body, apply: false })).id, $("rf-progress"), $("rf-job"));
  if (planned.status !== "done") return status(`re-fit plan failed: ${planned.error}`, true);
  const lines = describeRefit(planned.result);
  $("rf-diff").innerHTML = `<ul>${lines.map((l) => `<li>${esc(l)}</li>`).join("")}</ul>`;
  if (!confirm(`Apply this re-fit?\n\n${lines.join("\n")}\n\nThe router is retrained afterwards; Experts › Undo reverts it.`)) return status("re-fit not applied");
  const done = await waitJob((await api("POST", "/admin/api/experts/refit", { ...body, apply: true, delete_emptied: $("rf-delete").checked })).id, $("rf-progress"), $("rf-job"));
  if (done.status !== "done") return status(`re-fit failed: ${done.error}`, true);
  const router = done.result.router || {};
  status(`re-fitted: ${plural(done.result.experts.length, "expert")} over ${plural(done.result.clusters, "list")}` + (router.skipped ? ` — ${router.skipped}` : ""));
  await refresh("clusters");
}
// Each tab is a history entry: Back and Forward switch tabs (`popstate` shows without a new entry).
function show(tab, fromHistory = false) {
  document.querySelectorAll(".page").forEach((p) => { p.hidden = p.id !== tab; });
  document.querySelectorAll(".tab").forEach((t) => t.classList.toggle("active", t.dataset.tab === tab));
  if (!fromHistory && location.hash !== `#${tab}`) history.pushState(null, "", `#${tab}`);
  refresh(tab).catch((e) => console.error(e));
}

// ---- actions ---------------------------------------------------------------------------------------
const on = (id, event, fn) => $(id).addEventListener(event, (e) => { Promise.resolve(fn(e)).catch((err) => console.error(err)); });
document.querySelectorAll(".tab").forEach((t) => t.addEventListener("click", () => show(t.dataset.tab)));
on("cl-filter", "change", () => { state.clusterPage = 0; renderClusters(); });
on("cl-prev", "click", () => { state.clusterPage = Math.max(0, state.clusterPage - 1); renderClusters(); });
on("cl-next", "click", () => { state.clusterPage += 1; renderClusters(); });
on("cl-all", "change", (e) => document.querySelectorAll(".cl-check").forEach((c) => { c.checked = e.target.checked; }));
on("cl-assign", "click", async () => {
  const ids = [...document.querySelectorAll(".cl-check:checked")].map((c) => +c.value);
  if (!ids.length) return status("select clusters first", true);
  const target = $("cl-target").value;
  if (!confirm(`Map ${ids.length} clusters to ${target ? `“${expertName(+target)}”` : "no expert"}? Their documents are re-placed and the router must be retrained.`)) return;
  const r = await api("POST", "/admin/api/clusters/assign", { cluster_ids: ids, expert_id: target ? +target : null });
  status(`${r.assigned} clusters assigned`); await refresh("clusters");
});
on("pr-run", "click", async () => {
  showProposal(await api("POST", "/admin/api/experts/propose", { n: +$("pr-n").value, keep_mapped: $("pr-keep").checked, apply: false }));
});
on("pr-accept", "click", async () => {
  const p = state.proposal, names = [...document.querySelectorAll(".pr-name")].map((i) => i.value);
  const lose = p.diff.emptied_experts.length ? `\n${plural(p.diff.emptied_experts.length, "expert")} are deleted (left with no cluster): ${p.diff.emptied_experts.map((e) => e.name).join(", ")}. Experts › Undo brings them back.` : "";
  if (!confirm(`Create ${names.length} experts (${names.join(", ")}) and map their clusters?${lose}\nThe router must be retrained afterwards.`)) return;
  const r = await api("POST", "/admin/api/experts/propose", { n: +$("pr-n").value, keep_mapped: p.diff.keep_mapped, apply: true, names });
  status(`${plural(r.proposals.length, "expert")} created: ${r.proposals.map((x) => x.name).join(", ")}`);
  $("pr-accept").disabled = true; $("pr-rows").innerHTML = ""; $("pr-diff").innerHTML = "";
  await refresh("clusters");
});
on("ex-define", "submit", async (e) => {
  e.preventDefault();
  const id = +$("ex-def-expert").value, body = {};
  if ($("ex-def-prefix").value) body.source_prefix = $("ex-def-prefix").value;
  if ($("ex-def-tag").value) body.tag = $("ex-def-tag").value;
  const ids = $("ex-def-ids").value.split(",").map((v) => v.trim()).filter(Boolean).map(Number);
  if (ids.length) body.ids = ids;
  if (!id || !Object.keys(body).length) return status("choose an expert and give a folder, a tag or ids", true);
  if (!confirm(`Define “${expertName(id)}” by these documents? Its lists are replaced by lists of exactly their chunks and the router is retrained.`)) return;
  const done = await waitJob((await api("PUT", `/admin/api/experts/${id}/documents`, body)).id, $("ex-def-progress"), $("ex-def-job"));
  if (done.status !== "done") return status(`defining failed: ${done.error}`, true);
  status(`“${expertName(id)}” holds ${plural(done.result.documents, "document")} in ${plural(done.result.lists, "list")}`);
  await refresh("experts");
});
on("ex-new", "submit", async (e) => {
  e.preventDefault();
  const body = {};
  new FormData(e.target).forEach((v, k) => { body[k] = v; });
  body.top_k = +body.top_k; body.threshold = body.threshold === "" ? null : +body.threshold;
  await api("POST", "/admin/api/experts", body); e.target.reset(); status("expert created"); await refresh("experts");
});
on("tk-new", "submit", async (e) => {
  e.preventDefault();
  const f = new FormData(e.target), list = (k) => String(f.get(k) || "").split(",").map((s) => s.trim()).filter(Boolean);
  const experts = [...$("tk-experts").selectedOptions].map((o) => +o.value);
  const scope = { experts, tags: list("tags"), source_prefixes: list("prefixes") };
  const whole = !experts.length && !scope.tags.length && !scope.source_prefixes.length;
  const body = { name: f.get("name"), role: f.get("role"), scope: whole ? null : scope,
    expires_days: f.get("expires_days") ? +f.get("expires_days") : null };
  if (whole && body.role !== "admin" && !confirm(`Token “${body.name}” reads the whole store (no scope). Create it?`)) return;
  const made = await api("POST", "/admin/api/tokens", body);
  $("tk-secret-value").textContent = made.secret; $("tk-secret").hidden = false;
  e.target.reset(); status(`token “${made.token.name}” created`); await refresh("tokens");
});
on("ex-undo", "click", async () => {
  const past = (await api("GET", "/admin/api/experts/history?limit=1")).items;
  if (!past.length || !confirm(`Undo “${past[0].summary}”? The experts, their mapping${past[0].lists_replaced ? ", the lists" : ""} and the router go back to how they were before it.`)) return;
  const done = await waitJob((await api("POST", "/admin/api/experts/undo", {})).id, $("ex-undo-progress"), $("ex-undo-job"));
  if (done.status !== "done") return status(`undo failed: ${done.error}`, true);
  status(`undone: ${done.result.summary}`); await refresh("experts");
});
on("stale-retrain", "click", () => { show("router"); $("rt-train").click(); });
on("stale-refit", "click", () => { show("clusters"); $("rf-title").scrollIntoView(); $("rf-plan").focus(); });
on("rf-plan", "click", refit);
on("rt-train", "click", async () => {
  status("training the router…");
  const job = await api("POST", "/admin/api/router/train", {});
  const done = await waitJob(job.id, $("rt-progress"), $("rt-job"));
  if (done.status !== "done") status(`training failed: ${done.error}`, true);
  else if (done.result.held_back) {
    const d = done.result.held_back.delta;
    status(`router version ${done.result.version} trained but not activated: worse than the active version`, true,
      [`accuracy ${signed(d.accuracy)}`, `share on the expert path ${signed(d.coverage_at_threshold)}`, `accuracy there ${signed(d.accuracy_at_threshold)}`]);
  } else status(`router version ${done.result.version} trained`);
  await refresh("router");
});
on("try-form", "submit", async (e) => {
  e.preventDefault();
  const rt = (await api("POST", "/admin/api/router/try", { query: $("try-q").value })).route;
  $("try-out").innerHTML = `<p id="try-path" class="path-${rt.path}">${rt.path}${rt.expert ? " → " + esc(rt.expert.name) : ""} (${esc(rt.detail)})</p>` +
    routeProbabilities(rt.top);
});
on("pg-form", "submit", (e) => { e.preventDefault(); return ask(state); });
on("pg-new", "click", () => newConversation(state));
on("pg-mode", "change", () => { $("pg-expert").disabled = $("pg-mode").value !== "expert"; });
on("cv-close", "click", () => $("chunk-viewer").close());
on("doc-search", "submit", (e) => { e.preventDefault(); state.docQuery = $("doc-q").value.trim(); state.docPage = 0; return refresh("documents"); });
// The types moerag reads (engine.parsing.SUFFIXES): a folder's other files are named as skipped.
const SUPPORTED = [".txt", ".text", ".rst", ".md", ".markdown", ".html", ".htm", ".xhtml", ".pdf",
  ".docx", ".pptx", ".xlsx", ".odt"];
const readable = (f) => SUPPORTED.some((s) => f.name.toLowerCase().endsWith(s));
on("doc-upload", "submit", async (e) => {
  e.preventDefault();
  const form = new FormData();
  const folder = [...$("doc-folder").files].filter((f) => !f.webkitRelativePath.split("/").some((p) => p.startsWith(".")));
  const skipped = folder.filter((f) => !readable(f)).map((f) => `${f.webkitRelativePath}: unsupported type`);
  // A folder's file is stored as folder-name/path, as `moerag ingest FOLDER` and upload_folder store it.
  [...$("doc-files").files].forEach((f) => form.append("files", f, f.name));
  folder.filter(readable).forEach((f) => form.append("files", f, f.webkitRelativePath));
  if (!form.has("files")) { status("nothing to upload: pick files or a folder of a type moerag reads", true, skipped); return; }
  const job = await api("POST", "/documents/bulk", form);
  const done = await waitJob(job.id, $("doc-progress"), $("doc-job"));
  if (done.status !== "done") status(`upload failed: ${done.error}`, true);
  else {
    const r = done.result;
    const left = skipped.length ? `, ${skipped.length} skipped` : "";
    status(`ingested: ${r.created} new, ${r.duplicate} already there, ${r.failed} failed${left}`,
      r.failed > 0, [...(r.failures || []).map((f) => `${f.source}: ${f.error}`), ...skipped]);
  }
  await refresh("documents");
});
on("sync-form", "submit", async (e) => {
  e.preventDefault();
  const kind = $("sync-kind").value, where = $("sync-where").value.trim();
  const body = { [kind]: where };
  if (kind === "git" && $("sync-branch").value.trim()) body.branch = $("sync-branch").value.trim();
  const done = await waitJob((await api("POST", "/admin/api/sync", body)).id, $("sync-progress"), $("sync-job"));
  if (done.status !== "done") return status(`sync failed: ${done.error}`, true);
  const r = done.result;
  // What a sync kept or left out says as much as what it changed: pages not reached are kept, links never followed.
  const kept = r.unvisited ? `, ${r.unvisited} kept unvisited${r.stopped ? ` (${r.stopped})` : ""}` : "";
  const links = r.links_skipped ? `, ${r.links_skipped} symbolic links skipped` : "";
  status(`synced: ${r.added} added, ${r.updated} updated, ${r.deleted} deleted, ${r.unchanged} unchanged, ${r.failed} failed${kept}${links}`,
    r.failed > 0 || r.links_skipped > 0,
    (r.failures || []).map((f) => `${f.source}: ${f.error}`).concat((r.links || []).map((l) => `${l}: a symbolic link, not followed`)));
  await refresh("documents");
});
on("doc-prev", "click", () => { state.docPage = Math.max(0, state.docPage - 1); return refresh("documents"); });
on("doc-next", "click", () => { state.docPage += 1; return refresh("documents"); });

window.addEventListener("popstate", () => {
  const tab = (location.hash || "#overview").slice(1);
  show(tab in pages ? tab : "overview", true);
});
const first = (location.hash || "#overview").slice(1);
show(first in pages ? first : "overview");
