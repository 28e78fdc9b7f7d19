// The device panels, from the status the scheduler pushes: the running job, the queue of
// each tier, parked snapshots with the T2 budget and the fair pool's vruntimes, and the
// runtime's processes. A card is rebuilt only when what it shows changed (a status
// arrives at most 4 times a second), the processes' CPU and memory at most every 2 s: the
// page shares the machine with the runtime it shows.

import { postJSON } from "./api.js";
import { el, fmtBytes, kindColor } from "./util.js";

const SHOWN_IDS = 4; // job ids listed per tier
const PROCESS_EVERY_MS = 2000; // the processes' CPU and RSS are redrawn at most this often

export class Device {
  constructor(live, nodes, onError) {
    this.live = live;
    this.nodes = nodes; // {running, queues, parking, processes, counts}
    this.onError = onError;
    this.shown = {}; // card -> what it shows now (its signature)
    this.processesAt = 0;
    live.addEventListener("status", () => this.render());
    live.addEventListener("reset", () => this.render());
  }

  async cancel(jobId) {
    try {
      await postJSON("/console/api/cancel", { job_id: jobId });
    } catch (err) {
      this.onError(`cancel ${jobId}: ${err.message}`);
    }
  }

  _cancelButton(jobId) {
    return el("button", { class: "x", type: "button", title: `cancel ${jobId}`,
                          "aria-label": `cancel ${jobId}`, onclick: () => this.cancel(jobId) }, "\u00d7");
  }

  _card(name, signature, build) {
    if (this.shown[name] === signature) return;
    this.shown[name] = signature;
    this.nodes[name].replaceChildren(...build());
  }

  render() {
    const s = this.live.status;
    if (!s) return;
    const n = this.nodes;
    const counts = `${s.jobs} jobs live, ${s.preemptions} preemptions, ${s.swaps} swaps`;
    if (n.counts.textContent !== counts) n.counts.textContent = counts;
    const rate = this.live.rate === null ? null : this.live.rate.toFixed(1);
    this._card("running", JSON.stringify([s.running, rate, s.runner && s.runner.up, s.loaded_model]),
               () => this._running(s));
    this._card("queues", JSON.stringify([s.queues, s.held, s.foreground, s.lifecycle, s.dead_letters,
                                         s.power]),
               () => this._queues(s));
    this._card("parking", JSON.stringify([s.snapshots, s.parking, s.t2_share, s.t2_share_max,
                                          s.t2_blocked, s.vruntime, s.min_vruntime]),
               () => this._parking(s));
    const procs = Object.entries(s.process_info || {}).map(([k, p]) => [k, p.pid, p.restarts]);
    const now = performance.now();
    const moved = JSON.stringify(procs) !== this.shownProcs;
    if (moved || now - this.processesAt >= PROCESS_EVERY_MS) {
      this.shownProcs = JSON.stringify(procs);
      this.processesAt = now;
      this._card("processes", JSON.stringify(s.process_info), () => this._processes(s));
    }
  }

  _running(s) {
    const r = s.running;
    const head = el("h3", {}, "Running");
    if (!r) {
      const why = s.runner && !s.runner.up ? "no runner connected" : "idle";
      return [head, el("p", { class: "muted" }, why)];
    }
    const badge = el("span", { class: "badge" }, r.kind);
    badge.style.background = kindColor(r.kind);
    const rate = this.live.rate;
    return [head,
      el("div", { class: "row" }, badge, el("code", {}, r.job_id), this._cancelButton(r.job_id)),
      el("dl", { class: "kv" },
        el("dt", {}, "tier"), el("dd", {}, `T${r.tier}`),
        el("dt", {}, "tokens"), el("dd", { "data-testid": "running-tokens" }, String(r.tokens)),
        el("dt", {}, "tokens/s"), el("dd", {}, rate === null ? "-" : rate.toFixed(1)),
        el("dt", {}, "model"), el("dd", {}, r.model_id || s.loaded_model || "-"),
        el("dt", {}, "runner time"), el("dd", {}, `${Number(r.runner_s || 0).toFixed(2)} s`),
        r.stopping ? [el("dt", {}, "stopping"), el("dd", {}, r.stopping)] : null)];
  }

