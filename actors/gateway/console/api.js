// Talking to the gateway: JSON requests, the API key, and SSE read from a fetch stream.
//
// Every POST sends Content-Type: application/json (the gateway's door refuses any other
// body type). The feed is read with fetch() rather than EventSource because only fetch
// can send an Authorization header, which a runtime with an API key requires.

const KEY = "uniun-console-api-key";
const listeners = new Set();

export function apiKey() { return sessionStorage.getItem(KEY) || ""; }

export function setApiKey(key) {
  if (key) sessionStorage.setItem(KEY, key); else sessionStorage.removeItem(KEY);
}

/** Called with no argument when a request is refused for want of the API key. */
export function onUnauthorized(fn) { listeners.add(fn); }

export function headers(extra = {}) {
  const out = { ...extra };
  const key = apiKey();
  if (key) out.Authorization = `Bearer ${key}`;
  return out;
}

export class ApiError extends Error {
  constructor(status, body) {
    const err = (body && body.error) || {};
    super(err.message || `HTTP ${status}`);
    this.status = status;
    this.code = err.code || null;
    this.param = err.param || null;
  }
}

async function answer(response) {
  let body = null;
  try { body = await response.json(); } catch { body = null; }
  if (response.status === 401) listeners.forEach((fn) => fn());
  if (!response.ok) throw new ApiError(response.status, body);
  return body;
}

export async function getJSON(url, options = {}) {
  return answer(await fetch(url, { ...options, headers: headers(options.headers) }));
}

export async function postJSON(url, body, options = {}) {
  return answer(await fetch(url, {
    ...options, method: "POST", body: JSON.stringify(body ?? {}),
    headers: headers({ "Content-Type": "application/json", ...(options.headers || {}) }),
  }));
}

/** POST that returns the Response itself (for streams); refusals still throw ApiError. */
export async function postStream(url, body, signal) {
  const response = await fetch(url, {
    method: "POST", body: JSON.stringify(body), signal,
    headers: headers({ "Content-Type": "application/json", Accept: "text/event-stream" }),
  });
  if (!response.ok) await answer(response);
  return response;
}

/** The data of each SSE event of a streamed response: parsed JSON, or the raw text
 *  (e.g. "[DONE]"). Comments and other fields are skipped. */
export async function* sseEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
      const data = block.split(/\r?\n/).filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).replace(/^ /, "")).join("\n");
      if (!data) continue;
      try { yield JSON.parse(data); } catch { yield data; }
    }
  }
}
