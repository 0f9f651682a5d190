/*
 * The store's chat panel: what it shows and how it is kept.
 *
 * Entries are user messages (typed, or spoken: what the assistant heard),
 * the agent's answers (Markdown, see owllayer-markdown.js; a spoken one the shopper
 * talked over is marked as cut; one an operator wrote carries their name), one line per tool call, notes and errors. Each is drawn as DOM nodes, never
 * from HTML, and the visible transcript is kept in sessionStorage, so a
 * reload shows it again. The server's session goes on after a reload (the
 * assistant remembers what was said; a note says whether it did).
 *
 * The transcript is saved each time the client tells the page something,
 * in the same task, so it always matches the last frame the client handled
 * (the one its next socket asks to go on from). The turn being answered is
 * kept with it: the answer bubble being written is marked "streaming", the
 * turn's failed tool lines carry their "failure", and `turn` holds the
 * turn's text so far and how much of it earlier bubbles show. After a reload
 * whose session takes up where it was, the rest of the answer goes on in
 * the same bubble (store.js); otherwise it stays as it was.
 *
 * A tab that kept no copy (its storage was cleared, or the page never had
 * one) draws the conversation from the server's when the session goes on
 * (client.history()).
 *
 * The panel can be minimised to a launcher button; the choice is kept too.
 * On a narrow screen it floats over the page and starts minimised.
 */
import { renderMarkdown } from "../owllayer/owllayer-markdown.js";

const TRANSCRIPT_KEY = "owl-demo-transcript";
const TURN_KEY = "owl-demo-turn";
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
    // The turn being answered (see the top of this file): its text so far and
    // how much of it earlier bubbles show; store.js keeps it current.
    this.turn = { shownBefore: 0, text: "" };

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

  /* Entries older than everything shown (read from the server): drawn above it, in order. */
  addEarlier(entries) {
    // After the greeting (the page's own), before the first entry shown.
    const first = this.entries.length ? this.element(this.entries[0]) : null;
    for (const entry of entries) {
      this.add(entry, { keep: false });
      this.messages.insertBefore(this.element(entry), first);
    }
    this.entries = [...entries, ...this.entries];
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
      // A person wrote it in the assistant's place: the bubble says who (CSS draws the label).
      if (entry.operator) element.dataset.operator = entry.operator;
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
    store(TURN_KEY, this.turn);
  }

  /*
   * Show what this tab's earlier pages showed. A call still running then
   * can no longer be answered (its line says so); the answer being written
   * stays open until the connection says whether it goes on (see
   * streaming() and endTurn()). True when there was something to show.
   */
  restore() {
    const kept = readStored(TRANSCRIPT_KEY, []);
    const turn = readStored(TURN_KEY, null);
    if (turn && Number.isSafeInteger(turn.shownBefore) && turn.shownBefore >= 0 &&
        typeof turn.text === "string") {
      this.turn = { shownBefore: turn.shownBefore, text: turn.text };
    }
    if (!Array.isArray(kept) || !kept.length) return false;
    for (const entry of kept) {
      if (!entry || typeof entry.kind !== "string" || typeof entry.text !== "string") continue;
      if (!["user", "agent", "tool", "note", "error"].includes(entry.kind)) continue;
      if (entry.kind === "tool" && entry.status === "running") {
        entry.status = "lost";
        entry.text = "✗ " + entry.summary + ": the page was reloaded";
      }
      if (entry.kind === "agent" && !entry.streaming) entry.done = true;
      this.add(entry);
    }
    this.save();
    return true;
  }

  /* The answer bubble being written when the page was left, or null. */
  streaming() {
    return this.entries.findLast((entry) => entry.kind === "agent" && entry.streaming) || null;
  }

  /* The turn's failed tool lines: [{entry, error}]. */
  failures() {
    return this.entries.filter((entry) => entry.kind === "tool" && typeof entry.failure === "string")
      .map((entry) => ({ entry, error: entry.failure }));
  }

  /* The turn is over (answered, or cut off for good): nothing of it stays open. */
  endTurn() {
    for (const entry of this.entries) {
      if (entry.streaming) {
        delete entry.streaming;
        // Cut off: it stays as it was, as the turn's last bubble.
        entry.done = true;
        this.update(entry);
      }
      delete entry.failure;
    }
    this.turn = { shownBefore: 0, text: "" };
  }
}
