// Inline SVG plots for the console: axes with ticks and units, legends outside the plot area,
// colours from CSS (light and dark). No libraries, nothing fetched from outside the machine.
import { esc } from "./api.js";

export const PALETTE = ["#3559c7", "#e8590c", "#2f9e44", "#c2255c", "#7048e8", "#1098ad", "#f08c00", "#5c940d",
  "#d6336c", "#4263eb", "#0ca678", "#ae3ec9"];
export const colorOf = (expertId) => expertId == null ? "#98a2b3" : PALETTE[expertId % PALETTE.length];

const svg = (w, h, inner, label) =>
  `<svg width="${w}" height="${h}" viewBox="0 0 ${w} ${h}" role="img" aria-label="${esc(label)}">${inner}</svg>`;
const text = (x, y, s, { anchor = "middle", size = 10, cls = "tick", rotate = null } = {}) =>
  `<text class="${cls}" x="${x.toFixed(1)}" y="${y.toFixed(1)}" font-size="${size}" text-anchor="${anchor}"` +
  (rotate == null ? "" : ` transform="rotate(${rotate} ${x.toFixed(1)} ${y.toFixed(1)})"`) + `>${esc(s)}</text>`;

// A legend as HTML under the title: never over the data.
export function legend(entries) {
  return `<div class="legend">${entries.map(([name, color]) =>
    `<span><i style="background:${color}"></i>${esc(name)}</span>`).join("")}</div>`;
}

