/*
 * OwlLayer browser client: speaks AITP 1.0.0 over a WebSocket exactly as the
 * deployed OwlLayerClient 0.4 does (docs: aitp-spec.md, wire-compat.md).
 *
 *   const client = new OwlLayerClient({ apiKey, endpoint });
 *   client.registerTool({ name, description, parameters, risk }, handler);
 *   client.setContext({ page: "product_detail" });
 *   client.on("agent", ({ text, done }) => ...);
 *   client.connect();
 *
 * No dependencies. Every received frame is checked against the same strict
 * schema as the deployed client; a frame that fails is dropped silently and
 * counted in window.__owl.dropped, so tests can prove none ever was.
 */
(function (global) {
  "use strict";

  var SDK_VERSION = "0.4.0";
  var PROTOCOL_VERSION = "1.0.0";
  // wire-compat 1 and 2: the deployed client's numbers.
  var HANDSHAKE_TIMEOUT_MS = 5000;
  var RECONNECT_STEP_MS = 2000;
  var MAX_RECONNECT_ATTEMPTS = 10;
  var DEFAULT_MAX_ACTIVE_TOOLS = 30;
  var MAX_INPUT_CHARS = 8000;
  // 1008 refusals, 1003 unsupported data, 1011 server bug: retrying cannot help.
  var PERMANENT_CLOSE_CODES = [1008, 1003, 1011];
  var DENIED_BY_USER = "Action denied by user";
  // Keeps the test log of a long session bounded.
  var MAX_LOGGED_FRAMES = 1000;

  var RISKS = ["none", "low", "high", "critical"];
  var APPROVAL_RISKS = ["high", "critical"];
  var MESSAGE_TYPES = [
    "HANDSHAKE_INIT", "HANDSHAKE_ACK", "CONTEXT_UPDATE", "USER_INPUT", "TOOL_CALL",
    "TOOL_RESULT", "APPROVAL_REQUEST", "APPROVAL_RESPONSE", "AGENT_RESPONSE",
    "AUDIO_STREAM", "VOICE_INPUT_END", "VOICE_INTERRUPT", "VOICE_STATE_EVENT", "SYSTEM_EVENT"
  ];
  var SERVER_TYPES = [
    "HANDSHAKE_ACK", "TOOL_CALL", "APPROVAL_REQUEST", "AGENT_RESPONSE",
    "AUDIO_STREAM", "VOICE_STATE_EVENT", "SYSTEM_EVENT"
  ];
  var SYSTEM_EVENT_KINDS = [
    "error", "waiting", "approval_required", "tools_effective",
    "transcript", "reload", "redirect", "disconnect"
  ];

  // --- strict frame validation (wire-compat section 3) ----------------------

  function isObject(value) {
    return value !== null && typeof value === "object" && !Array.isArray(value);
  }

  var check = {
    string: function (v) { return typeof v === "string"; },
    nonEmptyString: function (v) { return typeof v === "string" && v.length > 0; },
    boolean: function (v) { return typeof v === "boolean"; },
    object: isObject,
    anything: function () { return true; },
    positiveInteger: function (v) { return typeof v === "number" && Number.isInteger(v) && v >= 1; },
    stringList: function (v) {
      return Array.isArray(v) && v.every(function (item) { return typeof item === "string"; });
    },
    objectList: function (v) { return Array.isArray(v) && v.every(isObject); },
    oneOf: function (allowed) {
      return function (v) { return typeof v === "string" && allowed.indexOf(v) !== -1; };
    }
  };

  // "required": present and not null; "optional": may be absent, never null;
  // "nullable": may be absent or null (a tool result).
  var PAYLOAD_SCHEMAS = {
    HANDSHAKE_ACK: {
      sessionId: ["required", check.string], serverVersion: ["required", check.string],
      protocolVersion: ["required", check.string], capabilities: ["required", check.stringList],
      maxActiveTools: ["optional", check.positiveInteger]
    },
    TOOL_CALL: {
      callId: ["required", check.nonEmptyString], name: ["required", check.string],
      args: ["required", check.object]
    },
    APPROVAL_REQUEST: {
      callId: ["required", check.nonEmptyString], toolName: ["required", check.string],
      risk: ["required", check.oneOf(RISKS)], args: ["required", check.object],
      message: ["required", check.nonEmptyString]
    },
    AGENT_RESPONSE: { chunk: ["required", check.string], done: ["required", check.boolean] },
    AUDIO_STREAM: { data: ["required", check.string], mimeType: ["optional", check.string] },
    VOICE_STATE_EVENT: {
      event: ["required", check.oneOf(["turn_complete", "interrupted", "waiting_for_input"])],
      reason: ["optional", check.string]
    },
    SYSTEM_EVENT: {
      kind: ["required", check.oneOf(SYSTEM_EVENT_KINDS)],
      message: ["optional", check.string], data: ["optional", check.object]
    }
  };

  /*
   * Check one received text frame. Returns {frame} with the payload reduced to
   * the known keys (the client strips unknown ones), or {error} saying why the
   * deployed client would drop it.
   */
  function validateFrame(text) {
    var frame;
    if (typeof text !== "string") return { error: "frame is not text" };
    try {
      frame = JSON.parse(text);
    } catch (err) {
      return { error: "not valid json" };
    }
    if (!isObject(frame)) return { error: "frame is not an object" };
    if (!check.nonEmptyString(frame.id)) return { error: "id must be a non-empty string" };
    if (MESSAGE_TYPES.indexOf(frame.type) === -1) return { error: "unknown type" };
    if (SERVER_TYPES.indexOf(frame.type) === -1) return { error: "type is not sent by a server" };
    if (typeof frame.timestamp !== "number" || !isFinite(frame.timestamp)) {
      return { error: "timestamp must be a number" };
    }
    if (!isObject(frame.payload)) return { error: "payload must be an object" };
    if ("meta" in frame && !isObject(frame.meta)) return { error: "meta must be an object" };

    var schema = PAYLOAD_SCHEMAS[frame.type];
    var payload = {};
    for (var field in schema) {
      var presence = schema[field][0];
      var valid = schema[field][1];
      if (!(field in frame.payload)) {
        if (presence === "required") return { error: "payload." + field + " is missing" };
        continue;
      }
      var value = frame.payload[field];
      if (value === null) {
        if (presence !== "nullable") return { error: "payload." + field + " is null" };
      } else if (!valid(value)) {
        return { error: "payload." + field + " is invalid" };
      }
      payload[field] = value;
    }
    var clean = { id: frame.id, type: frame.type, timestamp: frame.timestamp, payload: payload };
    if ("meta" in frame) clean.meta = frame.meta;
    return { frame: clean };
  }

  function closeIsPermanent(code) {
    return PERMANENT_CLOSE_CODES.indexOf(code) !== -1;
  }

  // --- tool declarations and arguments ----------------------------------------

  var PARAMETER_TYPES = ["STRING", "NUMBER", "BOOLEAN", "OBJECT", "ARRAY"];

  /* Why args do not fit an AITP parameter schema, or null when they do. */
  function argumentsError(schema, value, where) {
    if (!schema) return null;
    var type = schema.type;
    var ok = (type === "STRING" && typeof value === "string") ||
      (type === "NUMBER" && typeof value === "number" && isFinite(value)) ||
      (type === "BOOLEAN" && typeof value === "boolean") ||
      (type === "OBJECT" && isObject(value)) ||
      (type === "ARRAY" && Array.isArray(value)) ||
      PARAMETER_TYPES.indexOf(type) === -1;
    if (!ok) return where + " must be " + String(type).toLowerCase();
    if (Array.isArray(schema.enum) && schema.enum.indexOf(value) === -1) {
      return where + " must be one of " + schema.enum.join(", ");
    }
    if (type === "OBJECT") {
      var required = schema.required || [];
      for (var i = 0; i < required.length; i++) {
        if (value[required[i]] === undefined || value[required[i]] === null) {
          return where + "." + required[i] + " is required";
        }
      }
      var properties = schema.properties || {};
      for (var key in properties) {
        if (value[key] === undefined) continue;
        var error = argumentsError(properties[key], value[key], where + "." + key);
        if (error) return error;
      }
    }
    if (type === "ARRAY" && schema.items) {
      for (var j = 0; j < value.length; j++) {
        var itemError = argumentsError(schema.items, value[j], where + "[" + j + "]");
        if (itemError) return itemError;
      }
    }
    return null;
  }

  function declarationOf(tool) {
    var declaration = { name: tool.name, description: tool.description || "" };
    if (tool.parameters) declaration.parameters = tool.parameters;
    declaration.risk = tool.risk;
    return declaration;
  }

  // --- small helpers -----------------------------------------------------------

  function newMessageId() {
    if (global.crypto && typeof global.crypto.randomUUID === "function") {
      return "msg_" + global.crypto.randomUUID();
    }
    // randomUUID needs a secure context; build a v4 UUID by hand otherwise.
    var bytes = new Uint8Array(16);
    global.crypto.getRandomValues(bytes);
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    var hex = Array.prototype.map.call(bytes, function (b) {
      return (b + 0x100).toString(16).slice(1);
    }).join("");
    return "msg_" + hex.slice(0, 8) + "-" + hex.slice(8, 12) + "-" + hex.slice(12, 16) +
      "-" + hex.slice(16, 20) + "-" + hex.slice(20);
  }

  function errorText(err) {
    if (err && typeof err.message === "string" && err.message) return err.message;
    return String(err || "the tool failed");
  }

  function defaultEndpoint() {
    var scheme = global.location.protocol === "https:" ? "wss:" : "ws:";
    return scheme + "//" + global.location.host + "/owllayer";
  }

  // --- the approval dialog -------------------------------------------------------

  var DIALOG_STYLE =
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
    var style = document.createElement("style");
    style.id = "owl-approval-style";
    style.textContent = DIALOG_STYLE;
    document.head.appendChild(style);
  }

  /*
   * Show one approval as a modal <dialog>; decide(true|false) is called once.
   * Escape counts as Decline: for a payment, the safe answer.
   */
  function showApprovalDialog(request, decide) {
    ensureDialogStyle();
    var dialog = document.createElement("dialog");
    dialog.className = "owl-approval";
    dialog.id = "owl-approval";
    dialog.setAttribute("aria-labelledby", "owl-approval-title");
    dialog.dataset.callId = request.callId;

    var title = document.createElement("h2");
    title.id = "owl-approval-title";
    title.textContent = "Approve this action?";
    var message = document.createElement("p");
    message.className = "owl-approval-message";
    message.textContent = request.message;
    var facts = document.createElement("p");
    var risk = document.createElement("span");
    risk.className = "owl-approval-risk";
    risk.textContent = request.risk;
    facts.appendChild(document.createTextNode(request.toolName + " "));
    facts.appendChild(risk);
    var args = document.createElement("pre");
    args.className = "owl-approval-args";
    args.textContent = JSON.stringify(request.args, null, 2);

    var buttons = document.createElement("div");
    buttons.className = "owl-approval-buttons";
    var decline = document.createElement("button");
    decline.type = "button";
    decline.textContent = "Decline";
    decline.setAttribute("data-owl-decline", "");
    var approve = document.createElement("button");
    approve.type = "button";
    approve.textContent = "Approve";
    approve.setAttribute("data-owl-approve", "");
    buttons.appendChild(decline);
    buttons.appendChild(approve);

    [title, message, facts, args, buttons].forEach(function (node) { dialog.appendChild(node); });
    document.body.appendChild(dialog);

    var decided = false;
    function finish(approved) {
      if (decided) return;
      decided = true;
      dialog.close();
      dialog.remove();
      decide(approved);
    }
    approve.addEventListener("click", function () { finish(true); });
    decline.addEventListener("click", function () { finish(false); });
    dialog.addEventListener("cancel", function (event) {
      event.preventDefault();
      finish(false);
    });
    dialog.showModal();
    return {
      // The connection that asked is gone: the answer could reach no one.
      dismiss: function () {
        if (decided) return;
        decided = true;
        dialog.close();
        dialog.remove();
      }
    };
  }

  // --- the client ------------------------------------------------------------------

  function OwlLayerClient(options) {
    options = options || {};
    this.apiKey = options.apiKey || "";
    this.endpoint = options.endpoint || defaultEndpoint();
    this.showApproval = options.showApproval || showApprovalDialog;
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
    this.errorShown = false;
    this.contextDirty = false;
    this.contextQueued = false;
    this.agentText = "";
    this.approvalQueue = [];
    this.openApproval = null;
    this.toolsEffective = null;
    // What tests and the page can read; kept current by the client.
    this.wire = {
      state: "idle", frames: [], sent: [], dropped: 0, droppedReasons: [],
      connects: 0, closes: [], retryInMs: null, sessionId: null
    };
    if (options.expose !== false) global.__owl = this.wire;
  }

  OwlLayerClient.prototype.on = function (event, listener) {
    (this.listeners[event] = this.listeners[event] || []).push(listener);
    return this;
  };

  OwlLayerClient.prototype.emit = function (event, data) {
    (this.listeners[event] || []).slice().forEach(function (listener) {
      try {
        listener(data);
      } catch (err) {
        // A broken page listener must not break the protocol; make it visible.
        console.error("owllayer: " + event + " listener failed", err);
      }
    });
  };

  Object.defineProperty(OwlLayerClient.prototype, "state", {
    get: function () { return this.wire.state; }
  });

  OwlLayerClient.prototype.setState = function (state) {
    if (this.wire.state === state) return;
    this.wire.state = state;
    this.emit("state", state);
  };

  // --- connection lifecycle ---

  OwlLayerClient.prototype.connect = function () {
    this.stopped = false;
    this.open();
    return this;
  };

  OwlLayerClient.prototype.disconnect = function () {
    this.stopped = true;
    this.clearRetry();
    if (this.ws) this.ws.close(1000, "client closed");
    this.setState("closed");
  };

  OwlLayerClient.prototype.open = function () {
    var self = this;
    var url = this.endpoint + "?apiKey=" + encodeURIComponent(this.apiKey);
    var generation = ++this.generation;
    this.acknowledged = false;
    this.errorShown = false;
    this.agentText = "";
    this.sessionId = null;
    this.wire.sessionId = null;
    this.wire.connects += 1;
    this.setState("connecting");
    var ws = new WebSocket(url);
    this.ws = ws;
    ws.onopen = function () {
      if (generation !== self.generation) return;
      self.attempts = 0;
      self.send("HANDSHAKE_INIT", {
        apiKey: self.apiKey,
        userAgent: navigator.userAgent,
        viewport: global.innerWidth + "x" + global.innerHeight,
        sdkVersion: SDK_VERSION,
        protocolVersion: PROTOCOL_VERSION
      });
      self.handshakeTimer = setTimeout(function () { self.handshakeTimedOut(generation); },
        HANDSHAKE_TIMEOUT_MS);
    };
    ws.onmessage = function (event) {
      if (generation === self.generation) self.receive(event.data);
    };
    ws.onclose = function (event) {
      if (generation === self.generation) self.closed(event.code, event.reason);
    };
  };

  OwlLayerClient.prototype.handshakeTimedOut = function (generation) {
    if (generation !== this.generation || this.acknowledged) return;
    this.setState("error");
    this.showError("Handshake timeout");
    this.ws.close(4000, "Handshake timeout");
  };

  OwlLayerClient.prototype.closed = function (code, reason) {
    clearTimeout(this.handshakeTimer);
    this.wire.closes.push({ code: code, reason: reason });
    this.acknowledged = false;
    this.dismissApprovals();
    this.emit("close", { code: code, reason: reason });
    if (this.stopped) {
      this.setState("closed");
      return;
    }
    if (closeIsPermanent(code)) {
      // wire-compat 2: no reconnect; show the reason unless the server
      // already explained itself with an error event.
      this.stopped = true;
      this.showError(reason || "The connection was refused (" + code + ").");
      this.setState("error");
      return;
    }
    if (this.attempts >= MAX_RECONNECT_ATTEMPTS) {
      this.stopped = true;
      this.showError("Could not reconnect to the assistant.");
      this.setState("error");
      return;
    }
    this.attempts += 1;
    var self = this;
    var delay = RECONNECT_STEP_MS * this.attempts;
    this.wire.retryInMs = delay;
    this.setState("reconnecting");
    this.retryTimer = setTimeout(function () {
      self.retryTimer = null;
      self.wire.retryInMs = null;
      self.open();
    }, delay);
  };

  OwlLayerClient.prototype.clearRetry = function () {
    if (this.retryTimer !== null) clearTimeout(this.retryTimer);
    this.retryTimer = null;
    this.wire.retryInMs = null;
  };

  OwlLayerClient.prototype.showError = function (message) {
    if (this.errorShown) return;
    this.errorShown = true;
    this.emit("error", { message: message });
  };

  // --- frames out ---

  OwlLayerClient.prototype.send = function (type, payload) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return false;
    if (type !== "HANDSHAKE_INIT" && type !== "CONTEXT_UPDATE") {
      // wire-compat 4: a pending context update goes first, so that after a
      // tool navigated the page the server sees the new page's tools first.
      this.flushContext();
    }
    var frame = { id: newMessageId(), type: type, timestamp: Date.now(), payload: payload };
    this.ws.send(JSON.stringify(frame));
    this.log(this.wire.sent, frame);
    return true;
  };

  OwlLayerClient.prototype.log = function (list, frame) {
    list.push(frame);
    if (list.length > MAX_LOGGED_FRAMES) list.shift();
  };

  OwlLayerClient.prototype.sendText = function (text) {
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
    if (!this.send("USER_INPUT", { modality: "text", content: text })) return false;
    this.setState("thinking");
    return true;
  };

  // --- page context and tools ---

  OwlLayerClient.prototype.registerTool = function (tool, handler) {
    if (!tool || typeof tool.name !== "string" || !tool.name) throw new Error("a tool needs a name");
    var risk = tool.risk === undefined ? "none" : tool.risk;
    if (RISKS.indexOf(risk) === -1) throw new Error("unknown risk for " + tool.name + ": " + risk);
    if (typeof handler !== "function") throw new Error("tool " + tool.name + " needs a handler");
    if (!(tool.name in this.tools)) this.toolOrder.push(tool.name);
    this.tools[tool.name] = {
      name: tool.name, description: tool.description || "", parameters: tool.parameters,
      risk: risk, handler: handler, approvalMessage: tool.approvalMessage
    };
    this.contextChanged();
    return this;
  };

  OwlLayerClient.prototype.unregisterTool = function (name) {
    if (!(name in this.tools)) return this;
    delete this.tools[name];
    this.toolOrder = this.toolOrder.filter(function (n) { return n !== name; });
    this.contextChanged();
    return this;
  };

  OwlLayerClient.prototype.setContext = function (context) {
    this.context = isObject(context) ? context : {};
    this.contextChanged();
    return this;
  };

  /* Call after a client-side navigation: the url and title are read at send time. */
  OwlLayerClient.prototype.pageChanged = function () {
    this.contextChanged();
    return this;
  };

  OwlLayerClient.prototype.activeTools = function () {
    var self = this;
    var names = this.toolOrder.slice(0, this.maxActiveTools);
    if (this.toolOrder.length > names.length) {
      console.warn("owllayer: only the first " + this.maxActiveTools + " tools are sent");
    }
    return names.map(function (name) { return declarationOf(self.tools[name]); });
  };

  // Changes made together (in one task) leave as one CONTEXT_UPDATE.
  OwlLayerClient.prototype.contextChanged = function () {
    this.contextDirty = true;
    if (this.contextQueued) return;
    this.contextQueued = true;
    var self = this;
    queueMicrotask(function () {
      self.contextQueued = false;
      self.flushContext();
    });
  };

  OwlLayerClient.prototype.flushContext = function () {
    if (!this.contextDirty || !this.acknowledged) return;
    this.contextDirty = false;
    this.send("CONTEXT_UPDATE", {
      url: global.location.pathname,
      title: document.title,
      activeTools: this.activeTools(),
      context: this.context
    });
  };

  // --- frames in ---

  OwlLayerClient.prototype.receive = function (data) {
    var checked = validateFrame(data);
    if (checked.error) {
      this.wire.dropped += 1;
      this.log(this.wire.droppedReasons, { reason: checked.error, text: String(data).slice(0, 500) });
      return;
    }
    var frame = checked.frame;
    this.log(this.wire.frames, frame);
    this.emit("frame", frame);
    var payload = frame.payload;
    switch (frame.type) {
      case "HANDSHAKE_ACK": return this.onAck(payload);
      case "TOOL_CALL": return this.onToolCall(payload);
      case "APPROVAL_REQUEST": return this.onServerApproval(payload);
      case "AGENT_RESPONSE": return this.onAgentResponse(payload);
      case "SYSTEM_EVENT": return this.onSystemEvent(payload);
      default: return undefined; // voice frames: this client has no microphone
    }
  };

  OwlLayerClient.prototype.onAck = function (payload) {
    if (this.acknowledged) return;
    clearTimeout(this.handshakeTimer);
    this.acknowledged = true;
    this.errorShown = false;
    this.sessionId = payload.sessionId;
    this.wire.sessionId = payload.sessionId;
    this.maxActiveTools = payload.maxActiveTools || DEFAULT_MAX_ACTIVE_TOOLS;
    this.setState("connected");
    this.emit("connected", { sessionId: payload.sessionId });
    this.contextDirty = true;
    this.flushContext();
  };

  OwlLayerClient.prototype.onAgentResponse = function (payload) {
    if (payload.done) {
      // The closing frame carries the complete text; an empty one ends the
      // turn and keeps what the deltas built.
      if (payload.chunk) this.agentText = payload.chunk;
      var text = this.agentText;
      this.agentText = "";
      this.emit("agent", { text: text, done: true });
      if (this.wire.state === "thinking") this.setState("connected");
      return;
    }
    if (!payload.chunk) return;
    this.agentText += payload.chunk;
    this.emit("agent", { text: this.agentText, done: false });
  };

  OwlLayerClient.prototype.onSystemEvent = function (payload) {
    var data = payload.data || {};
    switch (payload.kind) {
      case "error":
        this.errorShown = true;
        this.emit("error", { message: payload.message || "The assistant reported an error.", data: data });
        return;
      case "tools_effective":
        this.toolsEffective = data;
        this.emit("tools", data);
        return;
      case "transcript":
        this.emit("transcript.delta", data);
        return;
      case "reload":
        this.emit("system", payload);
        global.location.reload();
        return;
      case "redirect":
        this.emit("system", payload);
        this.redirect(data.url);
        return;
      case "disconnect":
        // The server ended the session: do not come back on our own.
        this.stopped = true;
        this.clearRetry();
        this.errorShown = true;
        this.emit("error", { message: payload.message || "The session was ended.", data: data });
        return;
      default: // waiting, approval_required: informative only
        this.emit("system", payload);
    }
  };

  OwlLayerClient.prototype.redirect = function (url) {
    if (typeof url !== "string" || !url) return;
    var target;
    try {
      target = new URL(url, global.location.href);
    } catch (err) {
      console.warn("owllayer: ignored a redirect to an unreadable url");
      return;
    }
    // Only web pages: a javascript: or data: url would run in this page.
    if (target.protocol !== "http:" && target.protocol !== "https:") {
      console.warn("owllayer: ignored a redirect to a non-http url");
      return;
    }
    global.location.assign(target.href);
  };

  // --- tool calls and approvals ---

  OwlLayerClient.prototype.onToolCall = function (payload) {
    var callId = payload.callId;
    var tool = this.tools[payload.name];
    if (!tool) return this.toolResult(callId, { error: "unknown tool: " + payload.name });
    var problem = argumentsError(tool.parameters, payload.args, "args");
    if (problem) return this.toolResult(callId, { error: "invalid arguments: " + problem });
    var self = this;
    if (APPROVAL_RISKS.indexOf(tool.risk) === -1) {
      return this.runTool(tool, payload.args, callId, function (outcome) {
        self.toolResult(callId, outcome);
      });
    }
    // wire-compat 5: suspend before the handler runs and ask; no TOOL_RESULT follows.
    var message = tool.approvalMessage ? tool.approvalMessage(payload.args) : "";
    var request = {
      callId: callId, toolName: tool.name, risk: tool.risk, args: payload.args,
      message: message || "Allow " + tool.name + "?"
    };
    this.send("APPROVAL_REQUEST", request);
    this.askUser(request, function (approved) {
      if (!approved) {
        self.send("APPROVAL_RESPONSE", { callId: callId, approved: false, error: DENIED_BY_USER });
        return;
      }
      self.runTool(tool, payload.args, callId, function (outcome) {
        var response = { callId: callId, approved: true };
        if ("error" in outcome) response.error = outcome.error;
        else response.result = outcome.result;
        self.send("APPROVAL_RESPONSE", response);
      });
    });
    return undefined;
  };

  OwlLayerClient.prototype.onServerApproval = function (payload) {
    var self = this;
    this.askUser(payload, function (approved) {
      var response = { callId: payload.callId, approved: approved };
      if (!approved) response.error = DENIED_BY_USER;
      self.send("APPROVAL_RESPONSE", response);
    });
  };

  /* Run a handler; answer(outcome) gets {result} or {error}, on this connection only. */
  OwlLayerClient.prototype.runTool = function (tool, args, callId, answer) {
    var self = this;
    var generation = this.generation;
    Promise.resolve()
      .then(function () { return tool.handler(args, { callId: callId }); })
      .then(function (result) {
        return { result: result === undefined ? null : result };
      }, function (err) {
        return { error: errorText(err) };
      })
      .then(function (outcome) {
        // The call belonged to a connection that is gone; the server already
        // closed it as disconnected.
        if (generation !== self.generation) return;
        answer(outcome);
        self.emit("tool", { name: tool.name, callId: callId, outcome: outcome });
      });
  };

  OwlLayerClient.prototype.toolResult = function (callId, outcome) {
    if ("error" in outcome) {
      this.send("TOOL_RESULT", { callId: callId, status: "error", result: null, error: outcome.error });
    } else {
      this.send("TOOL_RESULT", { callId: callId, status: "success", result: outcome.result });
    }
  };

  // One dialog at a time; the others wait their turn.
  OwlLayerClient.prototype.askUser = function (request, decide) {
    this.approvalQueue.push({ request: request, decide: decide, generation: this.generation });
    this.emit("approval", request);
    this.nextApproval();
  };

  OwlLayerClient.prototype.nextApproval = function () {
    if (this.openApproval || !this.approvalQueue.length) return;
    var item = this.approvalQueue.shift();
    var self = this;
    this.openApproval = this.showApproval(item.request, function (approved) {
      self.openApproval = null;
      if (item.generation === self.generation) item.decide(approved);
      self.emit("approval.decided", { callId: item.request.callId, approved: approved });
      self.nextApproval();
    });
  };

  OwlLayerClient.prototype.dismissApprovals = function () {
    this.approvalQueue = [];
    if (this.openApproval) {
      this.openApproval.dismiss();
      this.openApproval = null;
    }
  };

  OwlLayerClient.SDK_VERSION = SDK_VERSION;
  OwlLayerClient.PROTOCOL_VERSION = PROTOCOL_VERSION;
  OwlLayerClient.validateFrame = validateFrame;
  OwlLayerClient.closeIsPermanent = closeIsPermanent;
  OwlLayerClient.argumentsError = argumentsError;
  OwlLayerClient.showApprovalDialog = showApprovalDialog;
  global.OwlLayerClient = OwlLayerClient;
})(window);
