/*
 * OwlLayer widget v1: one <script> tag puts a chat assistant on any page.
 *
 *   <script type="module" src="https://SERVER/widget/RELEASE/owllayer-widget.js"
 *           integrity="sha384-..." crossorigin="anonymous" data-api-key="pk_live_..."></script>
 *
 * (the console's key page gives the tag with the release and hash filled in)
 *
 * A launcher bubble and a chat panel, built on the browser client
 * (owllayer-client.js, beside this file) and drawn inside the shadow root of
 * one <owllayer-widget> element, so the page's CSS cannot reach them and
 * theirs cannot reach the page. Styles come as a constructable stylesheet
 * (adoptedStyleSheets): no <style> element, no style attribute, no inline
 * script or event handler, no eval, so a strict Content-Security-Policy
 * lets it run (docs/widget.md lists the directives).
 *
 * The agent's answers are Markdown drawn as DOM nodes (owllayer-markdown.js:
 * the model's text only ever becomes text nodes). A page tool of risk high
 * or critical waits for the visitor's answer in a modal dialog (Escape
 * denies). The conversation goes on across reloads: the client offers its
 * resume token, and the widget reads the earlier messages back from the
 * server (client.history()).
 *
 * Before drawing anything it reads its key's appearance from this file's
 * server (GET /widget/appearance?key=...; the defaults when that fails): the
 * assistant's name, a greeting (shown here, never sent), the accent colour,
 * the corner, the language of the widget's own sentences (English or
 * French) and up to four suggested prompts. A page may give its own
 * instead (start's appearance option, setAppearance; the console's preview
 * draws its form's unsaved values so).
 *
 * The one global is window.OwlLayer, the same object as this module's
 * exports (docs/widget.md; owllayer-widget.d.ts types it). Options on the
 * script tag: data-api-key (starts the widget), data-endpoint (the AITP
 * WebSocket; default: this file's server at /owllayer), data-title.
 */
import { OwlLayerClient, answerOnce } from "./owllayer-client.js";
import { renderMarkdown } from "./owllayer-markdown.js";

export const WIDGET_VERSION = "1";
const OPEN_KEY = "owllayer-widget-open";
const EVENTS = ["ready", "message", "open", "close", "error"];
const NARROW = "(max-width: 599px)";
// The client's states after which it sends nothing more (until the page is reloaded).
const ENDED_STATES = ["closed", "error"];

const CSS = `
:host{all:initial!important;display:block!important;position:fixed!important;z-index:2147483000!important;
right:20px!important;bottom:20px!important;width:auto!important;height:auto!important;visibility:visible!important;
opacity:1!important;font:15px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif!important;color-scheme:light dark}
*{box-sizing:border-box}
[hidden]{display:none!important}
.w{--bg:#fff;--fg:#1d2230;--muted:#5b6273;--line:#d5d9e1;--accent:#1f5fd1;--on-accent:#fff;--me:#e8effc;
--bot:#f3f4f7;--danger:#a3201b;--danger-bg:#fde2e1;color:var(--fg);font:inherit}
@media (prefers-color-scheme:dark){.w{--bg:#181b22;--fg:#e9ebf0;--muted:#a5acba;--line:#343a47;--accent:#7aa7ff;
--on-accent:#0b1020;--me:#233454;--bot:#242833;--danger:#ffb4ab;--danger-bg:#4a1d1a}}
button,input,textarea{font:inherit;color:inherit}
.launcher{position:relative;width:56px;height:56px;border-radius:50%;border:0;cursor:pointer;background:var(--accent);
color:var(--on-accent);box-shadow:0 6px 20px rgba(0,0,0,.25);display:grid;place-items:center;padding:0}
.launcher svg{width:26px;height:26px;fill:currentColor}
.badge{position:absolute;top:-4px;right:-4px;min-width:20px;height:20px;padding:0 5px;border-radius:10px;
background:#d93025;color:#fff;font-size:12px;line-height:20px;text-align:center;font-weight:600}
.panel{position:absolute;right:0;bottom:0;width:380px;height:min(600px,calc(100vh - 40px));display:flex;
flex-direction:column;background:var(--bg);border:1px solid var(--line);border-radius:14px;overflow:hidden;
box-shadow:0 12px 40px rgba(0,0,0,.28);transition:opacity .15s,transform .15s}
header{display:flex;align-items:center;gap:8px;padding:12px 14px;background:var(--accent);color:var(--on-accent)}
header h2{margin:0;font-size:16px;flex:1}
.status{font-size:12px}
.icon{border:0;background:none;cursor:pointer;width:32px;height:32px;border-radius:8px;font-size:20px;line-height:1}
.icon:hover,.icon:focus-visible{background:rgba(127,127,127,.3)}
header :focus-visible{outline-color:currentColor}
.log{flex:1;overflow-y:auto;padding:12px 14px;display:flex;flex-direction:column;gap:8px}
.msg{max-width:88%;padding:8px 12px;border-radius:12px;overflow-wrap:anywhere}
.msg p{margin:0 0 6px}.msg p:last-child{margin:0}.msg ul,.msg ol{margin:4px 0;padding-left:20px}
.msg pre{overflow:auto;background:rgba(127,127,127,.15);padding:6px;border-radius:6px}
.msg a{color:var(--accent)}
.user{align-self:flex-end;background:var(--me)}
.agent{align-self:flex-start;background:var(--bot)}
.greeting{white-space:pre-line}
.prompts{display:flex;flex-wrap:wrap;gap:6px;padding:0 14px 8px}
.prompt{border:1px solid var(--accent);background:var(--bg);color:var(--fg);border-radius:16px;padding:5px 12px;
cursor:pointer;font-size:14px;text-align:left}
.prompt:hover{background:var(--bot)}
.who{display:block;font-size:12px;font-weight:600;color:var(--muted);margin-bottom:2px}
.note{align-self:center;font-size:13px;color:var(--muted);text-align:center}
.error{margin:0 14px 8px;padding:8px 10px;border-radius:8px;background:var(--danger-bg);color:var(--danger);font-size:14px}
form{display:flex;gap:8px;padding:10px 14px;border-top:1px solid var(--line)}
textarea{flex:1;resize:none;height:42px;padding:9px 10px;border:1px solid var(--line);border-radius:10px;background:var(--bg)}
.ended{flex:1;margin:0;padding:4px 2px;color:var(--muted);font-size:14px}
.send,.approve,.deny{border:1px solid var(--accent);background:var(--accent);color:var(--on-accent);border-radius:10px;
padding:0 16px;cursor:pointer;min-height:40px}
.deny{background:var(--bg);color:var(--fg);border-color:var(--line)}
.mic{border:1px solid var(--line);background:var(--bg);color:var(--fg);border-radius:10px;width:42px;min-height:40px;
padding:0;cursor:pointer;display:grid;place-items:center}
.mic svg{width:18px;height:18px;fill:currentColor}
.mic[aria-pressed=true]{background:var(--danger-bg);color:var(--danger);border-color:var(--danger)}
.cutoff{display:block;font-size:12px;color:var(--muted);margin-top:2px}
.tool{align-self:flex-start;font-size:13px;color:var(--muted);margin:0}
:focus-visible{outline:3px solid var(--accent);outline-offset:2px}
.sr{position:absolute;width:1px;height:1px;overflow:hidden;clip:rect(0 0 0 0);white-space:nowrap}
dialog{max-width:420px;width:calc(100vw - 32px);border:1px solid var(--line);border-radius:12px;padding:18px 20px;
background:var(--bg);color:var(--fg);box-shadow:0 12px 40px rgba(0,0,0,.3)}
dialog::backdrop{background:rgba(15,18,28,.5)}
dialog h2{margin:0 0 8px;font-size:18px}
dialog dl{display:grid;grid-template-columns:auto 1fr;gap:4px 12px;margin:10px 0}
dialog dt{color:var(--muted)}dialog dd{margin:0;font-weight:600;overflow-wrap:anywhere}
.risk{display:inline-block;padding:1px 8px;border-radius:9px;background:var(--danger-bg);color:var(--danger);
font-size:12px;text-transform:uppercase;letter-spacing:.04em}
.warning{margin:8px 0;padding:8px 10px;border-radius:8px;background:var(--danger-bg);color:var(--danger);font-weight:600}
.buttons{display:flex;gap:10px;justify-content:flex-end;margin-top:14px}
:host([data-position=left]){right:auto!important;left:20px!important}
:host([data-position=left]) .panel{right:auto;left:0}
@media (max-width:599px){:host{right:12px!important;bottom:12px!important}
:host([data-position=left]){right:auto!important;left:12px!important}
.panel{position:fixed;inset:0;width:auto;height:auto;border-radius:0;border:0}}
@media (prefers-reduced-motion:reduce){*{transition:none!important;animation:none!important;scroll-behavior:auto!important}}
`;

