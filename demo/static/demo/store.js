/*
 * The demo store in the browser: the page's tools, moving between pages
 * without dropping the assistant's socket, and the chat panel.
 *
 * Every page is a Django template. Links inside the store and the tools that
 * navigate fetch the next page and swap its <main> in (history.pushState), so
 * the AITP connection stays open: a tool that opens a product answers only
 * after the new page's tools and context are sent (the client flushes its
 * CONTEXT_UPDATE before the TOOL_RESULT).
 *
 * The chat panel itself (entries, Markdown, the kept transcript, the
 * launcher) is chat.js; this module tells it what happens.
 *
 * A reload or a lost connection in the middle of an answer does not cut
 * it: the session goes on, the client is sent the frames it missed, and
 * the answer goes on in the bubble it was being written in (each step is
 * saved as it is shown, so the kept transcript and the client's last
 * handled frame agree). A tool call the page had not run yet is run once,
 * after the reload. When the connection does not take up where it was (a
 * new session), the answer stays as far as it got.
 *
 * A question sent just before a reload or a drop is shown once and
 * answered once: when the session goes on, the client sends it again only
 * if the server never took it. When the session does not go on, a note
 * says the question was not answered (or its answer was cut off) and puts
 * it back in the input, to ask again.
 *
 * Voice, when the server offers it: the microphone button starts an
 * utterance and sends it on the second click; what the assistant heard
 * becomes the shopper's bubble, its answer is spoken and written, and
 * talking over it (or clicking the button) cuts it off, which its bubble
 * then shows.
 */
import { OwlLayerClient, showApprovalDialog } from "../owllayer/owllayer-client.js";
import { ChatPanel } from "./chat.js";

const config = JSON.parse(document.getElementById("owl-demo-config").textContent);
const csrfToken = document.querySelector("input[name=csrfmiddlewaretoken]").value;
let page = readPage(document);

function readPage(doc) {
  return JSON.parse(doc.getElementById("owl-page").textContent);
}

function productUrl(id) {
  return config.urls.product.replace("__slug__", encodeURIComponent(id));
}

function money(amount) {
  return "$" + amount.toFixed(2);
}

// --- the cart API (the same one the page's buttons use) ----------------------

async function cartAction(action, body) {
  const response = await fetch(config.urls.api.replace("__action__", action), {
    method: "POST",
    headers: { "Content-Type": "application/json", "X-CSRFToken": csrfToken },
    credentials: "same-origin",
    body: JSON.stringify(body),
  });
  let data;
  try {
    data = await response.json();
  } catch (err) {
    throw new Error("The store did not answer (" + response.status + ").");
  }
  if (!response.ok) throw new Error(data.error || "The store refused (" + response.status + ").");
  return data;
}

// --- moving between pages -------------------------------------------------------

function isStoreUrl(url) {
  return url.origin === window.location.origin && url.pathname.startsWith(config.urls.home) &&
    !url.pathname.startsWith(config.urls.api.replace("__action__", ""));
}

/* Show another store page in place; resolves once the assistant knows about it. */
async function visit(href, { push = true } = {}) {
  const url = new URL(href, window.location.href);
  const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } });
  if (!response.ok) throw new Error("That page does not exist (" + response.status + ").");
  const doc = new DOMParser().parseFromString(await response.text(), "text/html");
  const view = doc.getElementById("view");
  if (!view || !doc.getElementById("owl-page")) throw new Error("That is not a store page.");
  if (push && url.href !== window.location.href) window.history.pushState({}, "", url.href);
  document.title = doc.title;
  document.getElementById("view").replaceWith(document.adoptNode(view));
  document.getElementById("cart-count").textContent = doc.getElementById("cart-count").textContent;
  page = readPage(document);
  syncAssistant();
  window.scrollTo(0, 0);
  return { url: url.pathname, title: doc.title };
}

/* Redraw the current page after the cart changed. */
function refresh() {
  return visit(window.location.href, { push: false });
}

