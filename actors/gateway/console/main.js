// The console's entry point: builds the panels over one live feed and starts it.

import { getJSON, onUnauthorized, setApiKey } from "./api.js";
import { Chat } from "./chat.js";
import { Control } from "./control.js";
import { Device } from "./device.js";
import { Live } from "./live.js";
import { Results } from "./results.js";
import { Timeline, windowButtons } from "./timeline.js";

const $ = (id) => document.getElementById(id);

const live = new Live();
const timeline = new Timeline($("timeline"), $("tip"), $("legend"), live);
windowButtons($("window-buttons"), timeline, window.innerWidth < 600 ? 30 : 120);
const control = new Control(live, {
  submitForm: $("submit-form"), kind: $("submit-kind"), prompt: $("submit-prompt"),
  tokens: $("submit-tokens"), submitOut: $("submit-out"), fg: $("fg-kind"),
  lifecycle: $("lifecycle"), cancelForm: $("cancel-form"), cancelId: $("cancel-id"),
  out: $("control-out"), chaosRun: $("chaos-run"), chaosState: $("chaos-state"),
});
const device = new Device(live, {
  running: $("running"), queues: $("queues"), parking: $("parking"),
  processes: $("processes"), counts: $("device-counts"),
}, (text) => { $("control-out").textContent = text; });
const chat = new Chat(live, {
  form: $("chat-form"), prompt: $("prompt"), send: $("send"), stop: $("stop"),
  messages: $("messages"), model: $("model"), system: $("system"),
  maxTokens: $("max-tokens"), newChat: $("new-chat"),
});
const results = new Results(live, {
  tabs: $("result-tabs"), list: $("result-list"), searchForm: $("search-form"),
  searchInput: $("search-input"),
});

function showLink() {
  const pill = $("link");
  const up = live.connected && live.link.up;
  pill.className = `pill ${up ? "up" : live.connected ? "down" : "wait"}`;
  pill.textContent = up ? "live" : live.connected ? live.link.reason : live.feedReason || "connecting";
  const s = live.status;
  $("summary").textContent = s
    ? `${s.loaded_model || "no model"} \u00b7 policy ${s.policy} \u00b7 app ${s.lifecycle}` +
      `${s.runner && s.runner.up ? "" : " \u00b7 no runner"}`
    : "";
}
live.addEventListener("link", showLink);
live.addEventListener("status", showLink);

async function loadModels() {
  try {
    const body = await getJSON("/v1/models");
    const decoders = (body.data || []).filter((m) => !m.uniun || m.uniun.kind !== "embedding").map((m) => m.id);
    chat.setModels(decoders, live.status && live.status.loaded_model);
  } catch (err) {
    $("messages").prepend(Object.assign(document.createElement("p"), { className: "bad", textContent: `models: ${err.message}` }));
  }
}

onUnauthorized(() => { $("key-form").hidden = false; });
live.addEventListener("unauthorized", () => { $("key-form").hidden = false; });
$("key-form").addEventListener("submit", (e) => {
  e.preventDefault();
  setApiKey($("key-input").value.trim());
  $("key-form").hidden = true;
  loadModels();
});

// For tests and the bench: the page's own record of what it showed and when.
window.uniunConsole = { live, timeline, chat, device, results, control };
loadModels();
live.start();
