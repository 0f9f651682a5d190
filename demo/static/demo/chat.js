/*
 * The store's chat panel: what it shows and how it is kept.
 *
 * Entries are user messages (typed, or spoken: what the assistant heard),
 * the agent's answers (Markdown, see markdown.js; a spoken one the shopper
 * talked over is marked as cut), one line per tool call, notes and errors. Each is drawn as DOM nodes, never
 * from HTML, and the visible transcript is kept in sessionStorage, so a
 * reload shows it again (the server's session after a reload is a new one:
 * the assistant does not remember it, and a note says so).
 *
 * The panel can be minimised to a launcher button; the choice is kept too.
 * On a narrow screen it floats over the page and starts minimised.
 */
import { renderMarkdown } from "./markdown.js";

const TRANSCRIPT_KEY = "owl-demo-transcript";
const PANEL_KEY = "owl-demo-panel";
// Enough for a long visit; older entries are dropped from storage first.
const MAX_KEPT_ENTRIES = 200;
const NARROW = "(max-width: 900px)";

function readStored(key, fallback) {
  try {
    const value = JSON.parse(window.sessionStorage.getItem(key));
    return value === null ? fallback : value;
  } catch (err) {
    return fallback;
  }
}

function store(key, value) {
  try {
    window.sessionStorage.setItem(key, JSON.stringify(value));
  } catch (err) {
    // Storage full or refused (a private window): the chat still works.
  }
}

export class ChatPanel {
  constructor() {
    this.panel = document.getElementById("owl-chat");
    this.messages = document.getElementById("owl-messages");
    this.launcher = document.getElementById("owl-launcher");
    this.entries = [];
    this.nodes = new Map();

    document.getElementById("owl-minimise").addEventListener("click", () => this.setOpen(false));
    this.launcher.addEventListener("click", () => {
      this.setOpen(true);
      document.getElementById("owl-input").focus();
    });
    const wanted = readStored(PANEL_KEY, null);
    this.setOpen(wanted === null ? !window.matchMedia(NARROW).matches : wanted === "open", false);
  }

  // --- the panel ---

  setOpen(open, remember = true) {
    this.panel.dataset.open = String(open);
    this.launcher.hidden = open;
    this.launcher.setAttribute("aria-expanded", String(open));
    if (open) {
      delete this.launcher.dataset.unread;
      this.scrollToEnd();
    }
    if (remember) store(PANEL_KEY, open ? "open" : "closed");
  }

  get isOpen() {
    return this.panel.dataset.open === "true";
  }

  scrollToEnd() {
    this.messages.scrollTop = this.messages.scrollHeight;
  }

  // --- entries ---

  /* Add an entry ({kind, text, ...}); returns it. Call update(entry) after changing it. */
  add(entry, { keep = true } = {}) {
    const element = document.createElement(entry.kind === "agent" ? "div" : "p");
    element.className = "owl-msg owl-msg-" + entry.kind;
    this.messages.appendChild(element);
    this.nodes.set(entry, element);
    if (keep) this.entries.push(entry);
    this.draw(entry);
    if (!this.isOpen && entry.kind !== "user") this.launcher.dataset.unread = "true";
    return entry;
  }

  update(entry) {
    this.draw(entry);
  }

  remove(entry) {
    const element = this.nodes.get(entry);
    if (element) element.remove();
    this.nodes.delete(entry);
    this.entries = this.entries.filter((e) => e !== entry);
    this.save();
  }

  element(entry) {
    return this.nodes.get(entry);
  }

  draw(entry) {
    const element = this.nodes.get(entry);
    if (!element) return;
    if (entry.kind === "agent") {
      element.replaceChildren(renderMarkdown(entry.text));
      if (entry.done) element.dataset.done = "true";
      // A spoken answer the shopper talked over: it ends where the voice stopped.
      if (entry.cut) element.dataset.cut = "true";
    } else {
      element.textContent = entry.text;
    }
    // What the assistant heard the shopper say.
    if (entry.kind === "user" && entry.voice) element.dataset.voice = "true";
    if (entry.kind === "tool") {
      element.dataset.callId = entry.callId;
      element.dataset.tool = entry.tool;
      element.dataset.status = entry.status;
    }
    this.scrollToEnd();
  }

  save() {
    store(TRANSCRIPT_KEY, this.entries.slice(-MAX_KEPT_ENTRIES));
  }

  /*
   * Show what this tab's earlier pages showed. A call still running then
   * can no longer be answered; an answer cut off mid-stream stays as it was.
   * True when there was something to show.
   */
  restore() {
    const kept = readStored(TRANSCRIPT_KEY, []);
    if (!Array.isArray(kept) || !kept.length) return false;
    for (const entry of kept) {
      if (!entry || typeof entry.kind !== "string" || typeof entry.text !== "string") continue;
      if (!["user", "agent", "tool", "note", "error"].includes(entry.kind)) continue;
      if (entry.kind === "tool" && entry.status === "running") {
        entry.status = "lost";
        entry.text = "✗ " + entry.summary + ": the page was reloaded";
      }
      if (entry.kind === "agent") entry.done = true;
      this.add(entry);
    }
    this.save();
    return true;
  }
}