const ICON_PATH = "M4 4h16a2 2 0 0 1 2 2v10a2 2 0 0 1-2 2H9l-5 4v-4H4a2 2 0 0 1-2-2V6a2 2 0 0 1 2-2z";
const MIC_PATH = "M12 14a3 3 0 0 0 3-3V5a3 3 0 0 0-6 0v6a3 3 0 0 0 3 3zm5-3a5 5 0 0 1-10 0H5a7 7 0 0 0 6 "
  + "6.92V21h2v-3.08A7 7 0 0 0 19 11h-2z";
// The client's error for a call the visitor denied: the approval's own note says so already.
const DENIED_BY_USER = "Action denied by user";
const NBSP = "\u00a0";

/* Every sentence the widget says itself, in each language a key may choose
 * (widget/appearance.py LANGUAGES). The agent's words are the model's. */
const WORDS = {
  en: {
    assistant: "Assistant",
    openChat: "Open chat",
    unread: (count) => "Open chat (" + count + " unread)",
    closeChat: "Close chat",
    conversation: "Conversation",
    message: "Message",
    placeholder: "Ask a question\u2026",
    ended: {
      closed: "This conversation has ended. Reload the page to start another.",
      error: "The assistant cannot take messages now.",
    },
    send: "Send",
    suggestions: "Suggested questions",
    states: {
      connecting: "Connecting\u2026", connected: "Online", thinking: "Writing\u2026",
      reconnecting: "Reconnecting\u2026", error: "Offline", closed: "Offline",
    },
    working: (tool) => "Working: " + tool + "\u2026",
    waiting: "Waiting for your answer",
    unanswered: (text) => "Your message \u201c" + text + "\u201d was not answered. Please send it again.",
    lastVisit: (when) => "Your last conversation" + (when ? ", " + when : "")
      + ". The assistant remembers what you asked then.",
    operator: (name) => name + " (support team)",
    approveTitle: "Approve this action?",
    // The client's question when the tool gives none (owllayer-client.js askBeforeRunning).
    allow: (tool) => "Allow " + tool + "?",
    details: "Details",
    risk: "Risk: ",
    riskNames: { high: "high", critical: "critical" },
    riskWords: {
      high: "it changes something for you",
      critical: "it may spend money or cannot be undone",
    },
    approve: "Approve",
    deny: "Deny",
    approved: "You approved: ",
    denied: "You denied: ",
    yes: "yes", no: "no", none: "none",
    speak: "Speak to the assistant",
    stopListening: "Stop and send what you said",
    interrupt: "Interrupt and speak",
    listening: "Listening\u2026 press the microphone again to send.",
    speaking: "Speaking\u2026 talk or press the microphone to interrupt.",
    cutOff: "(cut off)",
    toolDone: (tool) => "Done: " + tool,
    toolFailed: (tool) => "Failed: " + tool,
    somethingWrong: "Something went wrong.",
    // The error codes a visitor may meet, in words (docs/protocol.md §9).
    errors: {
      origin_not_allowed: "The assistant is not set up for this site.",
      invalid_api_key: "The assistant is not set up correctly on this site.",
      api_key_revoked: "The assistant is no longer available on this site.",
      api_key_disabled: "The assistant is switched off for now.",
      api_key_expired: "The assistant is no longer available on this site.",
      session_limit: "The assistant is busy right now. Please try again in a few minutes.",
      tenant_session_limit: "The assistant is busy right now. Please try again in a few minutes.",
      usage_limit_exceeded: "The assistant cannot answer any more this month.",
      turn_in_progress: "Please wait for the answer before sending another message.",
      microphone: "The microphone is not available: allow it for this site in the browser, or type instead.",
    },
  },
  fr: {
    assistant: "Assistant",
    openChat: "Ouvrir la discussion",
    unread: (count) => "Ouvrir la discussion (" + count + (count === 1 ? " non lu)" : " non lus)"),
    closeChat: "Fermer la discussion",
    conversation: "Conversation",
    message: "Message",
    placeholder: "Posez une question\u2026",
    ended: {
      closed: "Cette conversation est terminée. Rechargez la page pour en commencer une autre.",
      error: "L\u2019assistant ne peut pas recevoir de messages pour le moment.",
    },
    send: "Envoyer",
    suggestions: "Questions suggérées",
    states: {
      connecting: "Connexion\u2026", connected: "En ligne", thinking: "Rédaction\u2026",
      reconnecting: "Reconnexion\u2026", error: "Hors ligne", closed: "Hors ligne",
    },
    working: (tool) => "En cours" + NBSP + ": " + tool + "\u2026",
    waiting: "En attente de votre réponse",
    unanswered: (text) => "Votre message \u00ab" + NBSP + text + NBSP + "\u00bb est resté sans réponse. "
      + "Veuillez le renvoyer.",
    lastVisit: (when) => "Votre dernière conversation" + (when ? ", " + when : "")
      + ". L\u2019assistant se souvient de ce que vous aviez demandé.",
    operator: (name) => name + " (équipe d\u2019assistance)",
    approveTitle: "Approuver cette action" + NBSP + "?",
    allow: (tool) => "Autoriser " + tool + NBSP + "?",
    details: "Détails",
    risk: "Risque" + NBSP + ": ",
    riskNames: { high: "élevé", critical: "critique" },
    riskWords: {
      high: "elle modifie quelque chose pour vous",
      critical: "elle peut dépenser de l\u2019argent ou être irréversible",
    },
    approve: "Approuver",
    deny: "Refuser",
    approved: "Vous avez approuvé" + NBSP + ": ",
    denied: "Vous avez refusé" + NBSP + ": ",
    yes: "oui", no: "non", none: "aucun",
    speak: "Parler à l\u2019assistant",
    stopListening: "Arrêter et envoyer ce que vous avez dit",
    interrupt: "Interrompre et parler",
    listening: "À l\u2019écoute\u2026 appuyez de nouveau sur le micro pour envoyer.",
    speaking: "Réponse parlée\u2026 parlez ou appuyez sur le micro pour l\u2019interrompre.",
    cutOff: "(interrompu)",
    toolDone: (tool) => "Fait" + NBSP + ": " + tool,
    toolFailed: (tool) => "Échec" + NBSP + ": " + tool,
    somethingWrong: "Une erreur s\u2019est produite.",
    errors: {
      origin_not_allowed: "L\u2019assistant n\u2019est pas configuré pour ce site.",
      invalid_api_key: "L\u2019assistant n\u2019est pas correctement configuré sur ce site.",
      api_key_revoked: "L\u2019assistant n\u2019est plus disponible sur ce site.",
      api_key_disabled: "L\u2019assistant est désactivé pour le moment.",
      api_key_expired: "L\u2019assistant n\u2019est plus disponible sur ce site.",
      session_limit: "L\u2019assistant est occupé. Veuillez réessayer dans quelques minutes.",
      tenant_session_limit: "L\u2019assistant est occupé. Veuillez réessayer dans quelques minutes.",
      usage_limit_exceeded: "L\u2019assistant ne peut plus répondre ce mois-ci.",
      turn_in_progress: "Veuillez attendre la réponse avant d\u2019envoyer un autre message.",
      microphone: "Le micro n\u2019est pas disponible" + NBSP + ": autorisez-le pour ce site dans le navigateur, "
        + "ou écrivez plutôt.",
    },
  },
};

