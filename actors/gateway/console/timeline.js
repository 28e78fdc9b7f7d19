// The timeline of the last minutes, drawn as SVG: what `uniun-runtime trace export`
// writes, live.
//
// Rows, top to bottom: the marks (preempt, resume, swap, runner lost / up, scheduler
// start, process restart) as glyphs with a line down through the tracks; the runner's
// track, one bar per stretch a job held it, coloured by kind; one thin row per tier with
// the stretches jobs waited in it; the time axis (seconds before now). The running job
// and the waiting ones, whose segments are written only when they end, are drawn open
// up to now from the status. Hovering (or tapping) a bar or a mark says which job, its
// tier, and why it started and why it stopped.
//
// Drawing is cheap and bounded: a string of SVG built at most once per animation frame,
// at once when a segment or a mark arrived (the preemption must show within 0.5 s), else
// as often as the window's time moves by a pixel but at most 4 times a second, and not at
// all while the timeline is scrolled out of view or the tab is hidden. The page shares
// the machine with the runtime: every frame it does not draw is CPU the runner keeps.

import { clock, cssVar, esc, fmtS, kindColor, nowS } from "./util.js";

const LABEL_W = 46;
const MARK_Y = 1;
const RUN_Y = 16;
const RUN_H = 26;
const WAIT_Y = 50;
const WAIT_H = 9;
const WAIT_GAP = 3;
const AXIS_Y = WAIT_Y + 5 * (WAIT_H + WAIT_GAP) + 4;
const HEIGHT = AXIS_Y + 16;
const STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600];
const MARK_COLORS = {
  preempt: "--mark-preempt", resume: "--mark-resume", swap: "--mark-swap",
};
const STOPS = {
  preempted: "preempted", slice: "its time slice ended", budget: "the T2 budget ran out",
  swap: "made way for a model swap", done: "done", cancelled: "cancelled",
  failed: "failed", runner_lost: "the runner was lost", shutdown: "the runtime stopped",
  dispatched: "dispatched to the runner",
};
const KEEP_DRAWN = 500;

export class Timeline {
  constructor(root, tip, legend, live) {
    this.root = root;
    this.tip = tip;
    this.legend = legend;
    this.live = live;
    this.win = 120;
    this.items = [];
    this.pending = false;
    this.legendKey = "";
    this.drawn = []; // marks as drawn: {what, job_id, at, drawn_at} (the console's latency)
    this.width = root.clientWidth || 600;
    this.visible = true;
    new ResizeObserver(() => { this.width = root.clientWidth || this.width; this.request(); })
      .observe(root);
    new IntersectionObserver((entries) => {
      this.visible = entries.some((e) => e.isIntersecting);
      if (this.visible) this.request();
    }).observe(root);
    root.addEventListener("pointermove", (e) => this._hover(e));
    root.addEventListener("pointerdown", (e) => this._hover(e));
    root.addEventListener("pointerleave", () => { this.tip.hidden = true; });
    for (const name of ["timeline", "reset"]) live.addEventListener(name, () => this.request());
    this._tick();
  }

  setWindow(seconds) {
    this.win = seconds;
    this.request();
  }

