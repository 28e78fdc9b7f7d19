// The live state of the runtime as the page knows it, fed by ONE stream from the gateway.
//
// GET /console/api/events is Server-Sent Events: first a snapshot (status, the timeline
// of the last minutes, result counts, the chaos round), then every state push of the
// scheduler's watch as it happens (timeline segments and marks, and the status when it
// changed, at most every 0.25 s). The page never polls status. When the stream breaks
// it reconnects (1 s, then up to 10 s apart) and the next snapshot replaces everything.
//
// Events dispatched: "reset" (a snapshot arrived), "status", "timeline" (detail: the new
// marks), "link", "results" (detail: counts), "chaos" (detail: the round's view).

import { headers, sseEvents } from "./api.js";
import { nowS } from "./util.js";

const segKey = (s) => `${s.job_id}|${s.lane}|${Number(s.start).toFixed(6)}`;
const markKey = (m) => `${m.what}|${m.job_id}|${Number(m.at).toFixed(6)}`;

export class Live extends EventTarget {
  constructor() {
    super();
    this.status = null;
    this.segments = [];
    this.marks = [];
    this.keys = new Set();
    this.windowS = 600;
    this.link = { up: false, reason: "connecting" };
    this.connected = false;
    this.results = {};
    this.chaos = null;
    this.console = { kinds: [], chat_kind: "chat", max_tokens_cap: 4096, tiers: [] };
    this.skews = [];
    this.skew = 0; // server clock minus this page's clock, seconds
    this.rate = null; // tokens/s of the running job
    this._rate = null;
    this.restarts = {};
    this.firstSeen = new Map(); // job id -> when the page first saw it running or queued
  }

  /** The scheduler's clock now (the page's clock corrected by the observed skew). */
  now() { return nowS() + this.skew; }

  async start() {
    let backoff = 1000;
    for (;;) {
      const abort = new AbortController();
      try {
        const response = await fetch("/console/api/events", { headers: headers(), signal: abort.signal });
        if (response.status === 401) {
          this._setConnected(false, "API key needed");
          this.dispatchEvent(new Event("unauthorized"));
        } else if (!response.ok) {
          this._setConnected(false, `feed refused (${response.status})`);
        } else {
          backoff = 1000;
          this._setConnected(true, "live");
          for await (const event of sseEvents(response)) this.handle(event);
          this._setConnected(false, "feed ended; reconnecting");
        }
      } catch (err) {
        this._setConnected(false, "feed lost; reconnecting");
      }
      abort.abort();
      await new Promise((r) => setTimeout(r, backoff));
      backoff = Math.min(backoff * 2, 10000);
    }
  }

  _setConnected(up, reason) {
    this.connected = up;
    this.feedReason = reason;
    this.dispatchEvent(new Event("link"));
  }

  _clock(serverTime) {
    if (typeof serverTime !== "number") return;
    // The server's stamp is when the gateway received the push; the page sees it later.
    // The largest (server - page) of the recent ones has the least transit in it.
    this.skews.push(serverTime - nowS());
    if (this.skews.length > 30) this.skews.shift();
    this.skew = Math.max(...this.skews);
  }

  handle(event) {
    if (!event || typeof event !== "object") return;
    this._clock(event.server_time);
    switch (event.type) {
      case "snapshot": return this._snapshot(event);
      case "state": return this._state(event);
      case "link":
        this.link = { up: event.up, reason: event.reason };
        return this.dispatchEvent(new Event("link"));
      case "results":
        this.results = event.counts || {};
        return this.dispatchEvent(new CustomEvent("results", { detail: this.results }));
      case "chaos":
        this.chaos = event;
        return this.dispatchEvent(new CustomEvent("chaos", { detail: event }));
      default: return undefined;
    }
  }

  _snapshot(event) {
    this.windowS = event.window_s || this.windowS;
    this.segments = [];
    this.marks = [];
    this.keys = new Set();
    this._add(event.segments || [], event.marks || []);
    this.link = event.link || this.link;
    this.results = event.results || {};
    this.chaos = event.chaos || null;
    if (event.console) this.console = event.console;
    this.status = null;
    if (event.status) this._setStatus(event.status);
    this.dispatchEvent(new Event("reset"));
    this.dispatchEvent(new Event("link"));
    this.dispatchEvent(new CustomEvent("results", { detail: this.results }));
    if (this.chaos) this.dispatchEvent(new CustomEvent("chaos", { detail: this.chaos }));
  }

  _state(event) {
    if (event.status) this._setStatus(event.status);
    const fresh = this._add(event.segments || [], event.marks || []);
    if (fresh.segments.length || fresh.marks.length) {
      this.dispatchEvent(new CustomEvent("timeline", { detail: fresh }));
    }
  }

  _add(segments, marks) {
    const fresh = { segments: [], marks: [] };
    for (const s of segments) {
      const key = segKey(s);
      if (this.keys.has(key)) continue;
      this.keys.add(key);
      this.segments.push(s);
      fresh.segments.push(s);
    }
    for (const m of marks) {
      const key = markKey(m);
      if (this.keys.has(key)) continue;
      this.keys.add(key);
      m.received = nowS();
      this.marks.push(m);
      fresh.marks.push(m);
    }
    if (fresh.segments.length) this.segments.sort((a, b) => a.start - b.start);
    if (fresh.marks.length) this.marks.sort((a, b) => a.at - b.at);
    this._trim();
    return fresh;
  }

  _trim() {
    const low = this.now() - this.windowS;
    if (this.segments.length > 200 && this.segments[0].end < low) {
      this.segments = this.segments.filter((s) => s.end >= low);
    }
    if (this.marks.length > 200 && this.marks[0].at < low) {
      this.marks = this.marks.filter((m) => m.at >= low);
    }
    if (this.keys.size > 20000) {
      this.keys = new Set([...this.segments.map(segKey), ...this.marks.map(markKey)]);
    }
  }

  _setStatus(status) {
    const now = this.now();
    const run = status.running;
    if (run && run.job_id) {
      const last = this._rate;
      if (last && last.job === run.job_id && now - last.at >= 0.5) {
        this.rate = Math.max(0, (run.tokens - last.tokens) / (now - last.at));
        this._rate = { job: run.job_id, tokens: run.tokens, at: now };
      } else if (!last || last.job !== run.job_id) {
        this.rate = null;
        this._rate = { job: run.job_id, tokens: run.tokens, at: now };
      }
      if (!this.firstSeen.has(run.job_id)) this.firstSeen.set(run.job_id, now);
    } else {
      this.rate = null;
      this._rate = null;
    }
    const seen = new Set(run && run.job_id ? [run.job_id] : []);
    for (const ids of Object.values(status.queues || {})) {
      for (const id of ids) {
        seen.add(id);
        if (!this.firstSeen.has(id)) this.firstSeen.set(id, now);
      }
    }
    for (const id of [...this.firstSeen.keys()]) if (!seen.has(id)) this.firstSeen.delete(id);
    // A process whose restart count went up: a mark of our own on the timeline.
    for (const [name, info] of Object.entries(status.process_info || {})) {
      const count = Number((info || {}).restarts || 0);
      if (this.restarts[name] !== undefined && count > this.restarts[name]) {
        const fresh = this._add([], [{ what: "restart", at: now, job_id: null,
          detail: `${name} (restart #${count})` }]);
        this.dispatchEvent(new CustomEvent("timeline", { detail: fresh }));
      }
      this.restarts[name] = count;
    }
    this.status = status;
    this.dispatchEvent(new Event("status"));
  }
}
