/*
 * OwlLayer browser client: speaks AITP 1.0.0 over a WebSocket exactly as the
 * deployed OwlLayerClient 0.4 does (docs/protocol.md).
 *
 *   import { OwlLayerClient } from "/static/owllayer/owllayer-client.js";
 *   const client = new OwlLayerClient({ apiKey, endpoint });
 *   client.registerTool({ name, description, parameters, risk }, handler);
 *   client.setContext({ page: "product_detail" });
 *   client.on("agent", ({ text, done, operator, cut }) => ...);
 *     // operator: a person's name, when one answers; cut: a barge-in ended the turn there
 *   client.on("activity", ({ activity, tool, callId }) => ...);
 *   client.connect();
 *
 * An ES module without dependencies. Every received frame is checked against
 * the same strict schema as the deployed client; a frame that fails is
 * dropped silently and counted in window.__owl.dropped, so tests can prove
 * none ever was.
 *
 * Two things a page can show:
 *   state     the connection: idle, connecting, connected, thinking,
 *             reconnecting, error, closed (the "state" event);
 *   activity  what the agent is doing: idle, thinking, tool, approval
 *             (the "activity" event, with the tool and callId for the last two).
 *
 * client.history() reads the session's earlier messages from the server
 * (a widget that keeps no copy of its own draws them after a reload).
 * new OwlLayerClient({visitorToken}) passes on a token the tenant's backend
 * signed for its visitor (protocol.md §3c): the visitor's conversations are
 * linked, and client.lastConversation() reads the latest one.
 *
 * Events: state, activity, connected, close, error, frame, agent, tools,
 * transcript.delta, system, tool.start, tool, approval, approval.decided,
 * unanswered, voice, voice.event, voice.interrupt.
 *
 * The session goes on across reloads and dropped connections of the tab:
 * the client keeps the server's resume token in sessionStorage and offers
 * it at its next handshake (protocol.md, continuing a session); the
 * "connected" event says {sessionId, resumed, continued}. new
 * OwlLayerClient({resume: false}) turns this off (one session per socket,
 * as the deployed client).
 *
 * Frames of a session that may go on are numbered (meta.seq). Beside the
 * token the tab keeps the number of the last frame handled, with the text
 * of the answer being written then and whether a turn was open, and offers
 * {token, lastSeq} at the next socket. When the server's HANDSHAKE_ACK
 * takes up from that number (its meta.seq is the lastSeq offered:
 * "continued"), the frames the page missed follow, and an answer cut by a
 * reload or a drop goes on: the "agent" events carry its whole text, as if
 * nothing had happened. A numbered frame already handled is ignored, never
 * emitted twice (counted in window.__owl.repeated).
 *
 * A question (USER_INPUT) whose turn has not ended is kept too, whole, id
 * included. A drop may have lost it on its way: when a continuing ACK's
 * meta.lastInput (the id of the last question the session took) is not its
 * id, the same frame is sent again, after the context. When the session
 * does not go on, it is not sent again (it may have been taken and its
 * turn cut): the "unanswered" event ({id, text, partial: the part of its
 * answer received, if any}) lets the page say so.
 *
 * Voice, offered only when the server's HANDSHAKE_ACK lists the "audio"
 * capability (client.voiceAvailable; protocol.md, voice):
 *   await client.startListening();   // the microphone, AUDIO_STREAM chunks
 *   client.stopListening();          // VOICE_INPUT_END {reason: "user_stop"}
 *   client.interrupt();              // stop the agent's voice, VOICE_INTERRUPT
 *   client.closeMicrophone();        // release the microphone
 * The microphone goes through an AudioWorklet (owllayer-voice-worklet.js,
 * beside this file) as 16 kHz mono 16-bit PCM, 256 ms a chunk. The agent's
 * AUDIO_STREAM chunks (audio/pcm;rate=24000) are played in order, end to
 * end. Once the microphone is open it keeps listening for the user's voice
 * (nothing is sent): speaking over the agent stops its voice at once, sends
 * VOICE_INTERRUPT and starts the next utterance (barge-in), which begins
 * half a second back, so that the words that set it off go up whole.
 * The "voice" event carries the voice state: off (no audio offered), ready,
 * listening (the user's turn), waiting (for the agent's answer), speaking
 * (the agent's voice plays). "voice.event" carries each VOICE_STATE_EVENT
 * ({event, reason}); "voice.interrupt" says this page cut the agent off
 * ({reason: "barge_in"}); "transcript.delta" each transcript ({role, text}).
 */

export const SDK_VERSION = "0.4.0";
export const PROTOCOL_VERSION = "1.0.0";
// protocol.md §3 and 2: the deployed client's numbers.
const HANDSHAKE_TIMEOUT_MS = 5000;
const RECONNECT_STEP_MS = 2000;
const MAX_RECONNECT_ATTEMPTS = 10;
const DEFAULT_MAX_ACTIVE_TOOLS = 30;
const MAX_INPUT_CHARS = 8000;
// 1008 refusals, 1003 unsupported data, 1011 server bug: retrying cannot help.
const PERMANENT_CLOSE_CODES = [1008, 1003, 1011];
const DENIED_BY_USER = "Action denied by user";
// Keeps the test log of a long session bounded.
const MAX_LOGGED_FRAMES = 1000;
// protocol.md, voice: the microphone goes up as 16 kHz 16-bit mono PCM, ~256 ms a chunk.
const MIC_RATE = 16000;
const MIC_MIME = "audio/pcm;rate=" + MIC_RATE;
const MIC_CHUNK_SAMPLES = 4096;
const AGENT_RATE = 24000;
const WORKLET_URL = new URL("./owllayer-voice-worklet.js", import.meta.url).href;
// The longest utterance before the client ends it itself (reason "timeout").
const DEFAULT_MAX_UTTERANCE_MS = 60000;
// Barge-in: the level (RMS, full scale 1) and how long it must last.
const DEFAULT_BARGE_IN_LEVEL = 0.02;
const DEFAULT_BARGE_IN_MS = 120;
// A barge-in's utterance begins this far back: the detector's 120 ms, the
// soft start of the word before it, and the time its message takes.
const DEFAULT_BARGE_IN_PREROLL_MS = 500;
// The first agent chunk starts this far ahead, so that the next can follow without a gap.
const PLAYBACK_LEAD_S = 0.05;
// The server refused the utterance's audio: sending more of it cannot help.
const AUDIO_REFUSALS = [
  "unsupported_audio_type", "unsupported_audio_rate", "invalid_audio", "empty_audio", "audio_too_large",
];

const RISKS = ["none", "low", "high", "critical"];
const APPROVAL_RISKS = ["high", "critical"];
const MESSAGE_TYPES = [
  "HANDSHAKE_INIT", "HANDSHAKE_ACK", "CONTEXT_UPDATE", "USER_INPUT", "TOOL_CALL",
  "TOOL_RESULT", "APPROVAL_REQUEST", "APPROVAL_RESPONSE", "AGENT_RESPONSE",
  "AUDIO_STREAM", "VOICE_INPUT_END", "VOICE_INTERRUPT", "VOICE_STATE_EVENT", "SYSTEM_EVENT",
];
const SERVER_TYPES = [
  "HANDSHAKE_ACK", "TOOL_CALL", "APPROVAL_REQUEST", "AGENT_RESPONSE",
  "AUDIO_STREAM", "VOICE_STATE_EVENT", "SYSTEM_EVENT",
];
const SYSTEM_EVENT_KINDS = [
  "error", "waiting", "approval_required", "tools_effective",
  "transcript", "reload", "redirect", "disconnect",
];

// --- strict frame validation (protocol.md §1) ----------------------------

