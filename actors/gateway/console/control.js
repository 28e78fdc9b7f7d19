// Control: what the CLI does, as buttons. Submit a background job of a kind, cancel a
// job, set the foreground kind and the app's lifecycle, and run a chaos round against
// this runtime (its progress and verdict arrive on the live feed).

import { postJSON } from "./api.js";
import { el, fmtS } from "./util.js";

export class Control {
  constructor(live, n) {
    this.live = live;
    this.n = n; // {submitForm, kind, prompt, tokens, submitOut, fg, lifecycle, cancelForm, cancelId, out, chaosRun, chaosState}
    this.kinds = [];
    n.submitForm.addEventListener("submit", (e) => { e.preventDefault(); this.submit(); });
    n.cancelForm.addEventListener("submit", (e) => { e.preventDefault(); this.cancel(n.cancelId.value.trim()); });
    n.fg.addEventListener("change", () => this.foreground(n.fg.value || null));
    for (const b of n.lifecycle.querySelectorAll("button[data-state]")) {
      b.addEventListener("click", () => this.lifecycle(b.dataset.state));
    }
    n.chaosRun.addEventListener("click", () => this.chaos());
    live.addEventListener("reset", () => this._setup());
    live.addEventListener("status", () => this._state());
    live.addEventListener("chaos", (e) => this._chaos(e.detail));
  }

  _setup() {
    const c = this.live.console;
    const kinds = c.kinds || [];
    if (kinds.join() !== this.kinds.join()) {
      this.kinds = kinds;
      const bg = kinds.filter((k) => k !== c.chat_kind);
      this.n.kind.replaceChildren(...bg.map((k) => el("option", { value: k }, k)));
      if (bg.includes("nataraj")) this.n.kind.value = "nataraj";
      this.n.fg.replaceChildren(el("option", { value: "" }, "(none)"),
        ...kinds.map((k) => el("option", { value: k }, k)));
      this.n.tokens.max = String(c.max_tokens_cap || 4096);
    }
    this._state();
  }

  _state() {
    const s = this.live.status;
    if (!s) return;
    if (document.activeElement !== this.n.fg) this.n.fg.value = s.foreground || "";
    for (const b of this.n.lifecycle.querySelectorAll("button[data-state]")) {
      b.classList.toggle("on", b.dataset.state === s.lifecycle);
    }
  }

  _say(node, text, bad = false) {
    node.textContent = text;
    node.classList.toggle("bad", bad);
  }

  async submit() {
    const body = { kind: this.n.kind.value, prompt: this.n.prompt.value,
                   max_new_tokens: Number(this.n.tokens.value) || 256 };
    try {
      const r = await postJSON("/console/api/jobs", body);
      this._say(this.n.submitOut, `submitted ${r.job_id} (T${r.tier})`);
      this.n.cancelId.value = r.job_id;
      this.lastSubmitted = r.job_id;
    } catch (err) {
      this._say(this.n.submitOut, err.message, true);
    }
  }

  async cancel(jobId) {
    if (!jobId) return;
    try {
      await postJSON("/console/api/cancel", { job_id: jobId });
      this._say(this.n.out, `cancelled ${jobId}`);
    } catch (err) {
      this._say(this.n.out, `${jobId}: ${err.message}`, true);
    }
  }

  async foreground(kind) {
    try {
      await postJSON("/console/api/foreground", { kind });
      this._say(this.n.out, kind ? `foreground kind: ${kind}` : "no foreground kind");
    } catch (err) {
      this._say(this.n.out, err.message, true);
    }
  }

  async lifecycle(state) {
    try {
      await postJSON("/console/api/lifecycle", { state });
      this._say(this.n.out, `app in the ${state}`);
    } catch (err) {
      this._say(this.n.out, err.message, true);
    }
  }

  async chaos() {
    try {
      this._chaos(await postJSON("/console/api/chaos", {}));
    } catch (err) {
      this.n.chaosState.replaceChildren(el("p", { class: "bad" }, err.message));
    }
  }

  _chaos(view) {
    if (!view) return;
    const n = this.n;
    n.chaosRun.disabled = !view.enabled || view.state === "running";
    if (!view.enabled) {
      n.chaosState.replaceChildren(el("p", { class: "muted" }, `off: ${view.why_disabled}`));
      return;
    }
    const parts = [];
    if (view.state === "running") parts.push(el("p", {}, "running..."));
    if (view.state === "passed" || view.state === "failed") parts.push(verdict(view));
    if (view.lines && view.lines.length) parts.push(el("div", { class: "lines" }, view.lines.join("\n")));
    n.chaosState.replaceChildren(...parts);
  }
}

function verdict(view) {
  const v = view.verdict;
  if (!v) return el("p", { class: "bad" }, `FAIL: ${view.error || "no verdict"}`);
  const jobs = v.jobs || {};
  const rec = Object.entries(v.recovery_s || {}).map(([k, r]) => `${k} ${fmtS(r.p50, 2)}`).join(", ");
  return el("div", {},
    el("p", { class: v.ok ? "ok" : "bad" }, el("strong", {}, v.ok ? "PASS" : "FAIL"),
      ` ${v.faults_injected} fault${v.faults_injected === 1 ? "" : "s"} (${Object.keys(v.faults_by_kind || {}).join(", ")})`),
    el("dl", { class: "kv" },
      el("dt", {}, "jobs"), el("dd", {}, `${jobs.submitted ?? 0} submitted, ${jobs.completed ?? 0} completed, ${jobs.failed_as_allowed ?? 0} chats failed as allowed`),
      el("dt", {}, "lost / doubled"), el("dd", {}, `${jobs.lost ?? 0} / ${jobs.duplicated ?? 0}`),
      el("dt", {}, "texts differ"), el("dd", {}, String(jobs.text_differs ?? 0)),
      el("dt", {}, "token gaps"), el("dd", {}, String(jobs.token_gaps ?? 0)),
      el("dt", {}, "recovery"), el("dd", {}, rec || "-"),
      el("dt", {}, "runtime alive"), el("dd", {}, v.runtime_alive ? "yes" : "no")));
}