// A key's appearance when its server does not say (widget/appearance.py DEFAULTS).
const DEFAULT_APPEARANCE = Object.freeze({
  name: "", greeting: "", accent: "", position: "right", language: "en", prompts: Object.freeze([]),
});
const ACCENT = /^#[0-9a-f]{6}$/i;
// How long the widget waits for its appearance before drawing with the defaults.
const APPEARANCE_WAIT_MS = 4000;

function el(tag, attributes = {}, children = []) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (name === "text") node.textContent = value;
    else if (value === true) node.setAttribute(name, "");
    else if (value !== false && value !== null && value !== undefined) node.setAttribute(name, value);
  }
  node.append(...children);
  return node;
}

function icon(shape = ICON_PATH) {
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", "0 0 24 24");
  svg.setAttribute("aria-hidden", "true");
  const path = document.createElementNS("http://www.w3.org/2000/svg", "path");
  path.setAttribute("d", shape);
  svg.append(path);
  return svg;
}

function remembered(key) {
  try {
    return window.sessionStorage.getItem(key);
  } catch (err) {
    return null;
  }
}

function remember(key, value) {
  try {
    window.sessionStorage.setItem(key, value);
  } catch (err) {
    // Storage refused (a private window): the widget still works.
  }
}

/* "unitPrice" -> "Unit price", "order_id" -> "Order id". */
export function labelOf(name) {
  const words = String(name).replace(/([a-z0-9])([A-Z])/g, "$1 $2").replace(/[_-]+/g, " ").trim().toLowerCase();
  return words.charAt(0).toUpperCase() + words.slice(1);
}