window.addEventListener("popstate", () => {
  visit(window.location.href, { push: false }).catch(() => window.location.reload());
});

document.addEventListener("click", (event) => {
  const link = event.target.closest("a[href]");
  if (!link || event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
  const url = new URL(link.href, window.location.href);
  if (!isStoreUrl(url)) return;
  event.preventDefault();
  visit(url.href).catch(() => window.location.assign(url.href));
});

// The page's own buttons and forms.
document.addEventListener("submit", (event) => {
  const form = event.target.closest("form[data-action]");
  if (!form) return;
  event.preventDefault();
  const fields = new FormData(form);
  if (form.dataset.action === "add") {
    act(() => cartAction("add", { productId: form.dataset.product, quantity: Number(fields.get("quantity")) }));
  } else if (form.dataset.action === "coupon") {
    act(() => cartAction("coupon", { code: String(fields.get("code") || "") }));
  }
});

document.addEventListener("change", (event) => {
  const input = event.target.closest("input[data-action=quantity]");
  if (input) act(() => cartAction("quantity", { productId: input.dataset.product, quantity: Number(input.value) }));
});

document.addEventListener("click", (event) => {
  const button = event.target.closest("button[data-action=pay]");
  // A person clicking Pay is the approval: no dialog.
  if (button) act(() => cartAction("pay", { amount: Number(button.dataset.amount) }));
});

async function act(change) {
  try {
    await change();
  } catch (err) {
    showMessage("error", err.message);
  }
  await refresh();
}

// --- the page's tools ---------------------------------------------------------------

const NUMBER = (description) => ({ type: "NUMBER", description });
const STRING = (description, extra) => ({ type: "STRING", description, ...extra });

/* name -> [declaration, handler, label shown while it runs] */
const TOOLS = {
  open_product: [{
    name: "open_product",
    description: "Open a product's page in the store. Products: " +
      config.products.map((p) => p.id + " (" + p.name + ")").join(", "),
    parameters: {
      type: "OBJECT",
      properties: { productId: STRING("The product's id", { enum: config.products.map((p) => p.id) }) },
      required: ["productId"],
    },
    risk: "none",
  }, (args) => visit(productUrl(args.productId)), "Opening a product page"],
  open_cart: [{
    name: "open_cart",
    description: "Open the shopping cart page (to review it, apply a coupon or pay)",
    parameters: { type: "OBJECT", properties: {} },
    risk: "none",
  }, () => visit(config.urls.cart), "Opening your cart"],
  add_to_cart: [{
    name: "add_to_cart",
    description: "Add the product on this page to the shopping cart",
    parameters: {
      type: "OBJECT",
      properties: { quantity: NUMBER("How many to add (1-99)") },
      required: ["quantity"],
    },
    risk: "low",
  }, (args) => changeCart("add", { productId: page.context.productId, quantity: args.quantity }),
  "Adding to your cart"],
  set_quantity: [{
    name: "set_quantity",
    description: "Set how many of a product are in the cart (0 removes it)",
    parameters: {
      type: "OBJECT",
      properties: {
        productId: STRING("The product's id", { enum: config.products.map((p) => p.id) }),
        quantity: NUMBER("The new quantity (0-99)"),
      },
      required: ["productId", "quantity"],
    },
    risk: "low",
  }, (args) => changeCart("quantity", args), "Updating your cart"],
  apply_coupon: [{
    name: "apply_coupon",
    description: "Apply a coupon code to the cart",
    parameters: { type: "OBJECT", properties: { code: STRING("The coupon code") }, required: ["code"] },
    risk: "low",
  }, (args) => changeCart("coupon", { code: args.code }), "Applying the coupon"],
  process_payment: [{
    name: "process_payment",
    description: "Pay for the cart with the customer's saved card. The amount must equal the cart " +
      "total in USD. The customer is asked to approve first.",
    parameters: {
      type: "OBJECT",
      properties: { amount: NUMBER("The amount to charge in USD: the cart total") },
      required: ["amount"],
    },
    risk: "critical",
    approvalMessage: (args) => "Pay " + money(args.amount) + " with your saved card?",
  }, (args) => changeCart("pay", { amount: args.amount }), "Paying"],
};

/* Change the cart, redraw the page (so the agent sees the new context), report. */
async function changeCart(action, body) {
  const outcome = await cartAction(action, body);
  await refresh();
  return outcome;
}

// --- the assistant ----------------------------------------------------------------------

const chat = new ChatPanel();
const statusBadge = document.getElementById("owl-status");
const activityLine = document.getElementById("owl-activity");
const form = document.getElementById("owl-form");
const input = document.getElementById("owl-input");
const sendButton = document.getElementById("owl-send");
const micButton = document.getElementById("owl-mic");

let client = null;
// The answer of this turn being written, and how much of the turn's text
// (the client reports all of it) earlier bubbles of the turn already show.
let agentEntry = null;
let shownBefore = 0;
let turnText = "";
// Tool lines of this turn that failed: their reason is left out when the
// answer already says it.
let turnFailures = [];
const toolEntries = new Map();
// The voice turn: the bubble of what was heard, the turn's last answer
// bubble (a cut may come after its text is complete) and what was said aloud.
let heardEntry = null;
let spokenAnswer = null;
let spokenText = "";
let lastActivity = { activity: "idle" };

function showMessage(kind, text, options) {
  const entry = chat.add({ kind, text }, options);
  chat.save();
  return entry;
}

// Everything changed here in one go leaves as one CONTEXT_UPDATE.
function syncAssistant() {
  if (!client) return;
  const wanted = page.tools.filter((name) => name in TOOLS);
  Object.keys(client.tools).forEach((name) => {
    if (!wanted.includes(name)) client.unregisterTool(name);
  });
  wanted.forEach((name) => {
    if (!(name in client.tools)) client.registerTool(TOOLS[name][0], TOOLS[name][1]);
  });
  client.setContext(page.context);
  client.pageChanged();
}

// Plain words for what the server's error codes mean to a shopper.
const PLAIN_ERRORS = {
  turn_in_progress: "I'm still working on your last message. Please wait for my answer.",
  input_too_long: "That message is too long for me. Please shorten it.",
  rate_limited: "I'm getting too many requests right now. Please try again in a moment.",
  overloaded: "I'm very busy right now. Please try again in a moment.",
  timeout: "I took too long to answer. Please try again.",
  unreachable: "I can't reach my language model right now. Please try again later.",
  upstream_error: "Something went wrong on my side. Please try again.",
  tool_timeout: "The page took too long to do what I asked.",
  approval_expired: "Nobody answered the approval in time, so I did not go ahead.",
  session_limit: "Too many people are using this assistant right now. Please try again later.",
  invalid_api_key: "This store's assistant key is not valid, so the assistant is off.",
  api_key_revoked: "This store's assistant key was revoked, so the assistant is off.",
  api_key_disabled: "This store's assistant key is disabled, so the assistant is off.",
  api_key_expired: "This store's assistant key has expired, so the assistant is off.",
  origin_not_allowed: "This page's origin is not allowed to use the assistant key.",
  internal_error: "Something went wrong on the server. Please try again.",
  // Voice.
  microphone: "I can't use your microphone (the browser refused it or there is none). You can type instead.",
  empty_audio: "I didn't hear anything. Please try again.",
  audio_too_large: "That was too long for me to listen to. Please say it in fewer words.",
  speech_failed: "I couldn't make out what you said. Please try again, or type it.",
  speech_timeout: "Understanding what you said took too long. Please try again.",
  speech_busy: "I'm listening to too many people right now. Please try again in a moment.",
  speech_unavailable: "Voice isn't working on my side right now. Please type instead.",
};

// The demo's own key (.demo-key, from make run) refused: `make run` makes a
// new one when the saved one no longer works, allowing the same ports.
const DEMO_KEY_REFUSALS = {
  invalid_api_key: "This demo's key is not in this server's database",
  api_key_revoked: "This demo's key was revoked",
  api_key_disabled: "This demo's key is disabled",
  api_key_expired: "This demo's key has expired",
};
const NEW_DEMO_KEY = ", so the assistant is off. To get a new key, stop the server (Ctrl-C where " +
  "make run is running) and run make run again, then reload this page.";

function plainError(event) {
  const code = event.data && event.data.code;
  if (config.demoKey && Object.hasOwn(DEMO_KEY_REFUSALS, code)) {
    return DEMO_KEY_REFUSALS[code] + NEW_DEMO_KEY;
  }
  return (code && PLAIN_ERRORS[code]) || event.message || "Something went wrong.";
}

function describeArgs(args) {
  const parts = Object.keys(args).map((key) => key + " " + JSON.stringify(args[key]));
  return parts.length ? " (" + parts.join(", ") + ")" : "";
}

function toolLabel(name) {
  return name in TOOLS ? TOOLS[name][2] : "Using " + name;
}

// --- the status badge and the activity line ---

const BADGE = { approval: "waiting for your approval" };

/* The badge says what the connection does, unless the agent waits for the shopper. */
function showStatus() {
  if (!client) return;
  const waiting = client.activity === "approval" && ["connected", "thinking"].includes(client.state);
  const shown = waiting ? "approval" : client.state;
  statusBadge.textContent = BADGE[shown] || shown;
  statusBadge.dataset.state = shown;
}

function showActivity(event) {
  lastActivity = event;
  // While the shopper speaks or the agent's voice plays, the line says so.
  if (client && VOICE_LINE[client.voiceState]) return showVoiceLine();
  activityLine.dataset.activity = event.activity;
  activityLine.hidden = event.activity === "idle";
  if (event.activity === "thinking") activityLine.textContent = "Thinking…";
  else if (event.activity === "tool") activityLine.textContent = toolLabel(event.tool) + "…";
  else if (event.activity === "approval") activityLine.textContent = "Waiting for you: approve or decline.";
  else activityLine.textContent = "";
  showStatus();
  // The line takes room from the messages: keep the newest of them in view.
  chat.scrollToEnd();
}

// --- the answer, in bubbles split by the tool calls ---

function showAnswer(event) {
  turnText = event.text;
  chat.turn = { shownBefore, text: turnText };
  // The closing frame may carry a text that is not the deltas' (a server
  // that sends only the whole answer): then it all belongs to this bubble.
  const from = event.text.length >= shownBefore ? shownBefore : 0;
  const text = event.text.slice(from).trim();
  if (!agentEntry && text) agentEntry = chat.add({ kind: "agent", text: "", streaming: true });
  if (agentEntry) spokenAnswer = agentEntry;
  if (agentEntry) {
    agentEntry.text = text;
    agentEntry.done = event.done;
    if (event.operator) agentEntry.operator = event.operator;
    if (event.done) delete agentEntry.streaming;
    chat.update(agentEntry);
  }
  if (event.done) {
    if (agentEntry && !text) chat.remove(agentEntry);
    finishTurn(event.text);
    return;
  }
  // As far as the client got: a reload from here goes on from here.
  chat.save();
}

/* The text so far stays in its bubble; what follows the call gets a new one. */
function closeBubble() {
  // Not marked done: data-done is the turn's last bubble, its answer.
  if (agentEntry) delete agentEntry.streaming;
  agentEntry = null;
  shownBefore = turnText.length;
  chat.turn = { shownBefore, text: turnText };
}

function finishTurn(finalText) {
  for (const { entry, error } of turnFailures) {
    if (error && finalText.includes(error)) {
      entry.text = "✗ " + entry.summary + " failed";
      chat.update(entry);
    }
  }
  startTurn();
  chat.save();
}

function startTurn() {
  agentEntry = null;
  shownBefore = 0;
  turnText = "";
  turnFailures = [];
  chat.endTurn();
}

/* After a reload: the turn the earlier page was answering, as it left it. */
function takeUpKeptTurn() {
  agentEntry = chat.streaming();
  shownBefore = chat.turn.shownBefore;
  turnText = chat.turn.text;
  turnFailures = chat.failures();
}

// --- one line per tool call ---

function toolStarted(event) {
  closeBubble();
  const summary = event.name + describeArgs(event.args);
  const entry = chat.add({
    kind: "tool", tool: event.name, callId: event.callId, status: "running", summary,
    text: "→ " + summary + " …",
  });
  toolEntries.set(event.callId, entry);
  chat.save();
}

function toolFinished(event) {
  const entry = toolEntries.get(event.callId) || chat.add({
    kind: "tool", tool: event.name, callId: event.callId, status: "running", summary: event.name, text: "",
  });
  toolEntries.delete(event.callId);
  if (event.outcome.denied) {
    entry.status = "denied";
    entry.text = "✗ " + entry.summary + ": you declined";
  } else if ("error" in event.outcome) {
    entry.status = "error";
    entry.text = "✗ " + entry.summary + " failed: " + event.outcome.error;
    entry.failure = event.outcome.error;
    turnFailures.push({ entry, error: event.outcome.error });
  } else {
    entry.status = "success";
    entry.text = "✓ " + entry.summary + " done";
  }
  chat.update(entry);
  chat.save();
}

/* Approvals use the client's dialog; a payment's also shows the amount and the cart. */
function showApproval(request, decide) {
  const handle = showApprovalDialog(request, decide);
  if (request.toolName === "process_payment") describePayment(document.getElementById("owl-approval"), request);
  return handle;
}

function describePayment(dialog, request) {
  const details = document.getElementById("pay-details-template").content.firstElementChild.cloneNode(true);
  const amount = Number(request.args.amount);
  details.querySelector("[data-amount]").textContent = money(amount);
  if (page.kind === "cart") {
    const lines = details.querySelector("[data-lines]");
    page.context.items.forEach((item) => {
      const li = document.createElement("li");
      li.textContent = item.quantity + " × " + item.name + " — " + money(item.lineTotal);
      lines.appendChild(li);
    });
    if (Math.round(page.context.total * 100) !== Math.round(amount * 100)) {
      const mismatch = details.querySelector("[data-mismatch]");
      mismatch.hidden = false;
      mismatch.textContent = "This is not your cart total (" + money(page.context.total) + ").";
    }
  }
  dialog.querySelector("h2").textContent = "Confirm the payment";
  // The amount and the lines say what the raw arguments would.
  dialog.querySelector(".owl-approval-args").replaceWith(details);
}

// --- voice ---

const VOICE_LINE = {
  listening: "Listening… click the microphone again to send.",
  speaking: "Speaking… talk or click the microphone to interrupt.",
};
const MIC_LABEL = {
  listening: "Stop and send what you said",
  speaking: "Interrupt and speak",
};

function showVoiceLine() {
  const line = VOICE_LINE[client.voiceState];
  activityLine.dataset.activity = client.voiceState;
  activityLine.hidden = false;
  activityLine.textContent = line;
  chat.scrollToEnd();
}

function showVoice(state) {
  micButton.hidden = state === "off";
  micButton.dataset.state = state;
  micButton.setAttribute("aria-pressed", String(state === "listening"));
  const label = MIC_LABEL[state] || "Speak to the assistant";
  micButton.setAttribute("aria-label", label);
  micButton.title = label;
  if (state === "listening") startVoiceTurn();
  if (VOICE_LINE[state]) showVoiceLine();
  else showActivity(lastActivity);
}

/* A new utterance: its words and its answer get new bubbles. */
function startVoiceTurn() {
  if (agentEntry) closeBubble();
  heardEntry = null;
  spokenAnswer = null;
  spokenText = "";
}

function joinFragment(text, fragment) {
  fragment = String(fragment || "").trim();
  if (!fragment) return text;
  return text ? text + " " + fragment : fragment;
}

function showTranscript(event) {
  if (event.role === "user") {
    if (!heardEntry) heardEntry = chat.add({ kind: "user", voice: true, text: "" });
    heardEntry.text = joinFragment(heardEntry.text, event.text);
    chat.update(heardEntry);
  } else if (event.role === "agent") {
    spokenText = joinFragment(spokenText, event.text);
    // A server that writes the answer as AGENT_RESPONSE too fills the bubble
    // from there; otherwise what is said is what is shown.
    if (!turnText) {
      if (!agentEntry) agentEntry = chat.add({ kind: "agent", text: "" });
      agentEntry.text = spokenText;
      spokenAnswer = agentEntry;
      chat.update(agentEntry);
    }
  }
  chat.save();
}

/* The answer being spoken was cut off: by this page (barge-in) or by the server. */
function markCut() {
  const entry = agentEntry || spokenAnswer;
  if (!entry || entry.cut) return;
  entry.cut = true;
  chat.update(entry);
  chat.save();
}

function toggleMicrophone() {
  if (!client) return;
  if (client.voiceState === "listening") {
    client.stopListening();
    return;
  }
  client.startListening();
}

// A question the session did not go on with (see the top of this file).
const NOT_ANSWERED = "Your last question was not answered. Please ask it again.";
const ANSWER_CUT = "The answer to your last question was cut off. Please ask it again.";

// The session is over for good (refused, ended by an operator, gave up):
// nothing typed could be sent any more.
const ENDED_STATES = ["closed", "error"];
const ENDED_PLACEHOLDER = "This conversation has ended. Reload the page to start another.";
const typingPlaceholder = input.placeholder;

function connectAssistant() {
  const scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
  client = new OwlLayerClient({
    apiKey: config.apiKey, endpoint: scheme + window.location.host + config.wsPath, showApproval,
    visitorToken: config.visitorToken || null,
  });
  let lostConnection = false;

  client.on("state", (state) => {
    showStatus();
    sendButton.disabled = state !== "connected";
    input.disabled = ENDED_STATES.includes(state);
    // An error the client recovers from (a handshake that timed out) ends
    // in "connected" again: then the prompt to type is back too.
    input.placeholder = input.disabled ? ENDED_PLACEHOLDER : typingPlaceholder;
    if (state === "reconnecting" && !lostConnection) {
      lostConnection = true;
      showMessage("note", "Lost the connection to the assistant. Reconnecting…");
    }
  });
  client.on("connected", (event) => {
    if (event.resumed && !chat.entries.length) showEarlier();
    else if (!event.resumed && !chat.entries.length && !lastVisitAsked) showLastVisit();
    lastVisitAsked = true;
    // A new session, or one that cannot send what was missed: the answer
    // cut off stays as far as it got.
    if (!event.continued) {
      startTurn();
      chat.save();
    }
    noteReload(event);
    if (lostConnection) showMessage("note", event.resumed ? "Reconnected: the conversation goes on." : "Reconnected.");
    lostConnection = false;
  });
  client.on("unanswered", (event) => {
    showMessage("note", event.partial ? ANSWER_CUT : NOT_ANSWERED);
    // One key press asks it again.
    if (!input.value) input.value = event.text;
  });
  client.on("activity", showActivity);
  client.on("agent", showAnswer);
  client.on("error", (event) => {
    // The server ending the session says goodbye: a notice, not a failure.
    if (event.ended) showMessage("note", event.message);
    else showMessage("error", plainError(event));
  });
  // The calls a lost connection left running can no longer be answered
  // (their answers can reach no one): say so. The answer may go on after
  // the reconnect ("connected" decides).
  client.on("close", () => {
    toolEntries.forEach((entry) => {
      entry.status = "lost";
      entry.text = "✗ " + entry.summary + ": the connection was lost";
      chat.update(entry);
    });
    toolEntries.clear();
    chat.save();
  });
  client.on("system", (event) => {
    if (event.kind === "waiting" && event.message) showMessage("note", event.message);
  });
  client.on("tool.start", toolStarted);
  client.on("tool", toolFinished);
  client.on("voice", showVoice);
  client.on("transcript.delta", showTranscript);
  // Before the next utterance starts: the cut belongs to this answer.
  client.on("voice.interrupt", markCut);
  client.on("voice.event", (event) => {
    if (event.event === "interrupted") markCut();
  });
  micButton.addEventListener("click", toggleMicrophone);

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const text = input.value;
    if (client.sendText(text)) {
      startVoiceTurn();
      startTurn();
      showMessage("user", text.trim());
      input.value = "";
    }
  });
  syncAssistant();
  client.connect();
}

