// The answer playground (ask, see the answer with its citations highlighted in their passages, the
// route with probabilities and reason, timings) and the chunk viewer (document, heading path, expert,
// neighbours). Both read the public API: what the console shows is what a client gets.
import { $, api, esc } from "./api.js";
import { bars } from "./plots.js";

// The answer's sentences per citation number: "A sentence. [1][3]" quotes passages 1 and 3.
export function quotesOf(answer) {
  const quotes = new Map();
  for (const m of (answer || "").matchAll(/([^[\]]+?)\s*((?:\[\d+\]\s*)+)/g)) {
    const said = m[1].replace(/^[\s.;:,]+/, "").trim();
    for (const n of m[2].match(/\d+/g)) {
      if (!quotes.has(+n)) quotes.set(+n, []);
      if (said) quotes.get(+n).push(said);
    }
  }
  return quotes;
}

// The passage as HTML with the quoted sentences marked; whitespace may differ, case may not.
export function highlight(passage, quotes) {
  const ranges = [];
  for (const quote of quotes) {
    // A quote may join sentences the answerer cleaned up: look for each of them.
    for (const part of quote.split(/(?<=[.!?])\s+/)) {
      const words = part.trim().replace(/[.!?…]+$/, "").split(/\s+/).filter(Boolean);
      if (words.join(" ").length < 12) continue;
      const re = new RegExp(words.map((w) => w.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")).join("[\\s|]+"));
      const m = re.exec(passage);
      if (m) ranges.push([m.index, m.index + m[0].length]);
    }
  }
  ranges.sort((a, b) => a[0] - b[0]);
  let html = "", at = 0;
  for (const [s, e] of ranges) {
    if (e <= at) continue;
    const from = Math.max(s, at);
    html += esc(passage.slice(at, from)) + `<mark>${esc(passage.slice(from, e))}</mark>`;
    at = e;
  }
  return html + esc(passage.slice(at));
}

// The router's probabilities over the experts it scored: a route's `top`.
export const routeProbabilities = (top) =>
  bars((top || []).map((t) => ({ label: t.expert ? t.expert.name : "none", value: +t.p.toFixed(3) })),
    { w: 360, h: 200, xLabel: "expert", yLabel: "router probability", empty: "no router: nothing to score" });

const answerHtml = (answer) => esc(answer).replace(/\[(\d+)\]/g, (_, n) => `<a href="#cite-${n}" class="cite-ref" data-n="${n}">[${n}]</a>`);

// The playground's conversation: an id of its own until "New conversation" (app.services.conversations).
export function newConversation(state) {
  state.conversation = (crypto.randomUUID ? crypto.randomUUID() : `c-${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`);
  $("pg-turns").innerHTML = "";
}

export async function ask(state) {
  const body = { query: $("pg-q").value, mode: $("pg-mode").value };
  if ($("pg-conv").checked) {
    if (!state.conversation) newConversation(state);
    body.conversation_id = state.conversation;
  }
  if ($("pg-k").value) body.k = +$("pg-k").value;
  if (body.mode === "expert" && $("pg-expert").value) body.expert = +$("pg-expert").value;
  $("pg-go").disabled = true;
  let r;
  try { r = await api("POST", "/ask", body); } finally { $("pg-go").disabled = false; }
  const rt = r.route, quotes = quotesOf(r.answer);
  $("pg-out").hidden = false;
  $("pg-answer").innerHTML = r.answer ? answerHtml(r.answer) : '<span class="muted">no answer generated</span>';
  $("pg-cites").innerHTML = r.citations.map((c) => `<li id="cite-${c.n}" class="${c.used ? "used" : "unused"}" value="${c.n}">
    <div class="cite-head"><b>${esc(c.title || c.source)}</b> <span class="muted">${c.heading === c.title ? "" : esc(c.heading)}</span>
      <span class="muted small">${c.used ? "cited" : "retrieved, not cited"} · score ${c.score.toFixed(4)}</span>
      <button class="open-chunk link" data-chunk="${c.chunk_id}">open chunk ${c.chunk_id}</button></div>
    <div class="passage">${highlight(c.text, quotes.get(c.n) || [])}</div></li>`).join("") || '<li class="muted">nothing retrieved</li>';
  const conf = rt.confidence == null ? "" : ` · confidence ${rt.confidence.toFixed(2)} (threshold ${rt.threshold})`;
  $("pg-route").innerHTML = `<span id="pg-path" class="path-${rt.path}">${rt.path}${rt.expert ? " → " + esc(rt.expert.name) : ""}</span>${conf}
    <br><span class="muted">${esc(rt.reason)}: ${esc(rt.detail)}</span>
    <br><span class="muted small">scanned ${rt.clusters_scanned} clusters, ${rt.vectors_scanned} vectors · router v${rt.router_version ?? "—"} · catalogue v${rt.catalogue_version ?? "—"}</span>`;
  $("pg-probs").innerHTML = routeProbabilities(rt.top);
  if (r.conversation_id) {
    const by = r.standalone_by ? ` <span class="muted small">(${r.standalone_by === "llm" ? "rewritten by the model" : "by the rule"})</span>` : "";
    const routed = r.standalone_question === body.query ? "" : ` → <i>${esc(r.standalone_question)}</i>${by}`;
    $("pg-turns").insertAdjacentHTML("beforeend", `<li>${esc(body.query)}${routed}
      <span class="path-${rt.path}">${rt.path}${rt.expert ? " → " + esc(rt.expert.name) : ""}</span></li>`);
  }
  $("pg-timings").innerHTML = Object.entries(r.timings_ms).map(([k, v]) => `<tr><td>${esc(k)}</td><td class="num">${v.toFixed(1)} ms</td></tr>`).join("");
  document.querySelectorAll("#pg-answer .cite-ref").forEach((a) => a.addEventListener("click", (e) => {
    e.preventDefault();
    const li = $(`cite-${a.dataset.n}`);
    li.scrollIntoView({ block: "center" }); li.classList.add("flash"); setTimeout(() => li.classList.remove("flash"), 1200);
  }));
  document.querySelectorAll("#pg-cites .open-chunk").forEach((b) => b.addEventListener("click", () => openChunk(+b.dataset.chunk, state)));
}

// The chunk viewer: one chunk in full, where it lives, and a step to either neighbour.
export async function openChunk(id, state) {
  const c = await api("GET", `/chunks/${id}`);
  const expert = c.expert_id == null ? "unmapped cluster" : (state.experts.find((e) => e.id === c.expert_id) || {}).name;
  $("cv-title").textContent = c.title || c.source;
  $("cv-meta").innerHTML = `<span class="muted">${esc(c.source)}</span> · chunk ${c.id} (#${c.ordinal + 1} in document ${c.document_id})
    · cluster ${c.cluster_id} · expert: ${esc(expert)} · ${c.token_count} tokens`;
  $("cv-heading").innerHTML = (c.heading || "").split(" > ").filter(Boolean).map((h) => `<span>${esc(h)}</span>`).join(" › ") || '<span class="muted">no heading</span>';
  $("cv-text").textContent = c.text;
  for (const [side, n] of [["prev", c.previous], ["next", c.next]]) {
    const b = $(`cv-${side}`);
    b.disabled = !n;
    b.title = n ? `${n.heading} — ${n.text.slice(0, 120)}…` : "no neighbour on this side";
    b.onclick = n ? () => openChunk(n.id, state) : null;
  }
  const dialog = $("chunk-viewer");
  if (!dialog.open) dialog.showModal();
}