/* An argument's value in words: numbers as the visitor's locale writes them,
 * lists joined; yes, no and none in the widget's language ("en" or "fr"). */
export function valueInWords(value, language = "en") {
  const words = WORDS[language] || WORDS.en;
  if (typeof value === "number") return value.toLocaleString(undefined, { maximumFractionDigits: 6 });
  if (typeof value === "boolean") return value ? words.yes : words.no;
  if (value === null || value === undefined) return words.none;
  if (Array.isArray(value)) return value.map((v) => valueInWords(v, language)).join(", ") || words.none;
  if (typeof value === "object") {
    return Object.entries(value).map(([k, v]) => labelOf(k) + " " + valueInWords(v, language)).join(", ");
  }
  return String(value);
}

/* White or near-black, whichever reads better on the colour "#rrggbb" (WCAG's contrast ratio). */
function textColourOn(accent) {
  const channel = (at) => {
    const c = parseInt(accent.slice(at, at + 2), 16) / 255;
    return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4;
  };
  const luminance = 0.2126 * channel(1) + 0.7152 * channel(3) + 0.0722 * channel(5);
  const nearBlack = 0.0056; // #111111
  return 1.05 / (luminance + 0.05) >= (luminance + 0.05) / (nearBlack + 0.05) ? "#ffffff" : "#111111";
}

/* What the server said of the key's appearance, each field checked again
 * (a field it did not say, or not as expected, is the default's). */
function appearanceOf(data) {
  const given = data && typeof data === "object" ? data : {};
  const text = (value, longest) => (typeof value === "string" && value.length <= longest ? value.trim() : "");
  return {
    name: text(given.name, 40),
    greeting: text(given.greeting, 300),
    accent: typeof given.accent === "string" && ACCENT.test(given.accent) ? given.accent : "",
    position: given.position === "left" ? "left" : "right",
    language: Object.hasOwn(WORDS, given.language) ? given.language : "en",
    prompts: Array.isArray(given.prompts) ? given.prompts.map((p) => text(p, 80)).filter(Boolean).slice(0, 4) : [],
  };
}

/* The key's appearance from the widget's own server; the defaults when it cannot say. */
async function readAppearance(apiKey) {
  const address = new URL("/widget/appearance", import.meta.url);
  address.searchParams.set("key", apiKey);
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), APPEARANCE_WAIT_MS);
  try {
    const answer = await fetch(address, { credentials: "omit", signal: controller.signal });
    return answer.ok ? appearanceOf(await answer.json()) : appearanceOf(DEFAULT_APPEARANCE);
  } catch (err) {
    return appearanceOf(DEFAULT_APPEARANCE);
  } finally {
    clearTimeout(timer);
  }
}

/* The script tag that loaded this file, or null (imported by a page's own
 * code). A tag naming /widget/v1/ was redirected here, to the newest 1.x.y
 * release: its src is this file's address with v1 for the release. */
