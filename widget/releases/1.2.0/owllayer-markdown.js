/*
 * A safe subset of Markdown for the agent's answers, built as DOM nodes
 * (the widget's renderer, and the demo store's).
 *
 * The model's text is never parsed as HTML: every piece of it reaches the
 * page as a text node (textContent), inside elements this module creates.
 * What it understands:
 *   paragraphs (a blank line between them; single newlines become <br>),
 *   "- item" / "* item" lists and "1. item" numbered lists,
 *   ``` fenced code blocks ```,
 *   **bold**, __bold__, *italics*, _italics_, `code`,
 *   [links](https://...) with an http, https or mailto address only; any
 *   other link (javascript:, data:, ...) is shown as its plain label.
 * Anything else, HTML tags included, is shown as the characters it is.
 */

const SAFE_SCHEMES = ["http:", "https:", "mailto:"];
const INLINE = new RegExp([
  "`([^`\\n]+)`",                                      // 1 code
  "\\*\\*(?=\\S)([\\s\\S]*?\\S)\\*\\*",                 // 2 bold
  "(?<![\\w])__(?=\\S)([\\s\\S]*?\\S)__(?![\\w])",   // 3 bold
  "\\*(?=[^\\s*])([^*\\n]*?[^\\s*])\\*",                // 4 italics
  "(?<![\\w])_(?=[^\\s_])([^_\\n]*?[^\\s_])_(?![\\w])", // 5 italics
  "\\[([^\\]\\n]+)\\]\\(([^()\\s]+)\\)",                // 6 label, 7 address
].join("|"), "g");
const BULLET = /^\s*[-*+]\s+(.*)$/;
const NUMBERED = /^\s*\d{1,9}[.)]\s+(.*)$/;
const FENCE = /^\s*```/;

function node(tag, className) {
  const element = document.createElement(tag);
  if (className) element.className = className;
  return element;
}

/* The address when a link may point there, else null. */
export function safeHref(address) {
  let url;
  try {
    url = new URL(address, window.location.href);
  } catch (err) {
    return null;
  }
  return SAFE_SCHEMES.includes(url.protocol) ? url.href : null;
}

function appendInline(parent, text) {
  let at = 0;
  for (const match of text.matchAll(INLINE)) {
    if (match.index > at) parent.append(text.slice(at, match.index));
    at = match.index + match[0].length;
    const [, code, bold1, bold2, em1, em2, label, address] = match;
    if (code !== undefined) {
      parent.append(Object.assign(node("code"), { textContent: code }));
    } else if (bold1 !== undefined || bold2 !== undefined) {
      const strong = node("strong");
      appendInline(strong, bold1 !== undefined ? bold1 : bold2);
      parent.append(strong);
    } else if (em1 !== undefined || em2 !== undefined) {
      const em = node("em");
      appendInline(em, em1 !== undefined ? em1 : em2);
      parent.append(em);
    } else {
      const href = safeHref(address);
      if (href === null) {
        appendInline(parent, label);
        continue;
      }
      const link = node("a");
      link.href = href;
      link.target = "_blank";
      link.rel = "noopener noreferrer nofollow";
      appendInline(link, label);
      parent.append(link);
    }
  }
  if (at < text.length) parent.append(text.slice(at));
}

function paragraph(lines) {
  const p = node("p");
  lines.forEach((line, i) => {
    if (i) p.append(node("br"));
    appendInline(p, line);
  });
  return p;
}

function list(tag, items) {
  const element = node(tag);
  for (const item of items) {
    const li = node("li");
    appendInline(li, item);
    element.append(li);
  }
  return element;
}

/* The blocks of `text` as a DocumentFragment of elements and text nodes only. */
export function renderMarkdown(text) {
  const fragment = document.createDocumentFragment();
  const lines = String(text).replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (!line.trim()) {
      i += 1;
    } else if (FENCE.test(line)) {
      const code = [];
      i += 1;
      while (i < lines.length && !FENCE.test(lines[i])) code.push(lines[i++]);
      i += 1; // the closing fence (or the end of a text still streaming)
      const pre = node("pre");
      pre.append(Object.assign(node("code"), { textContent: code.join("\n") }));
      fragment.append(pre);
    } else if (BULLET.test(line) || NUMBERED.test(line)) {
      const pattern = BULLET.test(line) ? BULLET : NUMBERED;
      const items = [];
      while (i < lines.length && pattern.test(lines[i])) items.push(lines[i++].match(pattern)[1]);
      fragment.append(list(pattern === BULLET ? "ul" : "ol", items));
    } else {
      const block = [];
      while (i < lines.length && lines[i].trim() && !FENCE.test(lines[i]) &&
             !BULLET.test(lines[i]) && !NUMBERED.test(lines[i])) {
        block.push(lines[i++]);
      }
      fragment.append(paragraph(block));
    }
  }
  return fragment;
}
