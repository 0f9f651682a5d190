/*
 * The demo store in the browser: the page's tools, and moving between pages
 * without dropping the assistant's socket.
 *
 * The assistant is the widget any tenant pastes (the snippet is in every
 * page, before this module, so window.OwlLayer is ready here): this module
 * only does what a tenant's own script does, through that API. It offers
 * each page's tools (and takes back those the next page does not have),
 * tells the assistant what the page shows (setContext), and describes a
 * payment in the approval dialog (approvalDetails: the amount, the cart's
 * lines, a warning when the amount is not the cart's total).
 *
 * Every page is a Django template. Links inside the store and the tools that
 * navigate fetch the next page and swap its <main> in (history.pushState), so
 * the AITP connection stays open: a tool that opens a product answers only
 * after the new page's tools and context are sent (the client flushes its
 * CONTEXT_UPDATE before the TOOL_RESULT).
 *
 * The demo's own key refused (`make run` makes a new one): the page says how
 * to get a new one, beside the widget's own words.
 */
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

const storeMessage = document.getElementById("store-message");

/* Do what the shopper asked, redraw the page, then say what the store refused: the sentence
   appears once the page under it is the one the shopper goes on with. */
async function act(change) {
  storeMessage.hidden = true;
  let refusal = null;
  try {
    await change();
  } catch (err) {
    refusal = err.message;
  }
  try {
    await refresh();
  } finally {
    if (refusal !== null) {
      storeMessage.textContent = refusal;
      storeMessage.hidden = false;
    }
  }
}

// --- the page's tools ---------------------------------------------------------------

const NUMBER = (description) => ({ type: "NUMBER", description });
const STRING = (description, extra) => ({ type: "STRING", description, ...extra });

/* name -> [declaration, handler] */
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
  }, (args) => visit(productUrl(args.productId))],
  open_cart: [{
    name: "open_cart",
    description: "Open the shopping cart page (to review it, apply a coupon or pay)",
    parameters: { type: "OBJECT", properties: {} },
    risk: "none",
  }, () => visit(config.urls.cart)],
  add_to_cart: [{
    name: "add_to_cart",
    description: "Add the product on this page to the shopping cart",
    parameters: {
      type: "OBJECT",
      properties: { quantity: NUMBER("How many to add (1-99)") },
      required: ["quantity"],
    },
    risk: "low",
  }, (args) => changeCart("add", { productId: page.context.productId, quantity: args.quantity })],
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
  }, (args) => changeCart("quantity", args)],
  apply_coupon: [{
    name: "apply_coupon",
    description: "Apply a coupon code to the cart",
    parameters: { type: "OBJECT", properties: { code: STRING("The coupon code") }, required: ["code"] },
    risk: "low",
  }, (args) => changeCart("coupon", { code: args.code })],
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
    approvalDetails: describePayment,
  }, (args) => changeCart("pay", { amount: args.amount })],
};

/* Change the cart, redraw the page (so the agent sees the new context), report. */
async function changeCart(action, body) {
  const outcome = await cartAction(action, body);
  await refresh();
  return outcome;
}

/* What the approval dialog shows of a payment: the amount, where it goes, the cart's lines. */
function describePayment(args) {
  const amount = Number(args.amount);
  const details = {
    summary: "Pay for your cart with your saved card.",
    rows: [["Amount", money(amount)], ["Paid to", "Owl Store"], ["Card", "Your saved Visa ending 4242"]],
  };
  if (page.kind !== "cart") return details;
  for (const item of page.context.items) {
    details.rows.push([item.quantity + " \u00d7 " + item.name, money(item.lineTotal)]);
  }
  if (page.context.coupon) {
    details.rows.push(["Coupon " + page.context.coupon.code, "\u2212" + money(page.context.discount)]);
  }
  if (Math.round(page.context.total * 100) !== Math.round(amount * 100)) {
    details.warning = "This is not your cart total (" + money(page.context.total) + ").";
  }
  return details;
}

// --- the assistant ------------------------------------------------------------------

// Everything changed here in one go leaves as one CONTEXT_UPDATE.
function syncAssistant() {
  if (!window.OwlLayer) return;
  const wanted = page.tools.filter((name) => name in TOOLS);
  for (const name of Object.keys(TOOLS)) {
    if (!wanted.includes(name)) window.OwlLayer.unregisterTool(name);
  }
  for (const name of wanted) window.OwlLayer.registerTool(TOOLS[name][0], TOOLS[name][1]);
  window.OwlLayer.setContext(page.context);
}

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

function noteRefusal({ code }) {
  if (!config.demoKey || !Object.hasOwn(DEMO_KEY_REFUSALS, code)) return;
  const notice = document.getElementById("assistant-notice");
  notice.textContent = DEMO_KEY_REFUSALS[code] + NEW_DEMO_KEY;
  notice.hidden = false;
}

if (config.apiKey && window.OwlLayer) {
  syncAssistant();
  window.OwlLayer.on("error", noteRefusal);
}