function ownScript() {
  const here = import.meta.url;
  const unpinned = here.replace(/\/widget\/(\d+)\.\d+\.\d+\//, "/widget/v$1/");
  for (const script of document.querySelectorAll("script[src]")) {
    const src = new URL(script.getAttribute("src"), document.baseURI).href;
    if (src === here || src === unpinned) return script;
  }
  return null;
}

function defaultEndpoint() {
  const server = new URL(import.meta.url);
  return (server.protocol === "https:" ? "wss://" : "ws://") + server.host + "/owllayer";
}

/* A page's own sentence, trimmed; "" when it gave none. */
function ownWords(value) {
  return typeof value === "string" ? value.trim() : "";
}

/* The messages before the turn that goes on: the server may hold its
 * question (from the last one asking `question`) and some of its answer. */
function beforeTurn(messages, question) {
  for (let at = messages.length - 1; at >= 0; at--) {
    if (messages[at].role !== "user") continue;
    if (!question) return messages.slice(0, at + 1); // the question is not known here: it stays
    return messages[at].text === question ? messages.slice(0, at) : messages;
  }
  return messages;
}

class Widget {
  constructor() {
    this.listeners = {};
    this.tools = [];
    this.context = null;
    this.client = null;
    this.pendingSends = [];
    this.isOpen = false;
    this.unread = 0;
    this.readyDetail = null;
    this.shownError = null;
    this.lastVisitAsked = false;
    this.current = null;
    // Of the turn's text, what bubbles before a page tool's line hold.
    this.shownBefore = 0;
    // The last answer drawn (a barge-in marks it cut off), the utterance heard.
    this.lastAnswer = null;
    this.heard = null;
    this.approval = null;
    this.started = false;
    this.wantOpen = false;
    this.appearance = appearanceOf(DEFAULT_APPEARANCE);
    this.words = WORDS.en;
    this.greeting = null;
    this.prompts = null;
    this.promptsUsed = false;
    this.givenTitle = "";
    // The page's own appearance (start's option or setAppearance), not the key's.
    this.ownAppearance = false;
  }

  // --- the API ---

  on(event, listener) {
    if (!EVENTS.includes(event)) throw new Error("OwlLayer: unknown event " + event);
    (this.listeners[event] = this.listeners[event] || []).push(listener);
    // "ready" happened already, or an error is on show: the listener hears it at once.
    if (event === "ready" && this.readyDetail) this.call(listener, this.readyDetail, event);
    if (event === "error" && this.shownError) this.call(listener, this.shownError, event);
    return this;
  }

  off(event, listener) {
    this.listeners[event] = (this.listeners[event] || []).filter((l) => l !== listener);
    return this;
  }

  emit(event, detail) {
    for (const listener of (this.listeners[event] || []).slice()) this.call(listener, detail, event);
  }

  call(listener, detail, event) {
    try {
      listener(detail);
    } catch (err) {
      console.error("OwlLayer: a " + event + " listener failed", err);
    }
  }

  registerTool(tool, handler) {
    this.tools = this.tools.filter(([t]) => t.name !== tool.name).concat([[tool, handler]]);
    if (this.client) this.client.registerTool(tool, handler);
    return this;
  }

  unregisterTool(name) {
    this.tools = this.tools.filter(([t]) => t.name !== name);
    if (this.client) this.client.unregisterTool(name);
    return this;
  }

  setContext(context) {
    this.context = context;
    if (this.client) this.client.setContext(context);
    return this;
  }

  open() {
    if (!this.root) {
      this.wantOpen = true; // opened once drawn
      return this;
    }
    this.setOpen(true);
    this.input.focus();
    return this;
  }

  close() {
    this.wantOpen = false;
    if (this.root) this.setOpen(false);
    return this;
  }

  send(text) {
    text = String(text || "").trim();
    if (!text || (this.client && ENDED_STATES.includes(this.client.state))) return false;
    if (!this.client || !this.client.acknowledged) {
      this.pendingSends.push(text);
      this.hidePrompts();
      return true;
    }
    if (!this.client.sendText(text)) return false;
    this.hidePrompts();
    this.lastAnswer = null;
    this.addMessage("user", text);
    this.emit("message", { role: "user", text });
    return true;
  }

  /* Start the widget: the script tag's data-api-key does it; a page's own code may instead.
   * It draws once it has read the key's appearance (or given up on it), at
   * once when the page gives its own (options.appearance, setAppearance). */
  start(options = {}) {
    if (this.started) return this;
    if (!options.apiKey) throw new Error("OwlLayer.start needs an apiKey");
    this.started = true;
    if (options.appearance) this.setAppearance(options.appearance);
    const reading = this.ownAppearance ? Promise.resolve(null) : readAppearance(options.apiKey);
    reading.then((appearance) => this.begin(options, appearance));
    return this;
  }

  /* Look and speak this way from now on, whatever the key's appearance says;
   * the conversation stays. */
  setAppearance(look) {
    this.ownAppearance = true;
    this.appearance = appearanceOf(look);
    if (this.root) this.applyAppearance();
    return this;
  }

  begin(options, appearance) {
    if (!this.ownAppearance) this.appearance = appearance;
    this.givenTitle = options.title || "";
    this.mount();
    this.client = new OwlLayerClient({
      apiKey: options.apiKey,
      endpoint: options.endpoint || defaultEndpoint(),
      visitorToken: options.visitorToken || null,
      showApproval: (request, decide) => this.showApproval(request, decide),
      expose: false,
    });
    for (const [tool, handler] of this.tools) this.client.registerTool(tool, handler);
    if (this.context) this.client.setContext(this.context);
    this.listen(this.client);
    this.client.connect();
    if (this.wantOpen) this.open();
    else if (remembered(OPEN_KEY) === "open") this.setOpen(true);
  }

  /* What this page's connection saw, for support: the browser client's own
   * record (state, session, frames in and out, frames dropped and why,
   * voice counters), live; null before the widget started. */
  diagnostics() {
    return this.client ? this.client.wire : null;
  }

  // --- the client's events ---

  listen(client) {
    client.on("connected", (event) => this.onConnected(event));
    client.on("agent", (event) => this.onAgent(event));
    client.on("error", (event) => this.onError(event));
    client.on("state", (state) => this.onState(state));
    client.on("activity", (event) => this.onActivity(event));
    client.on("unanswered", (event) => {
      this.addNote(this.words.unanswered(event.text));
    });
    // A person was asked for: the server says how long it may take, or that nobody is free.
    client.on("system", (event) => {
      if (event.kind === "waiting" && event.message) this.addNote(event.message);
    });
    client.on("tool.start", () => this.splitAnswer());
    client.on("tool", (event) => this.onTool(event));
    client.on("voice", (state) => this.onVoice(state));
    client.on("transcript.delta", (event) => this.onTranscript(event));
    client.on("voice.interrupt", () => this.markCut());
    client.on("voice.event", (event) => {
      if (event.event === "interrupted") this.markCut();
    });
  }

  onConnected(event) {
    this.errorBox.hidden = true;
    this.shownError = null;
    const empty = !this.log.querySelector(".msg:not(.greeting)");
    if (event.resumed && empty) {
      // A reload in the middle of a turn: it goes on where this tab left it.
      if (event.turn) this.takeUpTurn(event.turn);
      this.showEarlier(event.turn);
    } else if (!event.resumed && empty && !this.lastVisitAsked) this.showLastVisit();
    if (!this.readyDetail) {
      this.readyDetail = { sessionId: event.sessionId, resumed: event.resumed };
      this.emit("ready", this.readyDetail);
    }
    const waiting = this.pendingSends.splice(0);
    for (const text of waiting) this.send(text);
  }

  /* The turn this tab was showing when it was left: its question, and its answer so far, which goes on. */
  takeUpTurn({ question, text, voice }) {
    this.lastAnswer = null;
    if (question) {
      this.hidePrompts();
      const asked = this.addMessage("user", question);
      if (voice) asked.dataset.voice = "true";
    }
    if (text.trim()) {
      this.current = this.addMessage("agent", "");
      this.drawAgent(this.current, text);
    }
    this.shownBefore = 0;
  }

  /* The session's earlier messages, read back; of a turn that goes on
   * (drawn by takeUpTurn and the frames that follow), nothing. */
  async showEarlier(turn) {
    const earlier = await this.client.history();
    if (!earlier) return;
    if (earlier.messages.length) this.hidePrompts();
    this.drawEarlier(turn ? beforeTurn(earlier.messages, turn.question) : earlier.messages);
  }

  /* A visitor the page vouches for (visitorToken), in a new tab or on another
   * device: their last conversation, above the new one, with when it was. */
  async showLastVisit() {
    this.lastVisitAsked = true;
    const last = await this.client.lastConversation();
    if (!last || !last.messages.length || last.sessionId === this.client.sessionId) return;
    const when = last.startedAt ? new Date(last.startedAt) : null;
    const moment = when && !isNaN(when) ? when.toLocaleString(this.appearance.language,
                                                               { dateStyle: "medium", timeStyle: "short" }) : "";
    this.drawEarlier(last.messages, this.words.lastVisit(moment));
  }

  /* Earlier messages after the greeting, before whatever was said since; a note above them. */
  drawEarlier(messages, note) {
    const first = this.greeting ? this.greeting.nextSibling : this.log.firstChild;
    if (note) this.log.insertBefore(el("p", { class: "note earlier", text: note }), first);
    for (const message of messages) {
      if (message.role !== "user" && message.role !== "assistant") continue;
      const node = this.messageNode(message.role === "user" ? "user" : "agent", message.text, message.operator);
      if (message.role === "user" && message.voice) node.dataset.voice = "true";
      if (message.role === "assistant" && message.cut) this.markCut(node);
      this.log.insertBefore(node, first);
    }
    this.scrollToEnd();
  }

  onAgent({ text, done, operator }) {
    this.tellHeard();
    // The closing frame may carry a text that is not the deltas' (a server that sends only the whole answer).
    const shown = text.length >= this.shownBefore ? text.slice(this.shownBefore) : text;
    if (!this.current && shown.trim()) this.current = this.addMessage("agent", "");
    if (this.current) {
      this.drawAgent(this.current, shown, operator);
      this.lastAnswer = this.current;
    }
    if (!done) return;
    if (this.current) this.current.setAttribute("aria-busy", "false");
    this.current = null;
    this.shownBefore = 0;
    if (!this.isOpen && text) this.setUnread(this.unread + 1);
    this.emit("message", operator ? { role: "operator", text, operator } : { role: "assistant", text });
  }

  /* A page tool runs: the answer so far stays in its bubble, the rest goes below the tool's line. */
  splitAnswer() {
    if (!this.current) return;
    this.current.setAttribute("aria-busy", "false");
    this.shownBefore += this.current.dataset.text.length;
    this.current = null;
  }

  onTool({ name, outcome }) {
    const error = outcome && outcome.error;
    if (error === DENIED_BY_USER) return;
    const words = error ? this.words.toolFailed : this.words.toolDone;
    this.log.append(el("p", { class: "tool", "data-tool": name, "data-status": error ? "failed" : "done",
                              text: words(labelOf(name)) }));
    this.scrollToEnd();
  }

  // --- voice ---

  onVoice(state) {
    if (state === "listening") this.heard = null; // a new utterance gets its own bubble
    this.drawMic(state);
    if (this.client) this.onState(this.client.state);
  }

  drawMic(state) {
    const words = this.words;
    const label = state === "listening" ? words.stopListening : state === "speaking" ? words.interrupt : words.speak;
    this.micButton.hidden = state === "off";
    this.micButton.dataset.state = state;
    this.micButton.setAttribute("aria-pressed", String(state === "listening"));
    this.micButton.setAttribute("aria-label", label);
    this.micButton.title = label;
  }

  toggleMicrophone() {
    if (!this.client) return;
    if (this.client.voiceState === "listening") this.client.stopListening();
    else this.client.startListening();
  }

  /* What the server heard of the visitor's utterance: their bubble. */
  onTranscript({ role, text }) {
    if (role !== "user") return; // the answer's words come as its text too
    const said = String(text || "").trim();
    if (!said) return;
    if (!this.heard) {
      this.hidePrompts();
      this.lastAnswer = null;
      this.heard = this.addMessage("user", "");
      this.heard.dataset.voice = "true";
    }
    this.heard.textContent = this.heard.textContent ? this.heard.textContent + " " + said : said;
    this.scrollToEnd();
  }

  /* The heard utterance is a message of the visitor's, told once its answer begins. */
  tellHeard() {
    if (!this.heard || this.heard.dataset.told) return;
    this.heard.dataset.told = "true";
    this.emit("message", { role: "user", text: this.heard.textContent, voice: true });
  }

  /* The answer being spoken was cut off: by the visitor talking over it, or by the server. */
  markCut(answer = null) {
    const node = answer || this.current || this.lastAnswer;
    if (!node || node.dataset.cut) return;
    node.dataset.cut = "true";
    node.append(el("span", { class: "cutoff", text: this.words.cutOff }));
  }

  onError({ message, data, ended }) {
    const code = data && data.code;
    const words = this.words.errors[code] || message || this.words.somethingWrong;
    const detail = code ? { message: words, code } : { message: words };
    if (ended) this.addNote(words);
    else {
      this.showError(words);
      this.shownError = detail;
    }
    this.emit("error", detail);
  }

  onState(state) {
    // While the visitor speaks or the answer is spoken, the status line says so.
    const voice = this.client ? this.client.voiceState : "off";
    const words = this.words;
    this.status.textContent = voice === "listening" ? words.listening : voice === "speaking" ? words.speaking
      : words.states[state] || "";
    this.sendButton.disabled = state !== "connected";
    // Over for good (ended, or refused): nothing typed could be sent any more.
    const ended = ENDED_STATES.includes(state);
    this.input.disabled = ended;
    this.input.setAttribute("placeholder", ended ? words.ended[state] : words.placeholder);
    // A sentence that long does not fit a one-line box: it takes the box's place.
    this.input.hidden = ended;
    this.sendButton.hidden = ended;
    this.endedLine.hidden = !ended;
    this.endedLine.textContent = ended ? words.ended[state] : "";
  }

  onActivity({ activity, tool }) {
    if (activity === "tool") this.status.textContent = this.words.working(tool);
    else if (activity === "approval") this.status.textContent = this.words.waiting;
    else this.onState(this.client.state);
  }

  // --- the DOM ---

  mount() {
    const host = document.createElement("owllayer-widget");
    const root = host.attachShadow({ mode: "open" });
    const sheet = new CSSStyleSheet();
    sheet.replaceSync(CSS);
    root.adoptedStyleSheets = [sheet];
    this.sheet = sheet;
    this.host = host;
    this.root = root;

    this.badge = el("span", { class: "badge", "aria-hidden": "true", hidden: true });
    this.launcher = el("button", { type: "button", class: "launcher", "aria-expanded": "false",
                                   "aria-controls": "owl-panel" }, [icon(), this.badge]);
    this.status = el("span", { class: "status", role: "status" });
    const closeButton = el("button", { type: "button", class: "icon", text: "\u00d7" });
    this.closeButton = closeButton;
    this.log = el("div", { class: "log", role: "log", "aria-live": "polite", tabindex: "0" });
    this.prompts = el("div", { class: "prompts", role: "group" });
    this.errorBox = el("p", { class: "error", role: "alert", hidden: true });
    this.input = el("textarea", { id: "owl-input", rows: "1", maxlength: "8000" });
    // In the message box's place once nothing could be sent any more: why, in full.
    this.endedLine = el("p", { class: "ended", hidden: true });
    this.sendButton = el("button", { type: "submit", class: "send", disabled: true });
    this.micButton = el("button", { type: "button", class: "mic", "aria-pressed": "false", hidden: true },
                        [icon(MIC_PATH)]);
    this.micButton.addEventListener("click", () => this.toggleMicrophone());
    this.inputLabel = el("label", { for: "owl-input", class: "sr" });
    const form = el("form", {}, [this.inputLabel, this.input, this.endedLine, this.micButton, this.sendButton]);
    this.heading = el("h2", { id: "owl-title" });
    this.panel = el("section", { id: "owl-panel", class: "panel w", role: "dialog", "aria-modal": "false",
                                 "aria-labelledby": "owl-title", hidden: true }, [
      el("header", {}, [this.heading, this.status, closeButton]),
      this.log, this.prompts, this.errorBox, form,
    ]);
    this.applyAppearance();
    this.dialogSlot = el("div", { class: "w" });
    root.append(el("div", { class: "w" }, [this.launcher]), this.panel, this.dialogSlot);

    this.launcher.addEventListener("click", () => this.open());
    closeButton.addEventListener("click", () => {
      this.close();
      this.launcher.focus();
    });
    this.panel.addEventListener("keydown", (event) => {
      if (event.key === "Escape") {
        this.close();
        this.launcher.focus();
      }
    });
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      if (this.send(this.input.value)) this.input.value = "";
    });
    this.input.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        form.requestSubmit();
      }
    });
    (document.body || document.documentElement).append(host);
  }

  /* Draw this.appearance: colours, corner, language, heading, greeting, prompts. */
  applyAppearance() {
    const { accent, position, language } = this.appearance;
    this.words = WORDS[language];
    const words = this.words;
    this.root.adoptedStyleSheets = [this.sheet];
    if (accent) {
      // The key's colour in light and dark alike, its text white or near-black as reads better.
      const accentSheet = new CSSStyleSheet();
      accentSheet.replaceSync(".w{--accent:" + accent + ";--on-accent:" + textColourOn(accent) + "}");
      this.root.adoptedStyleSheets = [this.sheet, accentSheet];
    }
    this.host.setAttribute("data-position", position);
    this.host.setAttribute("lang", language);
    this.heading.textContent = this.givenTitle || this.appearance.name || words.assistant;
    this.setUnread(this.unread);
    this.closeButton.setAttribute("aria-label", words.closeChat);
    this.log.setAttribute("aria-label", words.conversation);
    this.prompts.setAttribute("aria-label", words.suggestions);
    this.input.setAttribute("placeholder", words.placeholder);
    this.sendButton.textContent = words.send;
    this.inputLabel.textContent = words.message;
    if (this.client) this.onState(this.client.state);
    this.drawMic(this.client ? this.client.voiceState : "off");
    // The greeting is shown, never sent: the model does not see it.
    const said = this.appearance.greeting;
    const greeting = said ? el("div", { class: "msg agent greeting", text: said }) : null;
    if (this.greeting) this.greeting.remove();
    if (greeting) this.log.prepend(greeting);
    this.greeting = greeting;
    this.prompts.replaceChildren(...this.appearance.prompts.map((text) => {
      const button = el("button", { type: "button", class: "prompt", text });
      button.addEventListener("click", () => this.send(text));
      return button;
    }));
    this.prompts.hidden = this.promptsUsed || !this.appearance.prompts.length;
  }

  setOpen(open) {
    if (open === this.isOpen) return;
    this.isOpen = open;
    this.panel.hidden = !open;
    // On a narrow screen the panel covers the page, launcher included.
    this.launcher.parentNode.hidden = open && window.matchMedia(NARROW).matches;
    this.launcher.setAttribute("aria-expanded", String(open));
    remember(OPEN_KEY, open ? "open" : "closed");
    if (open) {
      this.setUnread(0);
      this.scrollToEnd();
    }
    this.emit(open ? "open" : "close", {});
  }

  setUnread(count) {
    this.unread = count;
    this.badge.hidden = count === 0;
    this.badge.textContent = String(count);
    this.launcher.setAttribute("aria-label", count ? this.words.unread(count) : this.words.openChat);
  }

  messageNode(kind, text, operator) {
    const node = el("div", { class: "msg " + kind });
    if (kind === "agent") this.drawAgent(node, text, operator);
    else node.textContent = text;
    return node;
  }

  addMessage(kind, text) {
    const node = this.messageNode(kind, text);
    if (kind === "agent") node.setAttribute("aria-busy", "true");
    this.log.append(node);
    this.scrollToEnd();
    return node;
  }

  drawAgent(node, text, operator) {
    const parts = [];
    if (operator) {
      node.dataset.operator = operator;
      parts.push(el("span", { class: "who", text: this.words.operator(operator) }));
    }
    node.dataset.text = text;
    node.replaceChildren(...parts, renderMarkdown(text));
    if (node.dataset.cut) node.append(el("span", { class: "cutoff", text: this.words.cutOff }));
    this.scrollToEnd();
  }

  addNote(text) {
    this.log.append(el("p", { class: "note", text }));
    this.scrollToEnd();
  }

  showError(text) {
    this.errorBox.textContent = text;
    this.errorBox.hidden = false;
  }

  hidePrompts() {
    this.promptsUsed = true;
    if (this.prompts) this.prompts.hidden = true;
  }

  scrollToEnd() {
    this.log.scrollTop = this.log.scrollHeight;
  }

  // --- approvals ---

  /* The page's declaration of a tool, or null. */
  toolNamed(name) {
    const entry = this.tools.find(([tool]) => tool.name === name);
    return entry ? entry[0] : null;
  }

  describe(request) {
    const tool = this.toolNamed(request.toolName);
    return tool && tool.description ? tool.description : request.toolName;
  }

  /* What the tool itself says of this call (its approvalDetails: summary,
   * rows, warning), or {}: then the dialog shows the arguments. */
  detailsOf(request) {
    const tool = this.toolNamed(request.toolName);
    const own = tool && tool.approvalDetails;
    if (typeof own !== "function") return {};
    try {
      const given = own(request.args || {});
      return given && typeof given === "object" ? given : {};
    } catch (err) {
      console.error("OwlLayer: approvalDetails of " + request.toolName + " failed", err);
      return {};
    }
  }

  /* The dialog's rows: the tool's own [label, value] pairs, else the arguments in words. */
  approvalRows(request, details) {
    const language = this.appearance.language;
    const own = Array.isArray(details.rows) ? details.rows.filter((row) => Array.isArray(row) && row.length === 2)
      : null;
    const pairs = own || Object.entries(request.args || {}).map(([name, value]) => [labelOf(name), value]);
    return pairs.flatMap(([label, value]) => [
      el("dt", { text: String(label) }),
      el("dd", { text: typeof value === "string" ? value : valueInWords(value, language) }),
    ]);
  }

  /* One approval as a modal dialog; decide(approved) is called once. Escape denies. */
  showApproval(request, decide) {
    const words = this.words;
    const details = this.detailsOf(request);
    const rows = this.approvalRows(request, details);
    const warning = ownWords(details.warning);
    const deny = el("button", { type: "button", class: "deny", text: words.deny });
    const approve = el("button", { type: "button", class: "approve", text: words.approve });
    const dialog = el("dialog", { "aria-labelledby": "owl-approval-title", "aria-describedby": "owl-approval-what",
                                  "data-call-id": request.callId }, [
      el("h2", { id: "owl-approval-title", text: words.approveTitle }),
      el("p", { id: "owl-approval-what", text: ownWords(details.summary) || this.describe(request) }),
      // The client's own question is said in the widget's language; a tool's own, as it is.
      el("p", { text: request.message === WORDS.en.allow(request.toolName) ? words.allow(request.toolName)
                                                                           : request.message }),
      rows.length ? el("dl", { "aria-label": words.details }, rows) : "",
      warning ? el("p", { class: "warning", role: "alert", text: warning }) : "",
      el("p", {}, [words.risk, el("span", { class: "risk", text: words.riskNames[request.risk] || request.risk }),
                   " " + (words.riskWords[request.risk] || "")]),
      el("div", { class: "buttons" }, [deny, approve]),
    ]);
    this.dialogSlot.append(dialog);
    const dismiss = answerOnce(dialog, approve, deny, (approved) => {
      this.addNote((approved ? words.approved : words.denied) + labelOf(request.toolName));
      decide(approved);
    });
    // Tab and Shift+Tab stay on the dialog's two buttons.
    dialog.addEventListener("keydown", (event) => {
      if (event.key !== "Tab") return;
      event.preventDefault();
      (this.root.activeElement === deny ? approve : deny).focus();
    });
    if (!this.isOpen) this.setOpen(true);
    dialog.showModal();
    deny.focus();
    return { dismiss };
  }
}

const widget = new Widget();

/* The API: window.OwlLayer and this module's exports are the same functions. */
export const registerTool = (tool, handler) => widget.registerTool(tool, handler) && api;
export const unregisterTool = (name) => widget.unregisterTool(name) && api;
export const setContext = (context) => widget.setContext(context) && api;
export const open = () => widget.open() && api;
export const close = () => widget.close() && api;
export const send = (text) => widget.send(text);
export const on = (event, listener) => widget.on(event, listener) && api;
export const off = (event, listener) => widget.off(event, listener) && api;
export const start = (options) => widget.start(options) && api;
export const setAppearance = (look) => widget.setAppearance(look) && api;
export const diagnostics = () => widget.diagnostics();

const api = Object.freeze({
  version: WIDGET_VERSION, registerTool, unregisterTool, setContext, open, close, send, on, off, start,
  setAppearance, diagnostics,
});
export default api;

if (!window.OwlLayer) window.OwlLayer = api;

const script = ownScript();
if (script && script.dataset.apiKey) {
  start({ apiKey: script.dataset.apiKey, endpoint: script.dataset.endpoint, title: script.dataset.title,
          visitorToken: script.dataset.visitorToken });
}
