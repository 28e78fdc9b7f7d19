// The chat: multi-turn, streamed from the OpenAI route (/v1/chat/completions, stream),
// as any client of the runtime would. Each answer gets its timings: queued and time to
// first token (the scheduler's), the time to first token this page saw, tokens/s, and
// how many background jobs it paused (the timeline's preempt marks made "for" it).
// Stop aborts the request; the gateway cancels the job when its client goes away.

import { postStream, sseEvents } from "./api.js";
import { el, fmtS, nowS } from "./util.js";

const SHOWN_KEPT = 8; // answers whose timings still follow the timeline

export class Chat {
  constructor(live, nodes) {
    this.live = live;
    this.n = nodes; // {form, prompt, send, stop, messages, model, system, maxTokens, newChat}
    this.history = [];
    this.abort = null;
    this.log = []; // every answer's timings (what the bench reads)
    this.n.form.addEventListener("submit", (e) => { e.preventDefault(); this.send(); });
    this.n.prompt.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); this.send(); }
    });
    this.n.stop.addEventListener("click", () => this.stop());
    this.n.newChat.addEventListener("click", () => this.reset());
    this.picked = false; // the user chose a model: the loaded one is no longer preferred
    this.n.model.addEventListener("change", () => { this.picked = true; });
    live.addEventListener("status", () => this._preferLoaded());
    // The preempt marks of a chat reach the page once it has its first token (the
    // scheduler holds its pushes until then), possibly after a short answer ended: the
    // recent answers' timings are redrawn as marks arrive.
    this.shown = []; // [record, timings node] of the last answers
    const redraw = () => { for (const [r, node] of this.shown) this._timings(r, node); };
    live.addEventListener("timeline", redraw);
    live.addEventListener("reset", redraw);
  }

  _preferLoaded() {
    const loaded = this.live.status && this.live.status.loaded_model;
    const select = this.n.model;
    if (!this.picked && loaded && select.value !== loaded &&
        [...select.options].some((o) => o.value === loaded)) select.value = loaded;
  }

  setModels(models, preferred) {
    const select = this.n.model;
    select.replaceChildren(...models.map((m) => el("option", { value: m }, m)));
    if (preferred && models.includes(preferred)) select.value = preferred;
    this._preferLoaded();
  }

  reset() {
    this.stop();
    this.history = [];
    this.shown = [];
    this.n.messages.replaceChildren();
  }

  stop() {
    if (this.abort) this.abort.abort();
  }

  _busy(on) {
    this.n.send.disabled = on;
    this.n.stop.hidden = !on;
  }

  async send() {
    const text = this.n.prompt.value.trim();
    if (!text || this.abort) return;
    const started = nowS();
    this.n.prompt.value = "";
    this.history.push({ role: "user", content: text });
    this.n.messages.querySelector(".hint")?.remove();
    this.n.messages.append(el("div", { class: "msg user" }, text));
    const bubble = el("div", { class: "msg assistant streaming" });
    const timing = el("div", { class: "timings" }, "waiting for the first token...");
    this.n.messages.append(bubble, timing);
    this._scroll();
    const jobId = `console-chat-${Math.random().toString(16).slice(2, 10)}`;
    const messages = [];
    const system = this.n.system.value.trim();
    if (system) messages.push({ role: "system", content: system });
    messages.push(...this.history);
    const maxTokens = Math.max(1, Number(this.n.maxTokens.value) || 256);
    const body = { model: this.n.model.value, messages, stream: true, max_tokens: maxTokens,
                   stream_options: { include_usage: true }, uniun: { job_id: jobId } };
    const record = { job_id: jobId, sent_at: started, first_token_at: null, done_at: null,
                     text: "", tokens: 0, info: null, usage: null, error: null, stopped: false };
    this.log.push(record);
    this.abort = new AbortController();
    this._busy(true);
    try {
      const response = await postStream("/v1/chat/completions", body, this.abort.signal);
      for await (const event of sseEvents(response)) {
        if (event === "[DONE]") break;
        if (event.error) { record.error = event.error.message || "error"; break; }
        const delta = event.choices && event.choices[0] && event.choices[0].delta;
        if (delta && delta.content) {
          if (record.first_token_at === null) {
            record.first_token_at = nowS();
            timing.textContent = "streaming...";
          }
          record.text += delta.content;
          record.tokens += 1;
          bubble.textContent = record.text;
          this._scroll();
        }
        if (event.uniun) record.info = event.uniun;
        if (event.usage) record.usage = event.usage;
      }
    } catch (err) {
      if (err.name === "AbortError") record.stopped = true;
      else record.error = err.message;
    } finally {
      this.abort = null;
      this._busy(false);
      record.done_at = nowS();
    }
    bubble.classList.remove("streaming");
    if (record.text) this.history.push({ role: "assistant", content: record.text });
    if (record.error) bubble.append(el("span", { class: "err" }, `${record.text ? "\n" : ""}${record.error}`));
    if (record.stopped) bubble.append(el("span", { class: "muted" }, " (stopped)"));
    this._timings(record, timing);
    this.shown = [...this.shown.slice(-(SHOWN_KEPT - 1)), [record, timing]];
  }

  /** Background jobs this chat paused: preempt marks whose detail names its job. */
  paused(jobId) {
    return this.live.marks.filter((m) => m.what === "preempt" &&
      String(m.detail || "").endsWith(` for ${jobId}`)).length;
  }

  _timings(record, node) {
    const t = (record.info && record.info.timings) || {};
    const parts = [];
    if (t.queued_s !== undefined && t.queued_s !== null) parts.push(`queued ${fmtS(t.queued_s, 3)}`);
    if (t.ttft_s !== undefined && t.ttft_s !== null) parts.push(`first token ${fmtS(t.ttft_s, 3)}`);
    if (record.first_token_at !== null) parts.push(`in this page ${fmtS(record.first_token_at - record.sent_at, 3)}`);
    const tokens = (record.usage && record.usage.completion_tokens) || record.tokens;
    const gen = t.total_s !== undefined && t.ttft_s !== undefined && t.total_s > t.ttft_s
      ? tokens / (t.total_s - t.ttft_s) : null;
    if (gen !== null && tokens > 1) parts.push(`${gen.toFixed(1)} tokens/s`);
    parts.push(`${tokens} tokens`);
    const paused = this.paused(record.job_id);
    record.paused = paused;
    parts.push(`paused ${paused} background job${paused === 1 ? "" : "s"}`);
    if (record.stopped) parts.push("stopped");
    node.textContent = parts.join(" \u00b7 ");
    node.title = record.job_id;
  }

  _scroll() {
    const box = this.n.messages;
    box.scrollTop = box.scrollHeight;
  }
}