// A session that goes on in a tab that kept nothing of it: its earlier
// messages, as the server stored them, above whatever came since.
async function showEarlier() {
  const earlier = await client.history();
  if (!earlier || !earlier.messages.length) return;
  chat.addEarlier(earlier.messages.map(earlierEntry));
  chat.save();
}

const MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

// A moment the way the site writes one: "3 Dec 2026, 14:05 UTC".
function formatMoment(when) {
  const two = (number) => String(number).padStart(2, "0");
  return when.getUTCDate() + " " + MONTHS[when.getUTCMonth()] + " " + when.getUTCFullYear() + ", " +
    two(when.getUTCHours()) + ":" + two(when.getUTCMinutes()) + " UTC";
}

// A new tab or another device of a visitor the store knows (its visitor
// token): the last conversation, above the new one, with a note saying when.
let lastVisitAsked = false;
async function showLastVisit() {
  const last = await client.lastConversation();
  if (!last || !last.messages.length || last.sessionId === client.sessionId) return;
  const when = last.startedAt ? new Date(last.startedAt) : null;
  const note = "Your last conversation" + (when ? ", " + formatMoment(when) : "") +
    ". The assistant remembers what you asked then.";
  chat.addEarlier([{ kind: "note", text: note }, ...last.messages.map(earlierEntry)]);
  chat.save();
}