function isObject(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

const check = {
  string: (v) => typeof v === "string",
  nonEmptyString: (v) => typeof v === "string" && v.length > 0,
  boolean: (v) => typeof v === "boolean",
  object: isObject,
  positiveInteger: (v) => typeof v === "number" && Number.isInteger(v) && v >= 1,
  stringList: (v) => Array.isArray(v) && v.every((item) => typeof item === "string"),
  oneOf: (allowed) => (v) => typeof v === "string" && allowed.includes(v),
};

// "required": present and not null; "optional": may be absent, never null;
// "nullable": may be absent or null (a tool result).
const PAYLOAD_SCHEMAS = {
  HANDSHAKE_ACK: {
    sessionId: ["required", check.string], serverVersion: ["required", check.string],
    protocolVersion: ["required", check.string], capabilities: ["required", check.stringList],
    maxActiveTools: ["optional", check.positiveInteger],
    resumeToken: ["optional", check.nonEmptyString], resumed: ["optional", check.boolean],
  },
  TOOL_CALL: {
    callId: ["required", check.nonEmptyString], name: ["required", check.string],
    args: ["required", check.object],
  },
  APPROVAL_REQUEST: {
    callId: ["required", check.nonEmptyString], toolName: ["required", check.string],
    risk: ["required", check.oneOf(RISKS)], args: ["required", check.object],
    message: ["required", check.nonEmptyString],
  },
  AGENT_RESPONSE: {
    chunk: ["required", check.string], done: ["required", check.boolean], operator: ["optional", check.string],
  },
  AUDIO_STREAM: { data: ["required", check.string], mimeType: ["optional", check.string] },
  VOICE_STATE_EVENT: {
    event: ["required", check.oneOf(["turn_complete", "interrupted", "waiting_for_input"])],
    reason: ["optional", check.string],
  },
  SYSTEM_EVENT: {
    kind: ["required", check.oneOf(SYSTEM_EVENT_KINDS)],
    message: ["optional", check.string], data: ["optional", check.object],
  },
};

/* Why the envelope of a parsed frame is invalid, or null when it is valid. */
function envelopeError(frame) {
  if (!isObject(frame)) return "frame is not an object";
  if (!check.nonEmptyString(frame.id)) return "id must be a non-empty string";
  if (!MESSAGE_TYPES.includes(frame.type)) return "unknown type";
  if (!SERVER_TYPES.includes(frame.type)) return "type is not sent by a server";
  if (typeof frame.timestamp !== "number" || !isFinite(frame.timestamp)) {
    return "timestamp must be a number";
  }
  if (!isObject(frame.payload)) return "payload must be an object";
  if ("meta" in frame && !isObject(frame.meta)) return "meta must be an object";
  return null;
}

/* The payload reduced to the schema's keys as {payload}, or {error}. */
function checkPayload(schema, received) {
  const payload = {};
  for (const [field, [presence, valid]] of Object.entries(schema)) {
    if (!(field in received)) {
      if (presence === "required") return { error: "payload." + field + " is missing" };
      continue;
    }
    const value = received[field];
    if (value === null) {
      if (presence !== "nullable") return { error: "payload." + field + " is null" };
    } else if (!valid(value)) {
      return { error: "payload." + field + " is invalid" };
    }
    payload[field] = value;
  }
  return { payload };
}

/*
 * Check one received text frame. Returns {frame} with the payload reduced to
 * the known keys (the client strips unknown ones), or {error} saying why the
 * deployed client would drop it.
 */
export function validateFrame(text) {
  if (typeof text !== "string") return { error: "frame is not text" };
  let frame;
  try {
    frame = JSON.parse(text);
  } catch (err) {
    return { error: "not valid json" };
  }
  const error = envelopeError(frame);
  if (error) return { error };
  const checked = checkPayload(PAYLOAD_SCHEMAS[frame.type], frame.payload);
  if (checked.error) return { error: checked.error };
  const clean = { id: frame.id, type: frame.type, timestamp: frame.timestamp, payload: checked.payload };
  if ("meta" in frame) clean.meta = frame.meta;
  return { frame: clean };
}

// sessionStorage, which a page may not be allowed to use: then nothing is kept.
function tabStorage(action, key, value) {
  try {
    if (action === "get") return window.sessionStorage.getItem(key);
    if (action === "set") window.sessionStorage.setItem(key, value);
    else window.sessionStorage.removeItem(key);
  } catch (err) {
    return null;
  }
  return null;
}

/* A frame's meta.seq: a whole number, or null when the frame is not numbered. */
function frameSeq(frame) {
  const seq = frame.meta ? frame.meta.seq : undefined;
  return Number.isSafeInteger(seq) && seq >= 0 ? seq : null;
}

/* A kept question: a USER_INPUT envelope with its id, or null. */
function keptInput(frame) {
  if (!isObject(frame) || frame.type !== "USER_INPUT" || !check.nonEmptyString(frame.id)) return null;
  if (!isObject(frame.payload) || typeof frame.timestamp !== "number") return null;
  return frame;
}

/* The text a kept question asked ("" for none, or for one that was not text). */
function inputText(frame) {
  const content = frame && frame.payload ? frame.payload.content : null;
  return typeof content === "string" ? content : "";
}

/*
 * What this tab kept for its next socket: {token, lastSeq, text, busy,
 * input}, or null. Stored as JSON; a plain token (kept before frames were
 * numbered) still counts, with no lastSeq.
 */
function readResume(key) {
  const stored = tabStorage("get", key);
  if (!stored) return null;
  let kept = null;
  try {
    kept = JSON.parse(stored);
  } catch (err) {
    // A plain token: tokens are never JSON objects.
  }
  if (!isObject(kept)) return { token: stored, lastSeq: null, text: "", busy: false, input: null, heard: "" };
  if (!check.nonEmptyString(kept.token)) return null;
  return {
    token: kept.token,
    lastSeq: Number.isSafeInteger(kept.lastSeq) && kept.lastSeq >= 0 ? kept.lastSeq : null,
    text: typeof kept.text === "string" ? kept.text : "",
    busy: kept.busy === true,
    input: keptInput(kept.input),
    heard: typeof kept.heard === "string" ? kept.heard : "",
  };
}

/*
 * Where a page reads its conversation again (protocol.md §3b): beside the
 * AITP endpoint, over HTTP(S).
 */
export function conversationAddress(endpoint) {
  const address = new URL(endpoint, window.location.href);
  address.protocol = address.protocol === "wss:" ? "https:" : "http:";
  address.pathname = address.pathname.replace(/\/$/, "") + "/conversation";
  address.search = "";
  return address.href;
}

const HISTORY_ROLES = ["user", "assistant", "tool", "error"];

// The server's answer, checked as strictly as a frame: null when it is not one.
function checkedHistory(body) {
  if (!isObject(body) || !check.nonEmptyString(body.sessionId) || !Array.isArray(body.messages)) return null;
  const fine = body.messages.every((m) => isObject(m) && HISTORY_ROLES.includes(m.role) &&
    Number.isSafeInteger(m.turn) && (m.role === "tool" ? typeof m.name === "string" : typeof m.text === "string"));
  if (!fine) return null;
  return { sessionId: body.sessionId, startedAt: typeof body.startedAt === "string" ? body.startedAt : null,
           messages: body.messages, truncated: body.truncated === true };
}

export function closeIsPermanent(code) {
  return PERMANENT_CLOSE_CODES.includes(code);
}

// --- tool declarations and arguments ------------------------------------------

const PARAMETER_TYPES = ["STRING", "NUMBER", "BOOLEAN", "OBJECT", "ARRAY"];

function hasType(type, value) {
  switch (type) {
    case "STRING": return typeof value === "string";
    case "NUMBER": return typeof value === "number" && isFinite(value);
    case "BOOLEAN": return typeof value === "boolean";
    case "OBJECT": return isObject(value);
    case "ARRAY": return Array.isArray(value);
    // A type this client does not know is the server's to judge.
    default: return !PARAMETER_TYPES.includes(type);
  }
}

function objectError(schema, value, where) {
  for (const name of schema.required || []) {
    if (value[name] === undefined || value[name] === null) return where + "." + name + " is required";
  }
  const properties = schema.properties || {};
  for (const key of Object.keys(properties)) {
    if (value[key] === undefined) continue;
    const error = argumentsError(properties[key], value[key], where + "." + key);
    if (error) return error;
  }
  return null;
}

function itemsError(schema, value, where) {
  for (let i = 0; i < value.length; i++) {
    const error = argumentsError(schema.items, value[i], where + "[" + i + "]");
    if (error) return error;
  }
  return null;
}

/* Why args do not fit an AITP parameter schema, or null when they do. */
export function argumentsError(schema, value, where) {
  if (!schema) return null;
  const type = schema.type;
  if (!hasType(type, value)) return where + " must be " + String(type).toLowerCase();
  if (Array.isArray(schema.enum) && !schema.enum.includes(value)) {
    return where + " must be one of " + schema.enum.join(", ");
  }
  if (type === "OBJECT") return objectError(schema, value, where);
  if (type === "ARRAY" && schema.items) return itemsError(schema, value, where);
  return null;
}

function declarationOf(tool) {
  const declaration = { name: tool.name, description: tool.description || "" };
  if (tool.parameters) declaration.parameters = tool.parameters;
  declaration.risk = tool.risk;
  return declaration;
}

// --- small helpers ---------------------------------------------------------------

function newMessageId() {
  const crypto = globalThis.crypto;
  if (typeof crypto.randomUUID === "function") return "msg_" + crypto.randomUUID();
  // randomUUID needs a secure context; build a v4 UUID by hand otherwise.
  const bytes = new Uint8Array(16);
  crypto.getRandomValues(bytes);
  bytes[6] = (bytes[6] & 0x0f) | 0x40;
  bytes[8] = (bytes[8] & 0x3f) | 0x80;
  const hex = Array.from(bytes, (b) => (b + 0x100).toString(16).slice(1)).join("");
  return "msg_" + hex.slice(0, 8) + "-" + hex.slice(8, 12) + "-" + hex.slice(12, 16) +
    "-" + hex.slice(16, 20) + "-" + hex.slice(20);
}

function errorText(err) {
  if (err && typeof err.message === "string" && err.message) return err.message;
  return String(err || "the tool failed");
}

// Base64 both ways in chunks: String.fromCharCode over a whole chunk at once overflows the stack.
function base64FromBytes(bytes) {
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(binary);
}

function bytesFromBase64(text) {
  const binary = atob(text);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes;
}

/* The sample rate of an "audio/pcm;rate=N" mime type (24 kHz when absent), or 0. */
function pcmRate(mimeType) {
  if (mimeType === undefined) return AGENT_RATE;
  const match = /^audio\/pcm(?:\s*;\s*rate=(\d+))?\s*$/i.exec(mimeType);
  if (!match) return 0;
  const rate = match[1] ? Number(match[1]) : AGENT_RATE;
  return rate >= 3000 && rate <= 384000 ? rate : 0;
}

function defaultEndpoint() {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  return scheme + "//" + location.host + "/owllayer";
}

// --- the approval dialog ---------------------------------------------------------

const DIALOG_STYLE =
  ".owl-approval{border:1px solid #c8ccd4;border-radius:10px;padding:20px 22px;max-width:420px;" +
  "font:15px/1.4 system-ui,sans-serif;color:#1d2230;box-shadow:0 12px 40px rgba(0,0,0,.25)}" +
  ".owl-approval::backdrop{background:rgba(20,24,35,.45)}" +
  ".owl-approval h2{margin:0 0 8px;font-size:18px}" +
  ".owl-approval .owl-approval-risk{display:inline-block;padding:1px 8px;border-radius:9px;" +
  "background:#fde2e1;color:#a3201b;font-size:12px;text-transform:uppercase;letter-spacing:.04em}" +
  ".owl-approval pre{background:#f3f4f7;padding:8px;border-radius:6px;overflow:auto;font-size:13px}" +
  ".owl-approval-buttons{display:flex;gap:10px;justify-content:flex-end;margin-top:14px}" +
  ".owl-approval-buttons button{font:inherit;padding:7px 16px;border-radius:6px;cursor:pointer;" +
  "border:1px solid #c8ccd4;background:#fff;color:#1d2230}" +
  ".owl-approval-buttons button[data-owl-approve]{background:#1f6feb;border-color:#1f6feb;color:#fff}";

function ensureDialogStyle() {
  if (document.getElementById("owl-approval-style")) return;
  const style = document.createElement("style");
  style.id = "owl-approval-style";
  style.textContent = DIALOG_STYLE;
  document.head.appendChild(style);
}

function element(tag, properties) {
  return Object.assign(document.createElement(tag), properties);
}

function dialogButton(label, marker) {
  const button = element("button", { type: "button", textContent: label });
  button.setAttribute(marker, "");
  return button;
}

/* The dialog's content: title, message, tool and risk, arguments, buttons. */
function buildApprovalDialog(request) {
  const dialog = element("dialog", { className: "owl-approval", id: "owl-approval" });
  dialog.setAttribute("aria-labelledby", "owl-approval-title");
  dialog.dataset.callId = request.callId;

  const facts = document.createElement("p");
  facts.append(request.toolName + " ",
    element("span", { className: "owl-approval-risk", textContent: request.risk }));
  const decline = dialogButton("Decline", "data-owl-decline");
  const approve = dialogButton("Approve", "data-owl-approve");
  const buttons = element("div", { className: "owl-approval-buttons" });
  buttons.append(decline, approve);

  dialog.append(
    element("h2", { id: "owl-approval-title", textContent: "Approve this action?" }),
    element("p", { className: "owl-approval-message", textContent: request.message }),
    facts,
    element("pre", { className: "owl-approval-args", textContent: JSON.stringify(request.args, null, 2) }),
    buttons,
  );
  return { dialog, approve, decline };
}

/*
 * Show one approval as a modal <dialog>; decide(true|false) is called once.
 * Escape counts as Decline: for a payment, the safe answer.
 */
export function showApprovalDialog(request, decide) {
  ensureDialogStyle();
  const { dialog, approve, decline } = buildApprovalDialog(request);
  document.body.appendChild(dialog);
  const dismiss = answerOnce(dialog, approve, decline, decide);
  dialog.showModal();
  // dismiss(): the connection that asked is gone, so the answer could reach no one.
  return { dismiss };
}

/*
 * An approval <dialog>'s answer: its two buttons, and Escape, which denies,
 * call decide(approved) once, the dialog closed and gone first. Returns
 * dismiss(), which takes the dialog away unanswered (false when it was
 * answered already). The widget's own dialog answers through it too.
 */
export function answerOnce(dialog, approve, deny, decide) {
  let decided = false;
  const dismiss = () => {
    if (decided) return false;
    decided = true;
    dialog.close();
    dialog.remove();
    return true;
  };
  const finish = (approved) => {
    if (dismiss()) decide(approved);
  };
  approve.addEventListener("click", () => finish(true));
  deny.addEventListener("click", () => finish(false));
  dialog.addEventListener("cancel", (event) => {
    event.preventDefault();
    finish(false);
  });
  return dismiss;
}

// --- the client --------------------------------------------------------------------

export class OwlLayerClient {
  static SDK_VERSION = SDK_VERSION;
  static PROTOCOL_VERSION = PROTOCOL_VERSION;
  static validateFrame = validateFrame;
  static closeIsPermanent = closeIsPermanent;
  static argumentsError = argumentsError;
  static showApprovalDialog = showApprovalDialog;

  constructor(options = {}) {
    this.apiKey = options.apiKey || "";
    this.endpoint = options.endpoint || defaultEndpoint();
    this.showApproval = options.showApproval || showApprovalDialog;
    // The tenant's backend vouching for the visitor (protocol.md §3c): a JWT, or null.
    this.visitorToken = options.visitorToken || null;
    // Where this tab keeps its resume token (null: the session ends with its socket).
    this.resumeKey = options.resume === false ? null : "owllayer-resume:" + this.endpoint;
    this.resumed = false;
    // The token this socket's ACK gave (null: nothing to keep), what this
    // socket offered (readResume) and the meta.seq of the last frame handled.
    this.resumeToken = null;
    this.offered = null;
    this.lastSeq = null;
    // A turn the page started (or continued) that has not had its done frame.
    this.turnOpen = false;
    // The USER_INPUT frame sent (or sent again) whose turn has not had its
    // done frame: sent again when a drop lost it (protocol.md §3a).
    this.pendingInput = null;
    // What the server heard of the utterance whose turn has not had its done frame.
    this.heardText = "";
    this.tools = {};
    this.toolOrder = [];
    this.context = {};
    this.maxActiveTools = DEFAULT_MAX_ACTIVE_TOOLS;
    this.listeners = {};
    this.ws = null;
    this.generation = 0;
    this.sessionId = null;
    this.attempts = 0;
    this.retryTimer = null;
    this.handshakeTimer = null;
    this.acknowledged = false;
    this.stopped = false;
    this.endedByServer = false;
    this.errorShown = false;
    this.contextDirty = false;
    this.contextQueued = false;
    this.agentText = "";
    this.approvalQueue = [];
    this.openApproval = null;
    this.toolsEffective = null;
    // Calls of this connection not yet answered, in arrival order:
    // callId -> {name, phase: "running" | "queued" | "approval", server}.
    // The activity is read from them, so that with several calls in one turn
    // it stays on one still open instead of claiming "thinking" too early.
    this.openCalls = new Map();
    this.activityDetail = { activity: "idle" };
    this.capabilities = [];
    this.voiceOptions = {
      maxUtteranceMs: options.maxUtteranceMs || DEFAULT_MAX_UTTERANCE_MS,
      bargeInLevel: options.bargeInLevel || DEFAULT_BARGE_IN_LEVEL,
      bargeInMs: options.bargeInMs || DEFAULT_BARGE_IN_MS,
      bargeInPrerollMs: options.bargeInPrerollMs || DEFAULT_BARGE_IN_PREROLL_MS,
      // The rate the microphone's context is asked for; the worklet makes 16 kHz of any.
      captureRate: options.captureRate || MIC_RATE,
    };
    // The microphone (stream, context, worklet node), once opened.
    this.mic = null;
    this.micOpening = null;
    this.listening = false;
    this.ending = false;
    this.utteranceTimer = null;
    // The agent's voice: its context, the sources scheduled and when the next starts.
    this.player = null;
    this.playing = new Set();
    this.playAt = 0;
    this.agentTurnOpen = false;
    // After a barge-in, agent audio still on its way is not played.
    this.muted = false;
    // What tests and the page can read; kept current by the client.
    this.wire = {
      state: "idle", activity: "idle", frames: [], sent: [], dropped: 0, droppedReasons: [],
      connects: 0, closes: [], retryInMs: null, sessionId: null, lastSeq: null, repeated: 0,
      resent: 0, unanswered: 0,
      voice: {
        state: "off", micRate: null, micChunks: 0, sentChunks: 0, sentBytes: 0, utterances: 0,
        receivedChunks: 0, scheduledChunks: 0, playedChunks: 0, played: [], stoppedChunks: 0,
        ignoredChunks: 0, gaps: 0, interrupts: 0, bargeIns: 0,
      },
    };
    if (options.expose !== false) globalThis.__owl = this.wire;
  }

  on(event, listener) {
    (this.listeners[event] = this.listeners[event] || []).push(listener);
    return this;
  }

  emit(event, data) {
    for (const listener of (this.listeners[event] || []).slice()) {
      try {
        listener(data);
      } catch (err) {
        // A broken page listener must not break the protocol; make it visible.
        console.error("owllayer: " + event + " listener failed", err);
      }
    }
  }

  get state() {
    return this.wire.state;
  }

  setState(state) {
    if (this.wire.state === state) return;
    this.wire.state = state;
    this.emit("state", state);
  }

  // --- activity: what the agent is doing, apart from the connection ---

  get activity() {
    return this.wire.activity;
  }

  /* call: an open call ({name}) for "tool" and "approval"; emits on any change. */
  setActivity(activity, callId, call) {
    const detail = { activity };
    if (call) {
      detail.tool = call.name;
      detail.callId = callId;
    }
    const now = this.activityDetail;
    if (now.activity === activity && now.tool === detail.tool && now.callId === detail.callId) return;
    this.activityDetail = detail;
    this.wire.activity = activity;
    this.emit("activity", Object.assign({}, detail));
  }

  /*
   * The activity the open calls imply: a dialog on screen first (the agent
   * waits for the user), then the newest interface call still running or
   * waiting for its dialog; with none left, the agent is thinking again.
   */
  settleActivity() {
    let shown = null;
    let busy = null;
    for (const [callId, call] of this.openCalls) {
      if (call.phase === "approval") shown = [callId, call];
      else if (!call.server) busy = [callId, call];
    }
    if (shown) return this.setActivity("approval", ...shown);
    if (busy) return this.setActivity("tool", ...busy);
    return this.setActivity("thinking");
  }

  openCall(callId, name, phase, server) {
    this.openCalls.set(callId, { name, phase, server: Boolean(server) });
    if (!server) this.settleActivity();
  }

  movePhase(callId, phase) {
    const call = this.openCalls.get(callId);
    if (!call) return;
    call.phase = phase;
    this.settleActivity();
  }

  closeCall(callId) {
    // A call of an ended turn or connection: nothing to show any more.
    if (!this.openCalls.delete(callId)) return;
    this.settleActivity();
  }

  /*
   * Nothing is going on: the turn or the session ended, or the connection
   * went away. A call still open then (a late dialog, a handler the server
   * gave up on) must not bring "thinking" back when it ends.
   */
  rest() {
    this.openCalls.clear();
    this.setActivity("idle");
  }

  // --- connection lifecycle ---

  connect() {
    this.stopped = false;
    this.endedByServer = false;
    this.open();
    return this;
  }

  disconnect() {
    this.stopped = true;
    this.clearRetry();
    if (this.ws) this.ws.close(1000, "client closed");
    this.setState("closed");
  }

  open() {
    // An endpoint with a query of its own keeps it (the console's preview puts its ticket there).
    const joiner = this.endpoint.includes("?") ? "&" : "?";
    const url = this.endpoint + joiner + "apiKey=" + encodeURIComponent(this.apiKey);
    const generation = ++this.generation;
    this.acknowledged = false;
    this.errorShown = false;
    // The turn's text is kept until the ACK says whether the turn goes on.
    this.resumeToken = null;
    this.offered = null;
    this.sessionId = null;
    this.wire.sessionId = null;
    this.wire.connects += 1;
    this.setState("connecting");
    const ws = new WebSocket(url);
    this.ws = ws;
    ws.onopen = () => {
      if (generation === this.generation) this.opened(generation);
    };
    ws.onmessage = (event) => {
      if (generation === this.generation) this.receive(event.data);
    };
    ws.onclose = (event) => {
      if (generation === this.generation) this.closed(event.code, event.reason);
    };
  }

  opened(generation) {
    this.attempts = 0;
    const init = {
      apiKey: this.apiKey,
      userAgent: navigator.userAgent,
      viewport: innerWidth + "x" + innerHeight,
      sdkVersion: SDK_VERSION,
      protocolVersion: PROTOCOL_VERSION,
    };
    if (this.visitorToken) init.visitorToken = this.visitorToken;
    if (this.resumeKey) {
      const kept = readResume(this.resumeKey);
      this.offered = kept;
      init.resume = {};
      if (kept) init.resume.token = kept.token;
      if (kept && kept.lastSeq !== null) init.resume.lastSeq = kept.lastSeq;
    }
    this.send("HANDSHAKE_INIT", init);
    this.handshakeTimer = setTimeout(() => this.handshakeTimedOut(generation), HANDSHAKE_TIMEOUT_MS);
  }

  handshakeTimedOut(generation) {
    if (generation !== this.generation || this.acknowledged) return;
    this.setState("error");
    this.showError("Handshake timeout");
    this.ws.close(4000, "Handshake timeout");
  }

  closed(code, reason) {
    clearTimeout(this.handshakeTimer);
    this.wire.closes.push({ code, reason });
    this.acknowledged = false;
    this.dismissApprovals();
    // The voice turn belonged to this connection: silence and release.
    this.capabilities = [];
    this.closeMicrophone();
    this.stopPlayback();
    this.setVoiceState("off");
    // The calls belonged to this connection; none of them can be answered.
    this.rest();
    this.emit("close", { code, reason });
    if (this.stopped && this.endedByServer && code === 1001) {
      this.stopped = false;
      this.endedByServer = false;
      this.errorShown = false;
    }
    if (this.stopped) {
      this.setState("closed");
      return;
    }
    if (closeIsPermanent(code)) {
      // The session is over for good: its token would only be refused, and
      // the numbers of its frames mean nothing to another session.
      this.forgetResume();
      // protocol.md §10: no reconnect; show the reason unless the server
      // already explained itself with an error event.
      this.giveUp(reason || "The connection was refused (" + code + ").");
      return;
    }
    if (this.attempts >= MAX_RECONNECT_ATTEMPTS) {
      this.giveUp("Could not reconnect to the assistant.");
      return;
    }
    this.scheduleRetry();
  }

  giveUp(message) {
    this.stopped = true;
    this.showError(message);
    this.setState("error");
  }

  scheduleRetry() {
    this.attempts += 1;
    const delay = RECONNECT_STEP_MS * this.attempts;
    this.wire.retryInMs = delay;
    this.setState("reconnecting");
    this.retryTimer = setTimeout(() => {
      this.retryTimer = null;
      this.wire.retryInMs = null;
      this.open();
    }, delay);
  }

  clearRetry() {
    if (this.retryTimer !== null) clearTimeout(this.retryTimer);
    this.retryTimer = null;
    this.wire.retryInMs = null;
  }

  showError(message) {
    if (this.errorShown) return;
    this.errorShown = true;
    this.emit("error", { message });
  }

  // --- frames out ---

  /* The frame sent (its envelope), or null when there is no open socket. */
  send(type, payload) {
    return this.sendFrame({ id: newMessageId(), type, timestamp: Date.now(), payload });
  }

  sendFrame(frame) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return null;
    if (frame.type !== "HANDSHAKE_INIT" && frame.type !== "CONTEXT_UPDATE") {
      // protocol.md §4: a pending context update goes first, so that after a
      // tool navigated the page the server sees the new page's tools first.
      this.flushContext();
    }
    this.ws.send(JSON.stringify(frame));
    this.log(this.wire.sent, frame);
    return frame;
  }

  log(list, frame) {
    list.push(frame);
    if (list.length > MAX_LOGGED_FRAMES) list.shift();
  }

  sendText(text) {
    text = String(text || "").trim();
    if (!text) return false;
    if (text.length > MAX_INPUT_CHARS) {
      this.emit("error", { message: "The message is too long (at most " + MAX_INPUT_CHARS + " characters)." });
      return false;
    }
    if (!this.acknowledged) {
      this.emit("error", { message: "Not connected to the assistant yet." });
      return false;
    }
    this.agentText = "";
    this.heardText = "";
    const sent = this.send("USER_INPUT", { modality: "text", content: text });
    if (!sent) return false;
    this.turnOpen = true;
    // Kept with the tab's record at once: a reload right after still has it.
    this.pendingInput = sent;
    this.keepResume();
    this.setState("thinking");
    this.setActivity("thinking");
    return true;
  }

  // --- page context and tools ---

  registerTool(tool, handler) {
    if (!tool || typeof tool.name !== "string" || !tool.name) throw new Error("a tool needs a name");
    const risk = tool.risk === undefined ? "none" : tool.risk;
    if (!RISKS.includes(risk)) throw new Error("unknown risk for " + tool.name + ": " + risk);
    if (typeof handler !== "function") throw new Error("tool " + tool.name + " needs a handler");
    if (!(tool.name in this.tools)) this.toolOrder.push(tool.name);
    this.tools[tool.name] = {
      name: tool.name, description: tool.description || "", parameters: tool.parameters,
      risk, handler, approvalMessage: tool.approvalMessage,
    };
    this.contextChanged();
    return this;
  }

  unregisterTool(name) {
    if (!(name in this.tools)) return this;
    delete this.tools[name];
    this.toolOrder = this.toolOrder.filter((n) => n !== name);
    this.contextChanged();
    return this;
  }

  setContext(context) {
    this.context = isObject(context) ? context : {};
    this.contextChanged();
    return this;
  }

  /* Call after a client-side navigation: the url and title are read at send time. */
  pageChanged() {
    this.contextChanged();
    return this;
  }

  activeTools() {
    const names = this.toolOrder.slice(0, this.maxActiveTools);
    if (this.toolOrder.length > names.length) {
      console.warn("owllayer: only the first " + this.maxActiveTools + " tools are sent");
    }
    return names.map((name) => declarationOf(this.tools[name]));
  }

  // Changes made together (in one task) leave as one CONTEXT_UPDATE.
  contextChanged() {
    this.contextDirty = true;
    if (this.contextQueued) return;
    this.contextQueued = true;
    queueMicrotask(() => {
      this.contextQueued = false;
      this.flushContext();
    });
  }

  flushContext() {
    if (!this.contextDirty || !this.acknowledged) return;
    this.contextDirty = false;
    this.send("CONTEXT_UPDATE", {
      url: location.pathname,
      title: document.title,
      activeTools: this.activeTools(),
      context: this.context,
    });
  }

  // --- frames in ---

  receive(data) {
    const checked = validateFrame(data);
    if (checked.error) {
      this.wire.dropped += 1;
      this.log(this.wire.droppedReasons, { reason: checked.error, text: String(data).slice(0, 500) });
      return;
    }
    const frame = checked.frame;
    if (frame.type === "HANDSHAKE_ACK") {
      // Its number is not compared: it says where this socket takes up.
      this.log(this.wire.frames, frame);
      this.emit("frame", frame);
      this.onAck(frame.payload, frameSeq(frame), frame.meta);
      return;
    }
    // Numbers count from the ACK: a frame before it (a refusal) is not compared.
    const seq = this.acknowledged ? frameSeq(frame) : null;
    if (seq !== null && this.lastSeq !== null && seq <= this.lastSeq) {
      // Sent again after a reconnect, but this tab handled it already.
      this.wire.repeated += 1;
      return;
    }
    this.log(this.wire.frames, frame);
    this.emit("frame", frame);
    try {
      this.handle(frame);
    } finally {
      // After the page was told: a reload from here on is offered what follows.
      if (seq !== null) this.handled(seq);
    }
  }

  handle(frame) {
    const payload = frame.payload;
    switch (frame.type) {
      case "TOOL_CALL": return this.onToolCall(payload);
      case "APPROVAL_REQUEST": return this.onServerApproval(payload);
      case "AGENT_RESPONSE": return this.onAgentResponse(payload);
      case "SYSTEM_EVENT": return this.onSystemEvent(payload);
      case "AUDIO_STREAM": return this.onAgentAudio(payload);
      case "VOICE_STATE_EVENT": return this.onVoiceState(payload);
      default: return undefined;
    }
  }

  // --- continuing the session on the next socket (protocol.md §3a) ---

  /* What the server heard the visitor say, kept with the turn it asks. */
  hear({ role, text }) {
    const said = role === "user" && typeof text === "string" ? text.trim() : "";
    if (said) this.heardText = this.heardText ? this.heardText + " " + said : said;
  }

  handled(seq) {
    this.lastSeq = seq;
    this.wire.lastSeq = seq;
    this.keepResume();
  }

  /*
   * The conversation of this tab's session, read from the server with the
   * token of this socket (or the one kept for the next): {sessionId,
   * messages: [{role: user|assistant|tool|error, text or name, turn}],
   * truncated}, the newest 200 entries. Null when there is nothing to
   * read: no token, a server that knows no conversation for it, a failed
   * request. Reading spends nothing (protocol.md §3b).
   */
  async history() {
    const kept = this.resumeKey ? readResume(this.resumeKey) : null;
    const token = this.resumeToken || (kept && kept.token);
    return token ? this.readConversation({ token }) : null;
  }

  /*
   * The visitor's latest conversation (the visitorToken's, protocol.md
   * §3c), as history() gives a session's, with its startedAt: what a later
   * visit, or another device, shows of the last one. Null without a
   * visitor token or a conversation.
   */
  async lastConversation() {
    return this.visitorToken ? this.readConversation({ visitorToken: this.visitorToken }) : null;
  }

  async readConversation(credentials) {
    try {
      const answer = await fetch(conversationAddress(this.endpoint), {
        method: "POST", body: JSON.stringify({ apiKey: this.apiKey, ...credentials }), cache: "no-store",
      });
      return answer.ok ? checkedHistory(await answer.json()) : null;
    } catch (err) {
      return null;
    }
  }

  /*
   * Keep, for the next socket of this tab, the token, the last frame
   * handled, the turn's text and the question it answers.
   */
  keepResume() {
    if (!this.resumeKey || !this.resumeToken) return;
    const kept = { token: this.resumeToken };
    if (this.lastSeq !== null) {
      kept.lastSeq = this.lastSeq;
      kept.text = this.agentText;
      kept.busy = this.turnOpen;
      if (this.pendingInput) kept.input = this.pendingInput;
      if (this.heardText) kept.heard = this.heardText;
    }
    tabStorage("set", this.resumeKey, JSON.stringify(kept));
  }

  forgetResume() {
    this.resumeToken = null;
    this.lastSeq = null;
    this.wire.lastSeq = null;
    this.pendingInput = null;
    if (this.resumeKey) tabStorage("remove", this.resumeKey);
  }

  /*
   * Whether the server takes up where this tab left off: the session went
   * on and the ACK's number is the lastSeq offered, so that the frames that
   * follow are the ones the page has not handled yet.
   */
  takesUp(seq) {
    const offered = this.offered;
    return this.resumed && seq !== null && offered !== null && offered.lastSeq === seq;
  }

  onAck(payload, seq, meta) {
    if (this.acknowledged) return;
    clearTimeout(this.handshakeTimer);
    this.acknowledged = true;
    this.errorShown = false;
    this.sessionId = payload.sessionId;
    this.wire.sessionId = payload.sessionId;
    this.resumed = payload.resumed === true;
    const continued = this.takesUp(seq);
    // The question whose turn had not ended: this page's, or after a reload the tab's.
    const question = this.pendingInput || (this.offered && this.offered.input) || null;
    let unanswered = null;
    let partial = "";
    if (continued) {
      // After a reload this page's memory is empty: the tab kept the turn.
      this.agentText = this.offered.text;
      this.heardText = this.offered.heard;
      this.turnOpen = this.offered.busy || question !== null;
      this.pendingInput = question;
    } else {
      // A turn cut off here will not go on: its frames are not coming. A
      // question may have been taken and its turn cut: it is not sent again.
      partial = this.agentText || (this.offered && this.offered.text) || "";
      this.agentText = "";
      this.heardText = "";
      this.turnOpen = false;
      this.pendingInput = null;
      unanswered = question;
    }
    this.lastSeq = seq;
    this.wire.lastSeq = seq;
    this.resumeToken = payload.resumeToken || null;
    if (this.resumeToken) this.keepResume();
    // No token: this session cannot be continued, and an older one is spent.
    else if (this.resumeKey) tabStorage("remove", this.resumeKey);
    this.maxActiveTools = payload.maxActiveTools || DEFAULT_MAX_ACTIVE_TOOLS;
    this.capabilities = payload.capabilities.slice();
    this.setVoiceState(this.voiceAvailable ? "ready" : "off");
    // A turn that goes on is still being answered.
    this.setState(this.turnOpen ? "thinking" : "connected");
    if (this.turnOpen) this.setActivity("thinking");
    // The turn that goes on, as this tab last showed it: its question (typed, or as heard) and its text so far.
    const connected = { sessionId: payload.sessionId, resumed: this.resumed, continued };
    if (continued && this.turnOpen) connected.turn = this.openTurn();
    this.emit("connected", connected);
    this.contextDirty = true;
    this.flushContext();
    if (continued) this.sendLostInput(meta);
    if (unanswered) {
      this.wire.unanswered += 1;
      const content = unanswered.payload.content;
      this.emit("unanswered", { id: unanswered.id, text: typeof content === "string" ? content : "", partial });
    }
  }

  /*
   * After the context (the tools the question may need): the question the
   * drop may have lost, when the session did not take it (its last input
   * has another id). Sent as it was, id included: the server takes one id
   * once.
   */
  sendLostInput(meta) {
    const question = this.pendingInput;
    if (!question) return;
    const taken = meta && typeof meta.lastInput === "string" ? meta.lastInput : null;
    if (taken === question.id) return;  // taken: its answer follows as numbered frames
    if (this.sendFrame(question)) this.wire.resent += 1;
  }

  /* The open turn as this tab shows it: {question, text}, and voice: true
   * when the question is the utterance the server heard. */
  openTurn() {
    const typed = inputText(this.pendingInput);
    if (typed || !this.heardText) return { question: typed, text: this.agentText };
    return { question: this.heardText, text: this.agentText, voice: true };
  }

  /* The turn is over: "agent" tells its whole text, done, and what ended it
   * (operator: a person answered; cut: a barge-in stopped it there). */
  endTurn(marks) {
    const text = this.agentText;
    this.turnOpen = false;
    this.pendingInput = null;
    this.agentText = "";
    this.heardText = "";
    this.emit("agent", { text, done: true, ...marks });
    if (this.wire.state === "thinking") this.setState("connected");
    this.rest();
  }

  onAgentResponse(payload) {
    if (payload.done) {
      // The closing frame carries the complete text; an empty one ends the
      // turn and keeps what the deltas built.
      if (payload.chunk) this.agentText = payload.chunk;
      // A person answering in the agent's place says who (protocol.md §5b).
      this.endTurn(payload.operator ? { operator: payload.operator } : {});
      return;
    }
    if (!payload.chunk) return;
    this.agentText += payload.chunk;
    this.emit("agent", { text: this.agentText, done: false });
  }

  onSystemEvent(payload) {
    const data = payload.data || {};
    switch (payload.kind) {
      case "error":
        // A voice turn the server gave up on: no voice will follow.
        this.agentTurnOpen = false;
        if (AUDIO_REFUSALS.includes(data.code)) this.abandonUtterance();
        this.settleVoice();
        this.errorShown = true;
        this.emit("error", { message: payload.message || "The assistant reported an error.", data });
        return;
      case "tools_effective":
        this.toolsEffective = data;
        this.emit("tools", data);
        return;
      case "transcript":
        this.hear(data);
        this.emit("transcript.delta", data);
        return;
      case "reload":
        this.emit("system", payload);
        location.reload();
        return;
      case "redirect":
        this.emit("system", payload);
        this.redirect(data.url);
        return;
      case "disconnect":
        // The server ended the session: do not come back on our own, unless
        // the close that follows is 1001 (the server process is stopping and
        // another one will take the page: see closed()).
        this.stopped = true;
        this.endedByServer = true;
        this.clearRetry();
        this.errorShown = true;
        this.rest();
        // ended: a goodbye from the server, which a page may show as a notice.
        this.emit("error", { message: payload.message || "The session was ended.", data, ended: true });
        return;
      default: // waiting, approval_required: informative only
        this.emit("system", payload);
    }
  }

  redirect(url) {
    if (typeof url !== "string" || !url) return;
    let target;
    try {
      target = new URL(url, location.href);
    } catch (err) {
      console.warn("owllayer: ignored a redirect to an unreadable url");
      return;
    }
    // Only web pages: a javascript: or data: url would run in this page.
    if (target.protocol !== "http:" && target.protocol !== "https:") {
      console.warn("owllayer: ignored a redirect to a non-http url");
      return;
    }
    location.assign(target.href);
  }

  // --- voice (protocol.md, voice) ---

  get voiceAvailable() {
    return this.acknowledged && this.capabilities.includes("audio");
  }

  get voiceState() {
    return this.wire.voice.state;
  }

  setVoiceState(state) {
    if (this.wire.voice.state === state) return;
    this.wire.voice.state = state;
    this.emit("voice", state);
  }

  /* The state the voice rests in when nothing changes it. */
  settleVoice() {
    if (!this.voiceAvailable) return this.setVoiceState("off");
    if (this.listening) return this.setVoiceState("listening");
    if (this.playing.size) return this.setVoiceState("speaking");
    if (this.agentTurnOpen) return this.setVoiceState("waiting");
    return this.setVoiceState("ready");
  }

  /*
   * Open the microphone (once) and start an utterance: AUDIO_STREAM chunks
   * go up until stopListening(). Speaking while the agent's voice plays is
   * a barge-in. Resolves true when listening; false, with an "error" event,
   * when voice is not offered or the microphone is refused.
   */
  async startListening() {
    if (!this.voiceAvailable) {
      this.emit("error", { message: "The assistant does not take voice on this connection." });
      return false;
    }
    // A user gesture may be calling: let the agent's voice play later.
    this.ensurePlayer();
    if (this.listening) return true;
    try {
      await this.openMicrophone();
    } catch (err) {
      this.emit("error", { message: "The microphone is not available: " + errorText(err), data: { code: "microphone" } });
      return false;
    }
    if (!this.voiceAvailable) return false;
    // Speaking again while the agent answers or speaks cuts it off.
    if (this.playing.size || this.agentTurnOpen) this.interrupt();
    this.beginUtterance();
    return true;
  }

  /* preroll: begin with the last moments before now (a barge-in's first words). */
  beginUtterance(preroll = false) {
    if (this.listening || !this.mic) return;
    this.listening = true;
    this.ending = false;
    // A new utterance asks a turn of its own.
    this.heardText = "";
    this.wire.voice.utterances += 1;
    this.mic.node.port.postMessage({ type: "start", preroll });
    clearTimeout(this.utteranceTimer);
    this.utteranceTimer = setTimeout(() => this.stopListening("timeout"), this.voiceOptions.maxUtteranceMs);
    this.settleVoice();
  }

  /* The server refused this utterance: stop sending it, without an end. */
  abandonUtterance() {
    this.listening = false;
    this.ending = false;
    clearTimeout(this.utteranceTimer);
    this.utteranceTimer = null;
  }

  /* End the utterance: what is left goes up, then VOICE_INPUT_END {reason}. */
  stopListening(reason = "user_stop") {
    if (!this.listening) return false;
    this.listening = false;
    clearTimeout(this.utteranceTimer);
    this.utteranceTimer = null;
    // The answer to this utterance is a new agent turn: its audio plays.
    this.muted = false;
    this.agentTurnOpen = true;
    this.endReason = reason;
    if (this.mic) {
      this.ending = true;
      this.mic.node.port.postMessage({ type: "flush" });
    } else {
      this.sendInputEnd();
    }
    this.settleVoice();
    return true;
  }

  sendInputEnd() {
    this.ending = false;
    if (!this.send("VOICE_INPUT_END", { reason: this.endReason || "user_stop" })) return;
    this.turnOpen = true;
    this.setState("thinking");
    this.setActivity("thinking");
  }

  async openMicrophone() {
    if (this.mic) return this.mic;
    if (!this.micOpening) {
      this.micOpening = this.createMicrophone().finally(() => {
        this.micOpening = null;
      });
    }
    return this.micOpening;
  }

  async createMicrophone() {
    const generation = this.generation;
    const stream = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true },
    });
    let context;
    try {
      // A 16 kHz context lets the browser resample; the worklet copes with any rate.
      try {
        context = new AudioContext({ sampleRate: this.voiceOptions.captureRate });
      } catch (err) {
        context = new AudioContext();
      }
      await context.audioWorklet.addModule(WORKLET_URL);
      const source = context.createMediaStreamSource(stream);
      const node = new AudioWorkletNode(context, "owllayer-capture", {
        numberOfInputs: 1, numberOfOutputs: 0, channelCount: 1, channelCountMode: "explicit",
        processorOptions: {
          chunkSamples: MIC_CHUNK_SAMPLES, threshold: this.voiceOptions.bargeInLevel,
          speechMs: this.voiceOptions.bargeInMs,
          prerollSamples: Math.round(MIC_RATE * this.voiceOptions.bargeInPrerollMs / 1000),
        },
      });
      node.port.onmessage = (event) => this.onMicMessage(event.data);
      source.connect(node);
      if (context.state === "suspended") await context.resume();
      if (generation !== this.generation) throw new Error("the connection changed");
      this.mic = { stream, context, source, node };
      this.wire.voice.micRate = context.sampleRate;
      return this.mic;
    } catch (err) {
      stream.getTracks().forEach((track) => track.stop());
      if (context) context.close().catch(() => {});
      throw err;
    }
  }

  onMicMessage(message) {
    if (!message) return;
    if (message.type === "chunk") {
      this.wire.voice.micChunks += 1;
      if ((this.listening || this.ending) && message.pcm.byteLength) {
        const data = base64FromBytes(new Uint8Array(message.pcm));
        if (this.send("AUDIO_STREAM", { data, mimeType: MIC_MIME })) {
          this.wire.voice.sentChunks += 1;
          this.wire.voice.sentBytes += message.pcm.byteLength;
        }
      }
      if (message.final && this.ending) this.sendInputEnd();
    } else if (message.type === "speech") {
      // Barge-in: the user speaks over the agent's voice.
      if (this.playing.size && !this.listening) {
        this.wire.voice.bargeIns += 1;
        this.interrupt();
        this.beginUtterance(true);
      }
    }
  }

  /* Release the microphone; an utterance still open ends as the user's stop. */
  closeMicrophone() {
    if (this.listening) this.stopListening("user_stop");
    if (this.ending) this.sendInputEnd();
    clearTimeout(this.utteranceTimer);
    const mic = this.mic;
    this.mic = null;
    if (mic) {
      mic.node.port.onmessage = null;
      mic.source.disconnect();
      mic.stream.getTracks().forEach((track) => track.stop());
      mic.context.close().catch(() => {});
    }
    this.settleVoice();
  }

  /* Barge-in: silence the agent at once and tell the server. */
  interrupt() {
    const wasSpeaking = this.playing.size > 0 || this.agentTurnOpen;
    this.stopPlayback();
    this.muted = true;
    this.agentTurnOpen = false;
    if (wasSpeaking && this.send("VOICE_INTERRUPT", { reason: "barge_in" })) {
      this.wire.voice.interrupts += 1;
      this.emit("voice.interrupt", { reason: "barge_in" });
    }
    this.settleVoice();
    return wasSpeaking;
  }

  ensurePlayer() {
    if (!this.player) {
      // The device's own rate: the 24 kHz buffers are resampled by the browser.
      this.player = new AudioContext();
    }
    if (this.player.state === "suspended") this.player.resume().catch(() => {});
    return this.player;
  }

  onAgentAudio(payload) {
    const voice = this.wire.voice;
    voice.receivedChunks += 1;
    const rate = pcmRate(payload.mimeType);
    if (this.muted || !rate) {
      voice.ignoredChunks += 1;
      return;
    }
    let bytes;
    try {
      bytes = bytesFromBase64(payload.data);
    } catch (err) {
      voice.ignoredChunks += 1;
      return;
    }
    const samples = Math.floor(bytes.length / 2);
    if (!samples) return;
    const player = this.ensurePlayer();
    const buffer = player.createBuffer(1, samples, rate);
    const channel = buffer.getChannelData(0);
    const view = new DataView(bytes.buffer, bytes.byteOffset, samples * 2);
    for (let i = 0; i < samples; i++) channel[i] = view.getInt16(i * 2, true) / 0x8000;
    const source = player.createBufferSource();
    source.buffer = buffer;
    source.connect(player.destination);
    // Each chunk starts where the previous one ends; one late is a gap.
    const now = player.currentTime;
    if (this.playAt < now) {
      if (this.playing.size) voice.gaps += 1;
      this.playAt = now + PLAYBACK_LEAD_S;
    }
    const number = ++voice.scheduledChunks;
    source.onended = () => {
      if (!this.playing.delete(source)) return;
      voice.playedChunks += 1;
      voice.played.push(number);
      if (voice.played.length > MAX_LOGGED_FRAMES) voice.played.shift();
      this.settleVoice();
    };
    source.start(this.playAt);
    this.playAt += buffer.duration;
    this.playing.add(source);
    this.agentTurnOpen = true;
    this.settleVoice();
  }

  stopPlayback() {
    for (const source of this.playing) {
      source.onended = null;
      try {
        source.stop();
      } catch (err) {
        // Never started: nothing to stop.
      }
      this.wire.voice.stoppedChunks += 1;
    }
    this.playing.clear();
    this.playAt = 0;
  }

  onVoiceState(payload) {
    if (payload.event === "interrupted") {
      this.stopPlayback();
      this.muted = false;
      // A barge-in ends the turn being answered, with no done frame (protocol.md §5a).
      if (this.turnOpen) this.endTurn({ cut: true });
    }
    // The agent's turn is over; after turn_complete what is scheduled still plays to its end.
    this.agentTurnOpen = false;
    this.emit("voice.event", Object.assign({}, payload));
    this.settleVoice();
  }

  // --- tool calls and approvals ---

  onToolCall({ callId, name, args }) {
    const tool = this.tools[name];
    const problem = tool ? argumentsError(tool.parameters, args, "args") : null;
    if (!tool || problem) {
      // Nothing runs and nobody is asked, hence risk "none".
      this.emit("tool.start", { name, callId, args, risk: "none" });
      this.openCall(callId, name, "running");
      const error = tool ? "invalid arguments: " + problem : "unknown tool: " + name;
      this.toolResult(callId, { error });
      this.toolDone(name, callId, { error });
      return;
    }
    this.emit("tool.start", { name, callId, args, risk: tool.risk });
    if (APPROVAL_RISKS.includes(tool.risk)) {
      this.openCall(callId, name, "queued");
      this.askBeforeRunning(tool, args, callId);
      return;
    }
    this.openCall(callId, name, "running");
    this.runTool(tool, args, callId, (outcome) => this.toolResult(callId, outcome));
  }

  // protocol.md §6-7: suspend before the handler runs and ask; no TOOL_RESULT follows.
  askBeforeRunning(tool, args, callId) {
    const message = tool.approvalMessage ? tool.approvalMessage(args) : "";
    const request = {
      callId, toolName: tool.name, risk: tool.risk, args,
      message: message || "Allow " + tool.name + "?",
    };
    this.send("APPROVAL_REQUEST", request);
    this.askUser(request, (approved) => {
      if (!approved) {
        this.send("APPROVAL_RESPONSE", { callId, approved: false, error: DENIED_BY_USER });
        this.toolDone(tool.name, callId, { error: DENIED_BY_USER, denied: true });
        return;
      }
      this.movePhase(callId, "running");
      this.runTool(tool, args, callId, (outcome) => {
        const response = { callId, approved: true };
        if ("error" in outcome) response.error = outcome.error;
        else response.result = outcome.result;
        this.send("APPROVAL_RESPONSE", response);
      });
    });
  }

  onServerApproval(payload) {
    this.openCall(payload.callId, payload.toolName, "queued", true);
    this.askUser(payload, (approved) => {
      const response = { callId: payload.callId, approved };
      if (!approved) response.error = DENIED_BY_USER;
      this.send("APPROVAL_RESPONSE", response);
      this.closeCall(payload.callId);
    });
  }

  /* Run a handler; answer(outcome) gets {result} or {error}, on this connection only. */
  runTool(tool, args, callId, answer) {
    const generation = this.generation;
    Promise.resolve()
      .then(() => tool.handler(args, { callId }))
      .then((result) => ({ result: result === undefined ? null : result }),
        (err) => ({ error: errorText(err) }))
      .then((outcome) => {
        // The call belonged to a connection that is gone; the server already
        // closed it as disconnected.
        if (generation !== this.generation) return;
        answer(outcome);
        this.toolDone(tool.name, callId, outcome);
      });
  }

  /* The answer has been sent: tell the page, then let the activity move on. */
  toolDone(name, callId, outcome) {
    this.emit("tool", { name, callId, outcome });
    this.closeCall(callId);
  }

  toolResult(callId, outcome) {
    if ("error" in outcome) {
      this.send("TOOL_RESULT", { callId, status: "error", result: null, error: outcome.error });
    } else {
      this.send("TOOL_RESULT", { callId, status: "success", result: outcome.result });
    }
  }

  // One dialog at a time; the others wait their turn.
  askUser(request, decide) {
    this.approvalQueue.push({ request, decide, generation: this.generation });
    this.emit("approval", request);
    this.nextApproval();
  }

  nextApproval() {
    if (this.openApproval || !this.approvalQueue.length) return;
    const item = this.approvalQueue.shift();
    let decided = false;
    // Before showing: a showApproval option may decide at once.
    this.movePhase(item.request.callId, "approval");
    const handle = this.showApproval(item.request, (approved) => {
      decided = true;
      this.openApproval = null;
      if (item.generation === this.generation) item.decide(approved);
      this.emit("approval.decided", { callId: item.request.callId, approved });
      this.nextApproval();
    });
    // A decision taken inside showApproval already freed the slot.
    if (!decided) this.openApproval = handle;
  }

  dismissApprovals() {
    this.approvalQueue = [];
    if (this.openApproval) {
      this.openApproval.dismiss();
      this.openApproval = null;
    }
  }
}

export default OwlLayerClient;