  _queues(s) {
    // The tiers' names and labels come from the server (actors/policy/tiers.py).
    const rows = (this.live.console.tiers || []).map(({ name, label }) => {
      const ids = (s.queues || {})[name] || [];
      const held = new Set(s.held || []);
      return el("div", { class: "tier" }, el("span", {}, label), el("strong", {}, String(ids.length)),
        el("span", { class: "ids" }, ids.slice(0, SHOWN_IDS).map((id) =>
          el("span", { class: "jobid", title: held.has(id) ? "held by the background governor" : id },
            held.has(id) ? `${id} (held)` : id, this._cancelButton(id))),
          ids.length > SHOWN_IDS ? el("span", { class: "muted" }, `+${ids.length - SHOWN_IDS}`) : null));
    });
    const fg = s.foreground ? `foreground kind: ${s.foreground}` : "no foreground kind";
    return [el("h3", {}, "Queues"), ...rows, el("p", { class: "muted" }, `${fg}; app ${s.lifecycle}`),
      this._power(s.power), this._deadLetters(s.dead_letters)];
  }

  // The device's power facts and what the governor lets background work do
  // (docs/device.md, "Power and heat"); chat is never throttled by them.
  _power(p) {
    if (!p) return null;
    const where = p.on_battery === null ? "power unknown" : p.on_battery ? "on battery" : "on the charger";
    const level = p.percent === null ? "" : ` ${Math.round(p.percent)} %`;
    return el("p", { class: "muted", "data-testid": "power" },
      `${where}${level}, ${p.thermal || "thermal unknown"}; background ${p.mode} (${p.reason})`);
  }

  // Accepted jobs a restart could not bring back (a kind no longer configured, an
  // unreadable journal row): kept aside in the journal, never run. Absent while none.
  _deadLetters(dead) {
    if (!dead || !dead.count) return null;
    return el("div", { class: "dead-letters", "data-testid": "dead-letters" },
      el("strong", {}, `${dead.count} dead letter${dead.count === 1 ? "" : "s"}`),
      (dead.recent || []).map((d) => el("p", { class: "muted" }, el("code", {}, d.job_id), ` ${d.reason}`)));
  }

  _parking(s) {
    const snaps = s.snapshots || {};
    const park = s.parking || {};
    const share = Number(s.t2_share || 0);
    const max = Number(s.t2_share_max || 1);
    const bar = el("div", { class: `bar${s.t2_blocked ? " blocked" : ""}`,
                            title: `T2 share ${(share * 100).toFixed(0)}% of at most ${(max * 100).toFixed(0)}%` },
                   el("span"));
    bar.firstChild.style.width = `${Math.min(100, (share / max) * 100)}%`;
    const flows = Object.entries(s.vruntime || {});
    const low = Number(s.min_vruntime || 0);
    const top = Math.max(1e-9, ...flows.map(([, v]) => Number(v) - low));
    const flowRows = flows.flatMap(([flow, v]) => {
      const b = el("div", { class: "bar" }, el("span"));
      b.firstChild.style.width = `${Math.max(2, ((Number(v) - low) / top) * 100)}%`;
      b.firstChild.style.background = kindColor(flow);
      return [el("span", {}, flow), b, el("span", { class: "mono" }, Number(v).toFixed(2))];
    });
    return [el("h3", {}, "Parked snapshots and budgets"),
      el("dl", { class: "kv" },
        el("dt", {}, "parked"), el("dd", {}, `${snaps.count ?? 0} snapshots, ${fmtBytes(snaps.bytes ?? 0)}`),
        el("dt", {}, "spilled"), el("dd", {}, `${park.spilled ?? 0} to disk, ${park.trimmed ?? 0} trimmed (since start)`),
        el("dt", {}, "T2 budget"), el("dd", {}, `${(share * 100).toFixed(0)}% of ${(max * 100).toFixed(0)}%${s.t2_blocked ? ", blocked" : ""}`)),
      bar,
      el("h3", {}, "Fair pool vruntime (runner s)"),
      flows.length ? el("div", { class: "flows" }, flowRows) : el("p", { class: "muted" }, "no flows yet")];
  }

  _processes(s) {
    const info = s.process_info || {};
    const rows = Object.entries(info).sort(([a], [b]) => a.localeCompare(b)).map(([name, p]) =>
      el("tr", {}, el("td", {}, name), el("td", {}, String(p.pid ?? "-")),
        el("td", {}, p.cpu_percent === null || p.cpu_percent === undefined ? "-" : `${Number(p.cpu_percent).toFixed(0)}%`),
        el("td", {}, fmtBytes(p.rss_bytes)), el("td", {}, String(p.restarts ?? 0))));
    return [el("h3", {}, "Processes"),
      el("table", { class: "procs" },
        el("thead", {}, el("tr", {}, ["process", "pid", "CPU", "RSS", "restarts"].map((h) => el("th", {}, h)))),
        el("tbody", {}, rows))];
  }
}
