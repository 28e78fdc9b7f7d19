// What the background work made: knowledge per note (entities, relations), Nataraj's
// cards, Gana runs with their outputs, and semantic search over the notes. The list is
// fetched when its tab opens and again when the feed says the store's counts changed
// (the gateway looks after a background job ended), never on a timer.

import { getJSON, postJSON } from "./api.js";
import { clock, el, fmtS } from "./util.js";

export class Results {
  constructor(live, nodes) {
    this.live = live;
    this.n = nodes; // {tabs, list, searchForm, searchInput}
    this.kind = "knowledge";
    this.counts = {};
    this.loading = null;
    for (const b of this.n.tabs.querySelectorAll("button[data-kind]")) {
      b.addEventListener("click", () => this.show(b.dataset.kind));
    }
    this.n.searchForm.addEventListener("submit", (e) => { e.preventDefault(); this.search(); });
    live.addEventListener("results", (e) => this._changed(e.detail || {}));
    this.show("knowledge");
  }

  _changed(counts) {
    const before = this.counts[this.kind];
    this.counts = { ...counts };
    if (this.kind !== "search" && counts[this.kind] !== before) this.load();
  }

  show(kind) {
    this.kind = kind;
    for (const b of this.n.tabs.querySelectorAll("button[data-kind]")) {
      b.classList.toggle("on", b.dataset.kind === kind);
    }
    this.n.searchForm.hidden = kind !== "search";
    if (kind === "search") {
      this.n.list.replaceChildren(el("p", { class: "muted" }, "Find notes by meaning; each hit shows the knowledge extracted from it."));
    } else {
      this.load();
    }
  }

  async load() {
    const kind = this.kind;
    try {
      const body = await getJSON(`/console/api/results?kind=${kind}&limit=30`);
      if (kind !== this.kind) return;
      const items = body.items || [];
      this.n.list.replaceChildren(...(items.length ? items.map((it) => this._item(it))
        : [el("p", { class: "muted" }, `No ${kind === "card" ? "cards" : kind === "gana" ? "Gana runs" : "knowledge"} yet: the producers write here as their background jobs finish.`)]));
    } catch (err) {
      this.n.list.replaceChildren(el("p", { class: "bad" }, err.message));
    }
  }

  _item(it) {
    if (it.kind === "knowledge") return knowledgeItem(it.note_path, it.parsed, it);
    if (it.kind === "card") {
      return el("div", { class: "result" },
        el("div", { class: "head" }, el("strong", {}, it.topic || "card"), el("span", {}, clock(it.at)),
          it.consumed_at ? el("span", {}, "taken") : null),
        el("div", { class: "text" }, it.text || ""));
    }
    return el("div", { class: "result" },
      el("div", { class: "head" }, el("strong", {}, it.gana_id || "gana"), el("span", {}, `via ${it.runner || "-"}`),
        el("span", {}, it.finish_reason || ""), el("span", {}, fmtS(it.total_s)),
        el("span", {}, `${it.preemptions ?? 0} preemptions`), el("span", {}, clock(it.at))),
      el("div", { class: "text" }, it.text || ""));
  }

  async search() {
    const query = this.n.searchInput.value.trim();
    if (!query) return;
    this.n.list.replaceChildren(el("p", { class: "muted" }, "searching..."));
    try {
      const body = await postJSON("/console/api/search", { query, k: 8 });
      const hits = body.hits || [];
      this.n.list.replaceChildren(...(hits.length
        ? hits.map((h) => knowledgeItem(h.note_path, h.knowledge, null, h.score))
        : [el("p", { class: "muted" }, body.reason || "no notes")]));
    } catch (err) {
      this.n.list.replaceChildren(el("p", { class: "bad" }, err.message));
    }
  }
}

function knowledgeItem(path, parsed, row, score) {
  const head = el("div", { class: "head" }, el("strong", {}, path),
    score !== undefined ? el("span", {}, `score ${score.toFixed(3)}`) : null,
    row ? el("span", {}, clock(row.at)) : null);
  if (!parsed || typeof parsed !== "object") {
    const why = row && row.parse_error ? `not parsed: ${row.parse_error}` : "no knowledge extracted yet";
    return el("div", { class: "result" }, head, el("div", { class: "muted" }, why));
  }
  const entities = (parsed.entities || []).map((e) =>
    el("span", { class: "chip", title: e.type || "" }, e.name || String(e)));
  const relations = (parsed.relations || []).slice(0, 12).map((r) =>
    el("div", { class: "rel" }, `${r.source ?? r.subject ?? "?"} \u2192 ${r.relation ?? r.type ?? r.predicate ?? "?"} \u2192 ${r.target ?? r.object ?? "?"}`));
  return el("div", { class: "result" }, head, el("div", { class: "chips" }, entities), relations);
}
