// Small helpers shared by the panels: DOM building, number formats, the kinds' colours.

/** An element: el("div", {class: "x", onclick: f}, child, "text", ...). */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** Text made safe for HTML markup built as a string (the legend). */
export function esc(text) {
  return String(text).replace(/[&<>"']/g, (c) => ({
    "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

export function fmtBytes(n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "KB", "MB", "GB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${n >= 100 || i === 0 ? Math.round(n) : n.toFixed(1)} ${units[i]}`;
}

export function fmtS(s, digits = 2) {
  if (s === null || s === undefined || Number.isNaN(s)) return "-";
  if (s >= 60) return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
  return `${s.toFixed(s >= 10 ? 1 : digits)} s`;
}

export function clock(unix) {
  const d = new Date(unix * 1000);
  return d.toLocaleTimeString([], { hour12: false }) + "." +
    String(d.getMilliseconds()).padStart(3, "0").slice(0, 1);
}

const KNOWN = ["chat", "extract", "nataraj", "gana"];
const OTHER = ["#64748b", "#0ea5e9", "#84cc16", "#f43f5e", "#a16207"];
const vars = new Map();
matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => vars.clear());

/** A CSS custom property of the page, read once (reading computed style can force the
 *  browser to recompute the page's style; the timeline asks for colours per element). */
export function cssVar(name) {
  if (!vars.has(name)) {
    vars.set(name, getComputedStyle(document.documentElement).getPropertyValue(name).trim());
  }
  return vars.get(name);
}

/** The colour of a job kind on the timeline and in badges (CSS variables for the known). */
export function kindColor(kind) {
  if (KNOWN.includes(kind)) return cssVar(`--k-${kind}`);
  let h = 0;
  for (const c of String(kind)) h = (h * 31 + c.charCodeAt(0)) >>> 0;
  return OTHER[h % OTHER.length];
}

/** Wall-clock now in seconds, with sub-millisecond precision. */
export function nowS() { return (performance.timeOrigin + performance.now()) / 1000; }
