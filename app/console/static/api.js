// The console's one door to the server: the admin JSON API with the session cookie + CSRF header,
// every failure shown as a toast with its reasons, and job polling with a progress bar.
const CSRF = document.querySelector('meta[name="csrf"]').content;
export const $ = (id) => document.getElementById(id);
export const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));

// The toast: a fixed box (it never shifts the page). Errors stay until closed; the rest fade.
let fade = null;
export function status(text, error = false, reasons = []) {
  const box = $("toast");
  $("status").textContent = text;
  $("status").className = error ? "error" : "";
  $("status-reasons").innerHTML = reasons.map((r) => `<li>${esc(r)}</li>`).join("");
  box.className = error ? "toast error" : "toast";
  box.hidden = false;
  clearTimeout(fade);
  if (!error) fade = setTimeout(() => { box.hidden = true; }, 6000);
}
$("toast-close").addEventListener("click", () => { $("toast").hidden = true; });

export async function api(method, path, body) {
  const opts = { method, headers: { "X-CSRF-Token": CSRF }, credentials: "same-origin" };
  if (body instanceof FormData) opts.body = body;
  else if (body !== undefined) { opts.body = JSON.stringify(body); opts.headers["Content-Type"] = "application/json"; }
  let r;
  try { r = await fetch(path, opts); } catch (e) { status(`the server cannot be reached (${e.message})`, true); throw e; }
  if (r.status === 401) { location.href = "/admin/login"; throw new Error("signed out"); }
  if (r.status === 204) return null;
  const data = await r.json().catch(() => ({}));
  if (!r.ok) {
    const err = data.error || { message: r.statusText };
    const reasons = (err.details || []).map((d) => `${(d.loc || []).join(".")}: ${d.msg || JSON.stringify(d)}`);
    status(`${method} ${path.split("?")[0]} failed (${r.status}): ${err.message}`, true, reasons);
    throw new Error(err.message);
  }
  return data;
}

// Every item of a paged list ({items, total, offset, limit}), page after page.
export async function all(path) {
  const items = [];
  for (let offset = 0; ; ) {
    const page = await api("GET", `${path}${path.includes("?") ? "&" : "?"}offset=${offset}&limit=500`);
    items.push(...page.items);
    offset += page.items.length;
    if (!page.items.length || offset >= page.total) return items;
  }
}

export async function waitJob(id, bar, label) {
  bar.hidden = false;
  for (;;) {
    const job = await api("GET", `/jobs/${id}`);
    bar.value = job.total ? (100 * job.done) / job.total : 0;
    label.textContent = `job ${id}: ${job.status} ${job.done}/${job.total}`;
    if (job.status === "done" || job.status === "failed") { bar.hidden = true; return job; }
    await new Promise((r) => setTimeout(r, 400));
  }
}