function niceMax(v) {
  if (v <= 0) return 1;
  const p = 10 ** Math.floor(Math.log10(v)), m = v / p;
  return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

// Axes for a plot area [l, w - r] x [t, h - b]: y ticks with grid lines, axis titles with units.
function axes({ w, h, l, r, t, b, yMax, yTicks, xLabel, yLabel, fmt = (v) => v }) {
  let out = `<line class="axis" x1="${l}" y1="${h - b}" x2="${w - r}" y2="${h - b}"/><line class="axis" x1="${l}" y1="${t}" x2="${l}" y2="${h - b}"/>`;
  for (let i = 0; i <= yTicks; i++) {
    const v = (yMax * i) / yTicks, y = h - b - ((h - b - t) * i) / yTicks;
    if (i) out += `<line class="grid" x1="${l}" y1="${y.toFixed(1)}" x2="${w - r}" y2="${y.toFixed(1)}"/>`;
    out += text(l - 5, y + 3, fmt(v), { anchor: "end" });
  }
  out += text((l + w - r) / 2, h - 4, xLabel, { size: 11, cls: "title" });
  out += text(12, (t + h - b) / 2, yLabel, { size: 11, cls: "title", rotate: -90 });
  return out;
}

// Points on [0, 1] x [0, 1]: reliability and coverage curves.
export function lineChart(series, { w = 440, h = 290, xLabel = "", yLabel = "", vline = null, diagonal = false } = {}) {
  const l = 44, r = 12, t = 12, b = 40;
  const X = (v) => l + v * (w - l - r), Y = (v) => h - b - v * (h - b - t);
  let inner = axes({ w, h, l, r, t, b, yMax: 1, yTicks: 4, xLabel, yLabel, fmt: (v) => v.toFixed(2) });
  for (const v of [0, 0.25, 0.5, 0.75, 1]) inner += text(X(v), h - b + 14, v.toFixed(2));
  if (diagonal) inner += `<line class="guide" x1="${X(0)}" y1="${Y(0)}" x2="${X(1)}" y2="${Y(1)}"/>`;
  if (vline != null) {
    inner += `<line class="threshold" x1="${X(vline)}" y1="${t}" x2="${X(vline)}" y2="${h - b}"/>`;
    inner += text(X(vline) + 4, t + 10, `threshold ${vline}`, { anchor: "start", cls: "threshold-label" });
  }
  series.forEach((s, i) => {
    const pts = s.points.map(([x, y]) => `${X(x).toFixed(1)},${Y(y).toFixed(1)}`).join(" ");
    inner += `<polyline fill="none" stroke="${PALETTE[i]}" stroke-width="2" points="${pts}"/>`;
    s.points.forEach(([x, y]) => {
      inner += `<circle cx="${X(x).toFixed(1)}" cy="${Y(y).toFixed(1)}" r="2.5" fill="${PALETTE[i]}"><title>${esc(s.name)}: ${x.toFixed(2)} → ${y.toFixed(3)}</title></circle>`;
    });
  });
  return legend(series.map((s, i) => [s.name, PALETTE[i]])) + svg(w, h, inner, `${yLabel} by ${xLabel}`);
}

// Bars (or stacked bars) with a y axis, labelled x categories (thinned when crowded) and a legend.
// `counts`: the values are whole numbers (ticks too).
export function bars(items, { w = 560, h = 240, stacked = null, xLabel = "", yLabel = "", empty = "nothing yet", counts = false } = {}) {
  if (!items.length) return `<p class="muted">${esc(empty)}</p>`;
  const l = 44, r = 10, t = 10, b = 48, bw = Math.min((w - l - r) / items.length, 90);
  const keys = stacked || ["value"];
  const top = Math.max(...items.map((it) => keys.reduce((a, k) => a + it[k], 0)));
  const yMax = counts ? Math.max(niceMax(top), 1) : niceMax(top || 1);
  const yTicks = counts ? Math.min(4, yMax) : 4;
  const fmt = (v) => (counts || Number.isInteger(v) ? String(Math.round(v)) : v.toFixed(2));
  let inner = axes({ w, h, l, r, t, b, yMax, yTicks, xLabel, yLabel, fmt });
  const every = Math.ceil(items.length / Math.floor((w - l - r) / 56));
  items.forEach((it, i) => {
    let y = h - b;
    keys.forEach((k, j) => {
      const bh = (it[k] / yMax) * (h - b - t);
      inner += `<rect x="${(l + i * bw + 1).toFixed(1)}" y="${(y - bh).toFixed(1)}" width="${Math.max(bw - 2, 1).toFixed(1)}" height="${bh.toFixed(1)}" fill="${PALETTE[j]}"><title>${esc(it.label)} — ${esc(stacked ? k : yLabel)}: ${it[k]}</title></rect>`;
      y -= bh;
    });
    if (i % every === 0) inner += text(l + i * bw + bw / 2, h - b + 14, String(it.label).slice(0, 14));
  });
  return (stacked ? legend(stacked.map((k, j) => [k, PALETTE[j]])) : "") + svg(w, h, inner, `${yLabel} by ${xLabel}`);
}

// The cluster map: one dot per cluster, coloured by expert, sized by chunks; legend beside it.
export function scatter(points, expertName, { w = 440, h = 360 } = {}) {
  if (!points.length) return '<p class="muted">no clusters yet</p>';
  const span = (vs) => { const lo = Math.min(...vs), hi = Math.max(...vs); return [lo, hi - lo || 1]; };
  const [x0, dx] = span(points.map((p) => p.x)), [y0, dy] = span(points.map((p) => p.y));
  const X = (v) => 20 + ((v - x0) / dx) * (w - 40), Y = (v) => h - 20 - ((v - y0) / dy) * (h - 40);
  const maxSize = Math.max(...points.map((p) => p.size), 1);
  const dots = points.map((p) => `<circle class="cluster-dot" data-id="${p.id}" cx="${X(p.x).toFixed(1)}" cy="${Y(p.y).toFixed(1)}"
    r="${(3 + 9 * Math.sqrt(p.size / maxSize)).toFixed(1)}" fill="${colorOf(p.expert_id)}" fill-opacity=".8"><title>cluster ${p.id} · ${p.size} chunks · expert: ${esc(expertName(p.expert_id))}${p.keywords ? " · " + esc(p.keywords.join(", ")) : ""}</title></circle>`);
  const owners = [...new Set(points.map((p) => p.expert_id))].sort((a, b) => (a ?? -1) - (b ?? -1));
  return legend(owners.map((e) => [e == null ? "unmapped" : expertName(e), colorOf(e)])) +
    svg(w, h, dots.join(""), "cluster centroids projected on two axes (PCA); size: chunks") +
    '<p class="muted small">Centroids projected by PCA; dot area grows with the chunks in the cluster. Click a dot for its chunks.</p>';
}
