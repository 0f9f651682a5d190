/*
 * The demo store: a product page and a cart page rendered in the browser,
 * the chat widget, and the page tools the assistant can call.
 *
 * Navigation between the two pages is client-side (history.pushState), so
 * the AITP socket stays open when a tool such as go_to_cart moves the user:
 * the new page's CONTEXT_UPDATE leaves before that tool's TOOL_RESULT.
 */
(function () {
  "use strict";

  var config = JSON.parse(document.getElementById("owl-demo-config").textContent);

  var PRODUCT = {
    id: "pro-headphones",
    name: "Pro Headphones",
    priceCents: 14999,
    description: "Closed-back wireless headphones with active noise cancelling and 30 hours of battery."
  };
  var CURRENCY = "USD";
  var CART_KEY = "owl-demo-cart";
  var MAX_QUANTITY = 99;
  var TITLES = { product: "Pro Headphones - Owl Store", cart: "Your cart - Owl Store" };

  // --- the cart, kept in localStorage -------------------------------------------

  function cartQuantity() {
    var saved;
    try {
      saved = JSON.parse(localStorage.getItem(CART_KEY) || "{}");
    } catch (err) {
      saved = {}; // a damaged entry is an empty cart
    }
    var quantity = saved && saved[PRODUCT.id];
    return Number.isInteger(quantity) && quantity > 0 ? quantity : 0;
  }

  function setCartQuantity(quantity) {
    var saved = {};
    if (quantity > 0) saved[PRODUCT.id] = quantity;
    localStorage.setItem(CART_KEY, JSON.stringify(saved));
  }

  function cartTotalCents() {
    return cartQuantity() * PRODUCT.priceCents;
  }

  function money(cents) {
    return "$" + (cents / 100).toFixed(2);
  }

  function wholeQuantity(value, minimum) {
    if (!Number.isInteger(value) || value < minimum || value > MAX_QUANTITY) {
      throw new Error("quantity must be a whole number from " + minimum + " to " + MAX_QUANTITY);
    }
    return value;
  }

  var lastOrder = null;

  function addToCart(quantity) {
    wholeQuantity(quantity, 1);
    var total = cartQuantity() + quantity;
    if (total > MAX_QUANTITY) throw new Error("the cart holds at most " + MAX_QUANTITY);
    setCartQuantity(total);
    lastOrder = null;
    render();
    return { added: true, quantity: quantity, cartQuantity: total, cartTotal: cartTotalCents() / 100 };
  }

  function changeQuantity(quantity) {
    wholeQuantity(quantity, 0);
    setCartQuantity(quantity);
    render();
    return { quantity: quantity, cartTotal: cartTotalCents() / 100 };
  }

  function pay(amount) {
    var totalCents = cartTotalCents();
    if (totalCents === 0) throw new Error("the cart is empty");
    // Compare cents: 299.98 is not exactly representable as a float.
    if (Math.round(amount * 100) !== totalCents) {
      throw new Error("amount does not match the cart total (" + money(totalCents) + ")");
    }
    var order = { orderId: "ord_" + Math.random().toString(36).slice(2, 10), amount: totalCents / 100 };
    setCartQuantity(0);
    lastOrder = order;
    render();
    return { paid: true, orderId: order.orderId, amount: order.amount, currency: CURRENCY };
  }

  // --- routing ------------------------------------------------------------------------

  var route = routeOf(window.location.pathname);

  function routeOf(pathname) {
    return pathname === config.routes.cart ? "cart" : "product";
  }

  function navigate(to) {
    if (to !== route) {
      // Keep ?apiKey=... so that a reload of the new page still connects.
      window.history.pushState({ route: to }, "", config.routes[to] + window.location.search);
    }
    route = to;
    render();
  }

  window.addEventListener("popstate", function () {
    route = routeOf(window.location.pathname);
    render();
  });

  document.addEventListener("click", function (event) {
    var link = event.target.closest("a[data-nav]");
    if (!link || event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey) return;
    event.preventDefault();
    navigate(link.dataset.nav);
  });

  // --- views ----------------------------------------------------------------------------

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (name) {
      if (name === "text") node.textContent = attrs[name];
      else if (name === "on") Object.keys(attrs.on).forEach(function (e) { node.addEventListener(e, attrs.on[e]); });
      else node.setAttribute(name, attrs[name]);
    });
    (children || []).forEach(function (child) { if (child) node.appendChild(child); });
    return node;
  }

  // Drawn inline: no image file to serve, no emoji font to rely on.
  function headphonesPicture() {
    var frame = el("div", { class: "product-image", "aria-hidden": "true" });
    frame.innerHTML =
      '<svg viewBox="0 0 64 64" fill="none" stroke="currentColor" stroke-width="4" stroke-linecap="round">' +
      '<path d="M12 38V32a20 20 0 0 1 40 0v6"/>' +
      '<rect x="8" y="36" width="12" height="18" rx="4" fill="currentColor"/>' +
      '<rect x="44" y="36" width="12" height="18" rx="4" fill="currentColor"/></svg>';
    return frame;
  }

  function productView() {
    var quantity = el("input", { id: "product-quantity", type: "number", min: "1", max: String(MAX_QUANTITY), value: "1" });
    return el("article", { class: "product", "data-page": "product" }, [
      headphonesPicture(),
      el("div", { class: "product-info" }, [
        el("h1", { text: PRODUCT.name }),
        el("p", { class: "price", id: "product-price", text: money(PRODUCT.priceCents) }),
        el("p", { text: PRODUCT.description }),
        el("div", { class: "buy" }, [
          el("label", { for: "product-quantity", text: "Quantity" }),
          quantity,
          el("button", { id: "add-to-cart", type: "button", text: "Add to cart", on: { click: function () {
            try {
              addToCart(Number(quantity.value));
            } catch (err) {
              showNote(err.message, "error");
            }
          } } })
        ]),
        el("a", { href: config.routes.cart, "data-nav": "cart", text: "Go to cart →" })
      ])
    ]);
  }

  function cartView() {
    var quantity = cartQuantity();
    var children = [el("h1", { text: "Your cart" })];
    if (lastOrder) {
      children.push(el("p", { id: "order-confirmation", class: "confirmation",
        text: "Thank you! Order " + lastOrder.orderId + " is paid (" + money(lastOrder.amount * 100) + ")." }));
    }
    if (quantity === 0) {
      children.push(el("p", { id: "cart-empty", text: "Your cart is empty." }));
      children.push(el("a", { href: config.routes.product, "data-nav": "product", text: "← Back to the headphones" }));
      return el("article", { class: "cart", "data-page": "cart" }, children);
    }
    var input = el("input", { id: "cart-quantity", type: "number", min: "0", max: String(MAX_QUANTITY), value: String(quantity),
      on: { change: function () {
        try {
          changeQuantity(Number(input.value));
        } catch (err) {
          showNote(err.message, "error");
        }
      } } });
    children.push(el("table", { class: "cart-lines" }, [
      el("tr", {}, [el("th", { text: "Item" }), el("th", { text: "Price" }), el("th", { text: "Quantity" }), el("th", { text: "Total" })]),
      el("tr", {}, [
        el("td", { text: PRODUCT.name }), el("td", { text: money(PRODUCT.priceCents) }),
        el("td", {}, [input]), el("td", { text: money(cartTotalCents()) })
      ])
    ]));
    children.push(el("p", { class: "cart-total" }, [
      document.createTextNode("Total: "), el("strong", { id: "cart-total", text: money(cartTotalCents()) })
    ]));
    children.push(el("button", { id: "pay", type: "button", text: "Pay " + money(cartTotalCents()),
      on: { click: function () { pay(cartTotalCents() / 100); } } }));
    return el("article", { class: "cart", "data-page": "cart" }, children);
  }

  function render() {
    document.title = TITLES[route];
    var view = document.getElementById("view");
    view.replaceChildren(route === "cart" ? cartView() : productView());
    document.getElementById("cart-count").textContent = String(cartQuantity());
    syncAssistant();
  }

  // --- the page's tools -------------------------------------------------------------------

  var TOOLS = {
    product: [
      [{
        name: "add_to_cart",
        description: "Add the currently viewed product (Pro Headphones) to the shopping cart",
        parameters: {
          type: "OBJECT",
          properties: { quantity: { type: "NUMBER", description: "Quantity to add (1-99)" } },
          required: ["quantity"]
        },
        risk: "low"
      }, function (args) { return addToCart(args.quantity); }],
      [{
        name: "go_to_cart",
        description: "Open the shopping cart page",
        parameters: { type: "OBJECT", properties: {} },
        risk: "none"
      }, function () {
        navigate("cart");
        return { url: window.location.pathname };
      }]
    ],
    cart: [
      [{
        name: "set_quantity",
        description: "Set how many Pro Headphones are in the cart (0 removes them)",
        parameters: {
          type: "OBJECT",
          properties: { quantity: { type: "NUMBER", description: "The new quantity (0-99)" } },
          required: ["quantity"]
        },
        risk: "low"
      }, function (args) { return changeQuantity(args.quantity); }],
      [{
        name: "process_payment",
        description: "Pay for the cart with the customer's saved card; the amount must equal the cart total",
        parameters: {
          type: "OBJECT",
          properties: { amount: { type: "NUMBER", description: "The amount to charge in USD" } },
          required: ["amount"]
        },
        risk: "critical",
        approvalMessage: function (args) { return "Pay " + args.amount.toFixed(2) + " " + CURRENCY + " with the saved card?"; }
      }, function (args) { return pay(args.amount); }]
    ]
  };

  function pageContext() {
    if (route === "cart") {
      var context = {
        page: "cart",
        currency: CURRENCY,
        items: cartQuantity() ? [{
          productId: PRODUCT.id, name: PRODUCT.name, price: PRODUCT.priceCents / 100, quantity: cartQuantity()
        }] : [],
        total: cartTotalCents() / 100
      };
      if (lastOrder) context.lastOrder = lastOrder;
      return context;
    }
    return {
      page: "product_detail",
      productId: PRODUCT.id,
      name: PRODUCT.name,
      price: PRODUCT.priceCents / 100,
      currency: CURRENCY,
      cartQuantity: cartQuantity()
    };
  }

  // Everything changed here in one go leaves as one CONTEXT_UPDATE.
  function syncAssistant() {
    if (!client) return;
    var wanted = TOOLS[route];
    var names = wanted.map(function (tool) { return tool[0].name; });
    Object.keys(client.tools).forEach(function (name) {
      if (names.indexOf(name) === -1) client.unregisterTool(name);
    });
    wanted.forEach(function (tool) {
      if (!(tool[0].name in client.tools)) client.registerTool(tool[0], tool[1]);
    });
    client.setContext(pageContext());
    client.pageChanged();
  }

  // --- the chat widget ------------------------------------------------------------------

  var messages = document.getElementById("owl-messages");
  var statusBadge = document.getElementById("owl-status");
  var thinking = document.getElementById("owl-thinking");
  var form = document.getElementById("owl-form");
  var input = document.getElementById("owl-input");
  var sendButton = document.getElementById("owl-send");
  var agentBubble = null;

  function showMessage(kind, text) {
    var node = el("p", { class: "owl-msg owl-msg-" + kind, text: text });
    messages.appendChild(node);
    messages.scrollTop = messages.scrollHeight;
    return node;
  }

  function showNote(text, kind) {
    showMessage(kind || "note", text);
  }

  var client = null;
  if (config.apiKey) {
    var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    client = new OwlLayerClient({ apiKey: config.apiKey, endpoint: scheme + window.location.host + config.wsPath });

    client.on("state", function (state) {
      statusBadge.textContent = state;
      statusBadge.dataset.state = state;
      thinking.hidden = state !== "thinking";
      sendButton.disabled = state !== "connected";
    });
    client.on("agent", function (event) {
      if (!agentBubble) agentBubble = showMessage("agent", "");
      // Deltas grow the bubble; the final frame's complete text replaces it.
      agentBubble.textContent = event.text;
      messages.scrollTop = messages.scrollHeight;
      if (event.done) {
        agentBubble.dataset.done = "true";
        if (!event.text) agentBubble.remove();
        agentBubble = null;
      }
    });
    client.on("error", function (event) { showMessage("error", event.message); });
    // A turn cut off by a lost connection will not finish: start afresh.
    client.on("close", function () { agentBubble = null; });
    client.on("system", function (event) {
      if (event.kind === "waiting" && event.message) showNote(event.message);
    });
    client.on("tool", function (event) {
      var outcome = event.outcome.error ? "failed: " + event.outcome.error : "done";
      showNote(event.name + " " + outcome, "tool");
    });
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      var text = input.value;
      if (client.sendText(text)) {
        showMessage("user", text.trim());
        input.value = "";
        agentBubble = null;
      }
    });
  } else {
    form.addEventListener("submit", function (event) { event.preventDefault(); });
  }

  render();
  if (client) client.connect();
})();
