// The timeline of the last minutes, drawn on a canvas: what `uniun-runtime trace export`
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
// Drawing is cheap and bounded: one canvas (no elements to build, lay out and paint one
// by one; hovering is a hit test over what was drawn), at most once per animation frame,
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
const waitY = (tier) => WAIT_Y + Math.min(4, Math.max(0, tier)) * (WAIT_H + WAIT_GAP);
const TIP_MARKS = 4; // marks one tip names at most (those under the pointer, nearest first)
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
    this.canvas = document.createElement("canvas");
    this.canvas.setAttribute("role", "img");
    this.canvas.setAttribute("aria-label", "runner timeline: what ran, what waited, preemptions");
    root.append(this.canvas);
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
    const g = this._context(width);
    const items = [];
    const kinds = new Set();
    const bg = cssVar("--bg");
    const muted = cssVar("--muted");
    g.font = "10px system-ui, sans-serif";
    g.fillStyle = bg;
    g.fillRect(LABEL_W, RUN_Y, plotW, RUN_H);
    for (let t = 0; t < 5; t += 1) g.fillRect(LABEL_W, waitY(t), plotW, WAIT_H);
    g.fillStyle = muted;
    g.fillText("runner", 2, RUN_Y + 17);
    for (let t = 0; t < 5; t += 1) g.fillText(`T${t} wait`, 2, waitY(t) + 8);
    const bar = (item, x0, width_, y, h, color, alpha) => {
      g.globalAlpha = alpha;
      g.fillStyle = color;
      g.fillRect(x0, y, width_, h);
      g.globalAlpha = 1;
      items.push({ ...item, x0, x1: x0 + width_, y0: y, y1: y + h });
    };
    // finished stretches
    for (const s of live.segments) {
      if (s.end < t0) continue;
      kinds.add(s.kind);
      if (s.lane === "run") {
        bar({ type: "segment", s }, x(s.start), w(s.start, s.end), RUN_Y, RUN_H, kindColor(s.kind), 1);
      } else {
        bar({ type: "segment", s }, x(s.start), w(s.start, s.end), waitY(s.tier), WAIT_H, kindColor(s.kind), 0.45);
      }
    }
    // what is open now: the running job, the waiting ones (from the status)
    const status = live.status;
    if (status && status.running && status.running.job_id) {
      const r = status.running;
      const start = this._openStart(r.job_id, "run");
      kinds.add(r.kind);
      bar({ type: "open-run", r, start }, x(start), w(start, now), RUN_Y, RUN_H, kindColor(r.kind), 0.8);
    }
    for (const [tierName, ids] of Object.entries((status && status.queues) || {})) {
      const tier = Number(String(tierName).slice(1)) || 0;
      for (const id of ids.slice(0, 50)) {
        const start = this._openStart(id, "wait");
        const kind = this._kindOf(id);
        bar({ type: "open-wait", id, tier, start, kind }, x(start), w(start, now), waitY(tier), WAIT_H, kindColor(kind), 0.35);
      }
    }
    // marks, over the bars
    const shown = [];
    for (const m of live.marks) {
      if (m.at < t0) continue;
      shown.push(m);
      const mx = x(m.at);
      const bottom = this._glyph(g, m, mx);
      items.push({ type: "mark", m, x0: mx - 5, x1: mx + 5, y0: MARK_Y, y1: bottom });
    }
    // axis: seconds before now
    const step = STEPS.find((s) => this.win / s <= Math.max(2, Math.floor(plotW / 60))) || 600;
    g.strokeStyle = cssVar("--line");
    g.lineWidth = 1;
    g.beginPath();
    g.moveTo(LABEL_W, AXIS_Y + 0.5);
    g.lineTo(LABEL_W + plotW, AXIS_Y + 0.5);
    g.fillStyle = muted;
    for (let ago = 0; ago <= this.win + 1e-9; ago += step) {
      const tx = Math.round(LABEL_W + plotW - (ago / this.win) * plotW) + 0.5;
      g.moveTo(tx, AXIS_Y);
      g.lineTo(tx, AXIS_Y + 4);
      g.textAlign = ago === 0 ? "right" : tx - LABEL_W < 20 ? "left" : "center";
      g.fillText(ago === 0 ? "now" : ago >= 60 ? `-${ago / 60} min` : `-${ago} s`, tx, AXIS_Y + 14);
    }
    g.stroke();
    g.textAlign = "left";
    this.items = items;
    this._recordDrawn(shown);
    this._legend(kinds);
  }

  /** The canvas's 2D context, sized to ``width`` CSS pixels at the screen's density and
   *  cleared. */
  _context(width) {
    const canvas = this.canvas;
    const dpr = window.devicePixelRatio || 1;
    if (canvas.width !== Math.round(width * dpr) || canvas.height !== Math.round(HEIGHT * dpr)) {
      canvas.width = Math.round(width * dpr);
      canvas.height = Math.round(HEIGHT * dpr);
      canvas.style.width = `${width}px`;
      canvas.style.height = `${HEIGHT}px`;
    }
    const g = canvas.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, width, HEIGHT);
    return g;
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

  /** A mark: its glyph in the top row and a dashed line down through the tracks it
   *  concerns; returns where the line ends. */
  _glyph(g, m, mx) {
    const color = cssVar(MARK_COLORS[m.what] || "--mark-proc");
    const top = MARK_Y;
    const bottom = RUN_Y + RUN_H + (m.what === "preempt" || m.what === "resume" ? 0 : 5 * (WAIT_H + WAIT_GAP) + 8);
    g.strokeStyle = color;
    g.fillStyle = color;
    g.lineWidth = 1.2;
    g.setLineDash([3, 2]);
    g.beginPath();
    g.moveTo(mx, top + 11);
    g.lineTo(mx, bottom);
    g.stroke();
    g.setLineDash([]);
    g.beginPath();
    switch (m.what) {
      case "preempt": g.moveTo(mx - 5, top); g.lineTo(mx + 5, top); g.lineTo(mx, top + 11); g.fill(); break;
      case "resume": g.moveTo(mx - 5, top + 11); g.lineTo(mx + 5, top + 11); g.lineTo(mx, top); g.fill(); break;
      case "swap": g.moveTo(mx, top); g.lineTo(mx + 5, top + 6); g.lineTo(mx, top + 12); g.lineTo(mx - 5, top + 6); g.fill(); break;
      case "runner_lost":
        g.lineWidth = 2.5;
        g.moveTo(mx - 4, top + 1); g.lineTo(mx + 4, top + 10); g.moveTo(mx + 4, top + 1); g.lineTo(mx - 4, top + 10);
        g.stroke();
        break;
      case "scheduler_start": g.fillRect(mx - 4, top + 1, 9, 9); break;
      default: g.arc(mx, top + 6, 4.5, 0, 2 * Math.PI); g.fill();
    }
    return bottom;
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

  /** The item drawn at this point of the canvas (CSS pixels): the nearest mark there,
   *  else the bar. */
  /** What lies under the pointer: every mark there, the nearest first (marks a few
   *  milliseconds apart, a preemption and its resume, share a pixel), else the bar. */
  itemsAt(px, py) {
    const marks = [];
    let bar = null;
    for (const item of this.items) {
      if (px < item.x0 || px > item.x1 || py < item.y0 || py > item.y1) continue;
      if (item.type === "mark") marks.push(item);
      else bar = bar || item;
    }
    const off = (item) => Math.abs(px - (item.x0 + item.x1) / 2);
    marks.sort((a, b) => off(a) - off(b));
    return marks.length ? marks.slice(0, TIP_MARKS) : bar ? [bar] : [];
  }

  _hover(event) {
    const box = this.canvas.getBoundingClientRect();
    const items = this.itemsAt(event.clientX - box.left, event.clientY - box.top);
    if (!items.length) { this.tip.hidden = true; return; }
    this.tip.textContent = items.map((item) => this.describe(item)).join("\n\n");
    this.tip.hidden = false;
    const tip = this.tip.getBoundingClientRect();
    const left = Math.min(event.clientX + 12, window.innerWidth - tip.width - 6);
    const top = event.clientY + 14 + tip.height > window.innerHeight
      ? event.clientY - tip.height - 10 : event.clientY + 14;
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