function earlierEntry(message) {
  if (message.role === "user") return { kind: "user", text: message.text, ...(message.voice ? { voice: true } : {}) };
  if (message.role === "assistant") {
    return { kind: "agent", text: message.text, done: true, ...(message.operator ? { operator: message.operator } : {}) };
  }
  if (message.role === "tool") {
    return { kind: "tool", tool: message.name, callId: "", status: "earlier", summary: message.name,
             text: "→ " + message.name };
  }
  return { kind: "error", text: message.text };
}

// After a reload, the first connection says whether the assistant goes on
// with the conversation shown (the server continued the session) or not,
// and with the answer it was writing, if any.
let reloaded = chat.restore();
if (reloaded) takeUpKeptTurn();
function noteReload(event) {
  if (!reloaded) return;
  reloaded = false;
  let note = "The page was reloaded: the conversation above is kept here, but the " +
    "assistant starts a new one and does not remember it.";
  if (event.resumed) note = "The page was reloaded: the assistant goes on with the conversation above.";
  if (event.continued && client.state === "thinking") {
    // Nothing of the answer shown yet: the question was asked just before the reload.
    const answering = turnText || agentEntry ? "finishes its answer" : "answers your last question";
    note = "The page was reloaded: the assistant goes on with the conversation above and " + answering + ".";
  }
  showMessage("note", note, { keep: false });
}
if (config.apiKey) {
  connectAssistant();
} else {
  form.addEventListener("submit", (event) => event.preventDefault());
}