  request() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => { this.pending = false; this.draw(); });
  }

  _tick() {
    const plotW = Math.max(100, this.width - LABEL_W - 4);
    const every = Math.max(250, (1000 * this.win) / plotW);
    setTimeout(() => {
      if (!document.hidden && this.visible) this.request();
      this._tick();
    }, every);
  }

  draw() {
    const live = this.live;
    const width = Math.max(200, this.width);
    const plotW = width - LABEL_W - 4;
    const now = live.now();
    const t0 = now - this.win;
    const x = (t) => LABEL_W + ((Math.max(t, t0) - t0) / this.win) * plotW;
    const w = (a, b) => Math.max(1.5, x(Math.min(b, now)) - x(a));
    const items = [];
    const out = [];
    const kinds = new Set();
    out.push(`<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 ${width} ${HEIGHT}" height="${HEIGHT}" role="img" aria-label="runner timeline">`);
    // track backgrounds and labels
    out.push(`<rect x="${LABEL_W}" y="${RUN_Y}" width="${plotW}" height="${RUN_H}" fill="${cssVar("--bg")}"/>`);
    out.push(`<text class="lbl" x="2" y="${RUN_Y + 17}">runner</text>`);
    for (let t = 0; t < 5; t += 1) {
      const y = WAIT_Y + t * (WAIT_H + WAIT_GAP);
      out.push(`<rect x="${LABEL_W}" y="${y}" width="${plotW}" height="${WAIT_H}" fill="${cssVar("--bg")}"/>`);
      out.push(`<text class="lbl" x="2" y="${y + 8}">T${t} wait</text>`);
    }
    const add = (item) => { items.push(item); return items.length - 1; };
    // finished stretches
    for (const s of live.segments) {
      if (s.end < t0) continue;
      kinds.add(s.kind);
      const color = kindColor(s.kind);
      const k = add({ type: "segment", s });
      if (s.lane === "run") {
        out.push(`<rect class="seg-run" data-k="${k}" data-job="${esc(s.job_id)}" x="${x(s.start)}" y="${RUN_Y}" width="${w(s.start, s.end)}" height="${RUN_H}" fill="${color}"/>`);
      } else {
        const y = WAIT_Y + Math.min(4, Math.max(0, s.tier)) * (WAIT_H + WAIT_GAP);
        out.push(`<rect class="seg-wait" data-k="${k}" data-job="${esc(s.job_id)}" x="${x(s.start)}" y="${y}" width="${w(s.start, s.end)}" height="${WAIT_H}" fill="${color}" fill-opacity="0.45"/>`);
      }
    }
    // what is open now: the running job, the waiting ones (from the status)
    const status = live.status;
    if (status && status.running && status.running.job_id) {
      const r = status.running;
      const start = this._openStart(r.job_id, "run");
      kinds.add(r.kind);
      const k = add({ type: "open-run", r, start });
      out.push(`<rect class="seg-run open" data-k="${k}" data-job="${esc(r.job_id)}" x="${x(start)}" y="${RUN_Y}" width="${w(start, now)}" height="${RUN_H}" fill="${kindColor(r.kind)}"/>`);
    }
    if (status && status.queues) {
      Object.entries(status.queues).forEach(([tierName, ids]) => {
        const tier = Number(String(tierName).slice(1)) || 0;
        for (const id of ids.slice(0, 50)) {
          const start = this._openStart(id, "wait");
          const kind = this._kindOf(id);
          const y = WAIT_Y + Math.min(4, tier) * (WAIT_H + WAIT_GAP);
          const k = add({ type: "open-wait", id, tier, start, kind });
          out.push(`<rect class="seg-wait open" data-k="${k}" data-job="${esc(id)}" x="${x(start)}" y="${y}" width="${w(start, now)}" height="${WAIT_H}" fill="${kindColor(kind)}" fill-opacity="0.45"/>`);
        }
      });
    }
    // marks
    const shown = [];
    for (const m of live.marks) {
      if (m.at < t0) continue;
      shown.push(m);
      const k = add({ type: "mark", m });
      out.push(this._glyph(m, x(m.at), k));
    }
    // axis: seconds before now
    const step = STEPS.find((s) => this.win / s <= Math.max(2, Math.floor(plotW / 60))) || 600;
    out.push(`<line class="axis" x1="${LABEL_W}" x2="${LABEL_W + plotW}" y1="${AXIS_Y}" y2="${AXIS_Y}"/>`);
    for (let ago = 0; ago <= this.win + 1e-9; ago += step) {
      const tx = LABEL_W + plotW - (ago / this.win) * plotW;
      const label = ago === 0 ? "now" : ago >= 60 ? `-${ago / 60} min` : `-${ago} s`;
      const anchor = ago === 0 ? "end" : tx - LABEL_W < 20 ? "start" : "middle";
      out.push(`<line class="axis" x1="${tx}" x2="${tx}" y1="${AXIS_Y}" y2="${AXIS_Y + 4}"/>`);
      out.push(`<text class="lbl" x="${tx}" y="${AXIS_Y + 14}" text-anchor="${anchor}">${label}</text>`);
    }
    out.push("</svg>");
    this.root.innerHTML = out.join("");
    this.items = items;
    this._recordDrawn(shown);
    this._legend(kinds);
  }

  /** When an open stretch began: the end of the job's last segment (a dispatch ends its
   *  wait and starts its run; a pause ends its run and starts its wait), else when the
   *  page first saw it. */
  _openStart(jobId, lane) {
    const segs = this.live.segments;
    for (let i = segs.length - 1; i >= 0; i -= 1) {
      const s = segs[i];
      if (s.job_id === jobId && ((lane === "run" && s.lane === "wait") ||
                                 (lane === "wait" && s.lane === "run"))) return s.end;
    }
    return this.live.firstSeen.get(jobId) ?? this.live.now();
  }

  _kindOf(jobId) {
    const segs = this.live.segments;
    for (let i = segs.length - 1; i >= 0; i -= 1) if (segs[i].job_id === jobId) return segs[i].kind;
    const m = /^console-([a-z0-9_]+)-/.exec(jobId);
    return m ? m[1] : "other";
  }

  _glyph(m, mx, k) {
    const color = cssVar(MARK_COLORS[m.what] || "--mark-proc");
    const top = MARK_Y;
    const bottom = RUN_Y + RUN_H + (m.what === "preempt" || m.what === "resume" ? 0 : 5 * (WAIT_H + WAIT_GAP) + 8);
    let shape;
    switch (m.what) {
      case "preempt": shape = `<path d="M${mx - 5} ${top} L${mx + 5} ${top} L${mx} ${top + 11} Z"/>`; break;
      case "resume": shape = `<path d="M${mx - 5} ${top + 11} L${mx + 5} ${top + 11} L${mx} ${top} Z"/>`; break;
      case "swap": shape = `<path d="M${mx} ${top} L${mx + 5} ${top + 6} L${mx} ${top + 12} L${mx - 5} ${top + 6} Z"/>`; break;
      case "runner_lost": shape = `<path d="M${mx - 4} ${top + 1} L${mx + 4} ${top + 10} M${mx + 4} ${top + 1} L${mx - 4} ${top + 10}" stroke="${color}" stroke-width="2.5"/>`; break;
      case "scheduler_start": shape = `<rect x="${mx - 4}" y="${top + 1}" width="9" height="9"/>`; break;
      default: shape = `<circle cx="${mx}" cy="${top + 6}" r="4.5"/>`;
    }
    const job = m.job_id ? ` data-job="${esc(m.job_id)}"` : "";
    return `<g class="mark mark-${esc(m.what)}" data-k="${k}"${job} fill="${color}">` +
      `<line x1="${mx}" x2="${mx}" y1="${top + 11}" y2="${bottom}" stroke="${color}" stroke-width="1.2" stroke-dasharray="3 2"/>` +
      `${shape}<rect x="${mx - 5}" y="${top}" width="10" height="${bottom - top}" fill="transparent"/></g>`;
  }

  _recordDrawn(marks) {
    const at = nowS();
    for (const m of marks) {
      if (m.drawn_at !== undefined) continue;
      m.drawn_at = at;
      this.drawn.push({ what: m.what, job_id: m.job_id, at: m.at, received_at: m.received,
                        drawn_at: at, skew_s: this.live.skew });
    }
    if (this.drawn.length > KEEP_DRAWN) this.drawn.splice(0, this.drawn.length - KEEP_DRAWN);
  }

  _legend(kinds) {
    const key = [...kinds].sort().join(",");
    if (key === this.legendKey) return;
    this.legendKey = key;
    const parts = [...kinds].sort().map((k) => `<span><i data-c="${esc(kindColor(k))}"></i>${esc(k)}</span>`);
    parts.push('<span class="lg-preempt">&#9660; preempt</span><span class="lg-resume">&#9650; resume</span>' +
               '<span class="lg-swap">&#9670; swap</span><span>&#9679; runner up / restart</span>');
    this.legend.innerHTML = parts.join("");
    for (const i of this.legend.querySelectorAll("i[data-c]")) i.style.background = i.dataset.c;
    for (const [cls, v] of [["lg-preempt", "--mark-preempt"], ["lg-resume", "--mark-resume"], ["lg-swap", "--mark-swap"]]) {
      const node = this.legend.querySelector(`.${cls}`);
      if (node) node.style.color = cssVar(v);
    }
  }

  _hover(event) {
    const target = event.target.closest ? event.target.closest("[data-k]") : null;
    const item = target ? this.items[Number(target.dataset.k)] : null;
    if (!item) { this.tip.hidden = true; return; }
    this.tip.textContent = this.describe(item);
    this.tip.hidden = false;
    const box = this.tip.getBoundingClientRect();
    const left = Math.min(event.clientX + 12, window.innerWidth - box.width - 6);
    const top = event.clientY + 14 + box.height > window.innerHeight
      ? event.clientY - box.height - 10 : event.clientY + 14;
    this.tip.style.left = `${Math.max(4, left)}px`;
    this.tip.style.top = `${Math.max(4, top)}px`;
  }

  /** The words for a hovered item: which job, its tier, why it started and stopped. */
  describe(item) {
    const live = this.live;
    if (item.type === "mark") {
      const m = item.m;
      return `${m.what}${m.job_id ? ` ${m.job_id}` : ""}\n${clock(m.at)}${m.detail ? `\n${m.detail}` : ""}`;
    }
    if (item.type === "open-run") {
      const r = item.r;
      return `${r.kind} ${r.job_id}\nrunning now, T${r.tier}, ${r.model_id || ""}\n` +
        `${r.tokens} tokens so far${live.rate !== null ? `, ${live.rate.toFixed(1)} tokens/s` : ""}\n` +
        `started: ${this._why(r.job_id, item.start)}`;
    }
    if (item.type === "open-wait") {
      return `${item.kind} ${item.id}\nwaiting now in T${item.tier} since ${clock(item.start)}`;
    }
    const s = item.s;
    const span = `${fmtS(s.end - s.start, 3)} (${clock(s.start)} - ${clock(s.end)})`;
    if (s.lane === "wait") {
      return `${s.kind} ${s.job_id}\nwaited in T${s.tier}, ${span}\nended: ${STOPS[s.reason] || s.reason}`;
    }
    return `${s.kind} ${s.job_id}\nran ${span}, T${s.tier}, ${s.model_id}\n${s.tokens} tokens\n` +
      `started: ${this._why(s.job_id, s.start)}\nstopped: ${this._stop(s)}`;
  }

  _why(jobId, start) {
    const live = this.live;
    const near = (t) => Math.abs(t - start) < 0.005;
    const notes = live.marks.filter((m) => m.job_id === jobId && near(m.at) &&
                                           (m.what === "resume" || m.what === "swap"))
      .map((m) => (m.what === "resume" ? `resumed (${m.detail})` : `model swap (${m.detail})`));
    const wait = live.segments.find((s) => s.job_id === jobId && s.lane === "wait" && near(s.end));
    const head = wait ? `dispatched from T${wait.tier} after waiting ${fmtS(wait.end - wait.start, 3)}` : "dispatched";
    return [head, ...notes].join("; ");
  }

  _stop(s) {
    if (s.reason === "preempted") {
      const mark = [...this.live.marks].reverse().find((m) => m.what === "preempt" &&
        m.job_id === s.job_id && m.at <= s.end + 0.001 && m.at >= s.start - 0.001);
      return mark ? mark.detail : "preempted";
    }
    return STOPS[s.reason] || s.reason;
  }
}

export function windowButtons(root, timeline, initial) {
  const buttons = [...root.querySelectorAll("button[data-window]")];
  const pick = (seconds) => {
    timeline.setWindow(seconds);
    for (const b of buttons) b.classList.toggle("on", Number(b.dataset.window) === seconds);
  };
  for (const b of buttons) b.addEventListener("click", () => pick(Number(b.dataset.window)));
  pick(initial);
}
