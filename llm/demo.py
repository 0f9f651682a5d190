"""A scripted stand-in for a model, the default backend when no model key is set.

It reads what a model would (the user's latest words, the newest [page] context, the page's
tools, its own calls' results) and answers a few intents in plain sentences: what it is and
how to connect Claude; opening a product or the cart, adding to the cart, applying a coupon,
paying (the page asks the user to approve); a polite no to the rest. Tools are found by the words of
their names and filled from their schemas, so other pages' tools work when named alike.
Deterministic, no network. llm/offline.py (OWLLAYER_LLM=offline) stays for calling tools by hand.
"""
from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator

from aitp.llm import LlmRequest, StreamEvent
from llm.offline import streamed
from runtime import ids

CONNECT = ("To talk with Claude instead, set ANTHROPIC_API_KEY in the server's environment and "
           "restart it (see \"Two commands\" in the README).")
# What the user says for each intent, checked in this order.
ASKS = {
    "pay": r"\b(pay|payment|checkout|check out|place (?:the|my) order)\b",
    "coupon": r"\b(coupons?|promo|discount|voucher)\b",
    "add": r"\b(add|buy|put)\b",
    "cart": r"\b(cart|basket)\b",
}
SHOW = re.compile(r"\b(show|open|see|view|look)\b")
HELLO = re.compile(r"\b(hi|hello|hey|help|what can you|who are you|what are you)\b")
REFUSE = re.compile(r"\b(delete|remove|cancel|refund|close|erase|change|reset|password|account|email|send)\b")
# The words a tool's name holds for an intent: one of each set.
NAMES = {
    "product": ({"open", "view", "show", "go"}, {"product", "item"}),
    "add": ({"add", "buy"}, {"cart", "basket", "bag"}),
    "cart": ({"open", "view", "show", "go"}, {"cart", "basket", "bag"}),
    "coupon": ({"coupon", "promo", "discount", "voucher"},),
    "pay": ({"pay", "payment", "checkout", "purchase"},),
}
# Where an intent's tool is found when this page has none: that intent's tool runs first.
ROUTES = {"pay": "cart", "add": "product", "coupon": "cart"}
FIRST = {"cart": "Let me open your cart first.", "product": "Let me open that product first."}
CAN = {"product": "show you a product", "add": "add it to your cart", "cart": "open your cart",
       "pay": "pay for your order once you approve it", "coupon": "apply a coupon"}
DOING = {"product": "open that product", "add": "add that to your cart", "cart": "open your cart",
         "pay": "make the payment", "coupon": "apply that coupon"}
DONE = {"product": "Here it is.", "cart": "Here is your cart.", "add": "Done!", "pay": "Your payment went through.",
        "coupon": "Coupon applied."}
# A code as people write one: letters and digits, with a digit or in capitals ("OWL10", "WELCOME5").
_CODE = re.compile(r"\b(?=[A-Za-z0-9]*\d)[A-Za-z][A-Za-z0-9]{2,19}\b|\b[A-Z]{4,20}\b")
COUNTS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
          "ten": 10, "couple": 2, "dozen": 12}
_WORD = re.compile(r"[a-z0-9]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_CONTEXT = re.compile(r"^context: (.*)$", re.MULTILINE)


class DemoBackend:
    name = "demo"

    def __init__(self, config: object = None) -> None:
        """Made with the configuration's llm part, as every backend is; it needs none of it."""

    async def stream(self, request: LlmRequest) -> AsyncIterator[StreamEvent]:
        async for event in streamed(*answer(request)):
            yield event


def answer(request: LlmRequest) -> tuple[list[dict], str]:
    """The content blocks and stop reason for this request."""
    said, steps, context = read_conversation(request.messages)
    tools = [tool for tool in request.tools if isinstance(tool.get("name"), str)]
    intent = intent_of(said, tools)
    step = next_step(intent, tools, said, context, [use.get("name") for use in steps])
    if isinstance(step, tuple) and (request.tool_choice or {}).get("type") != "none":
        lead, tool_use = step
        return [*([_text(lead)] if lead else []), tool_use], "tool_use"
    last = request.messages[-1] if request.messages else {}
    results = [b for b in _blocks(last) if b.get("type") == "tool_result"] if last.get("role") == "user" else []
    text = ""
    if results and steps:
        names = {use.get("id"): use.get("name", "") for use in steps}
        text = " ".join(told(names.get(r.get("tool_use_id"), ""), r) for r in results)
    if isinstance(step, tuple):
        step = "I'll stop here for this message: ask me again to go on."
    return [_text(" ".join(filter(None, [text, step])) or reply(intent, tools))], "end_turn"


def read_conversation(messages: list[dict]) -> tuple[str, list[dict], dict]:
    """The user's latest words, this backend's tool_use blocks since, and the newest page context."""
    said, steps, context = "", [], None
    for message in reversed(messages):
        blocks = _blocks(message)
        if message.get("role") == "assistant":
            steps = steps if said else [b for b in blocks if b.get("type") == "tool_use"] + steps
            continue
        for block in blocks:
            text = block.get("text", "") if block.get("type") == "text" and "human" not in block else ""
            if text.startswith("[page]") and context is None:
                found = _CONTEXT.search(text)
                context = _json(found.group(1) if found else "")
            elif text.strip() and not text.startswith("[page]") and not said:
                said = text.strip()
        if said and context is not None:
            break
    return said, steps, context or {}


def intent_of(said: str, tools: list[dict]) -> str:
    lowered = said.lower()
    for intent, pattern in ASKS.items():
        if re.search(pattern, lowered):
            return intent
    if _named(said, products(tools)) or (SHOW.search(lowered) and not HELLO.search(lowered)):
        return "product"
    if HELLO.search(lowered) or not lowered:
        return "hello"
    return "refuse" if REFUSE.search(lowered) else "other"


def next_step(intent: str, tools: list[dict], said: str, context: dict, called: list):
    """(lead text, tool_use) to call next, a sentence when it cannot, or None when nothing is left."""
    if intent not in NAMES:
        return None
    tool = find_tool(intent, tools)
    named = _named(said, products(tools))
    if intent == "add" and named and context.get("productId") not in (None, named):
        tool = None  # another product than this page's: open it first
    if tool is not None:
        return None if tool["name"] in called else call(tool, intent, said, context)
    route = ROUTES.get(intent, "")
    first = find_tool(route, tools) if route else None
    if first is not None and first["name"] not in called:
        return call(first, route, said, context, lead=FIRST.get(route, ""))
    return None if called else f"Sorry, I can't {DOING[intent]} from this page. Here I can {abilities(tools)}."


def call(tool: dict, intent: str, said: str, context: dict, lead: str = ""):
    args = arguments(tool, said, context)
    if args is None and intent == "product":
        return f"Which product would you like? I can show you {_joined(_spoken(products([tool])), 'or')}."
    if args is None and intent == "coupon":
        return "Which coupon? Tell me its code too, and I'll apply it."
    if args is None:
        return f"I can't tell from this page what I need to {DOING[intent]}, sorry."
    if intent == "pay" and 0 in args.values():
        return "Your cart is empty, so there is nothing to pay yet."
    return lead, {"type": "tool_use", "id": "toolu_demo_" + ids.token_hex(6), "name": tool["name"], "input": args}


def arguments(tool: dict, said: str, context: dict) -> dict | None:
    """The tool's required arguments, from the user's words and the page's context."""
    schema, properties = tool.get("input_schema") or {}, _properties(tool)
    args = {}
    for name in schema.get("required") or []:
        param = properties.get(name) if isinstance(properties.get(name), dict) else {}
        args[name] = _value(str(name), param, said, context)
        if args[name] is None:
            return None
    return args


def _value(name: str, param: dict, said: str, context: dict):
    kind, key, known = str(param.get("type", "")).lower(), name.lower(), context.get(name)
    if isinstance(param.get("enum"), list):
        return _named(said, param["enum"]) or (known if known in param["enum"] else None)
    if kind in ("number", "integer") and ("amount" in key or "total" in key):
        total = context.get("total", context.get("amount"))
        return total if _plain(total) and not isinstance(total, str) else None
    if kind in ("number", "integer"):
        counts = [COUNTS.get(w) or int(w) for w in _WORD.findall(said.lower()) if w in COUNTS or w.isdigit()]
        return next((n for n in counts if 0 < n < 1000), 1)
    if "code" in key or "coupon" in key:
        code = _CODE.search(said)
        return code.group(0).upper() if code else None
    return known if isinstance(known, str) else None


def find_tool(intent: str, tools: list[dict]) -> dict | None:
    for tool in tools:
        words = set(_WORD.findall(_CAMEL.sub(" ", tool["name"]).lower()))
        if all(words & group for group in NAMES[intent]):
            return tool
    return None


def products(tools: list[dict]) -> list:
    """The products the tools name: the allowed values of their product parameters."""
    params = [param for tool in tools for name, param in _properties(tool).items()
              if "product" in str(name).lower() and isinstance(param, dict)]
    return list(dict.fromkeys(value for param in params for value in param.get("enum") or []))


def _named(said: str, values: list):
    """The value whose words the user said most of, if any (plurals count: "speakers")."""
    hits = [(len(_stems(said) & _stems(value)), -index) for index, value in enumerate(values)]
    most, index = max(hits, default=(0, 0))
    return values[-index] if most else None


def reachable(tools: list[dict]) -> list[str]:
    """The intents this page's tools serve, here or one step away."""
    return [i for i in NAMES if find_tool(i, tools) or (i in ROUTES and find_tool(ROUTES[i], tools))]


def abilities(tools: list[dict]) -> str:
    can = [CAN[i] for i in reachable(tools)]
    return _joined(can, "and") if can else "only chat, as this page offers me nothing to do"


def reply(intent: str, tools: list[dict]) -> str:
    shown = _spoken(products(tools))[:1]
    first = '"add two to my cart"' if find_tool("add", tools) else f'"show me {shown[0]}"' if shown else ""
    tries = _joined([first, '"pay for my order"' if "pay" in reachable(tools) else ""], "or")
    tries = f"Try {tries}. " if tries else ""
    if intent == "hello":
        return ("Hello! I'm the demo assistant of this server: a small scripted helper, not a language "
                f"model, so I understand only a few plain requests. Here I can {abilities(tools)}. "
                f"{tries}{CONNECT}")
    if intent == "refuse":
        return f"Sorry, I can't help with that: I'm only the demo assistant, and here I can {abilities(tools)}."
    return (f"I'm only the demo assistant, so I didn't understand that. {tries}"
            "With ANTHROPIC_API_KEY set on the server, Claude answers instead.")


def told(name: str, result: dict) -> str:
    """A tool's outcome in a sentence or two."""
    intent = next((i for i in NAMES if find_tool(i, [{"name": name}])), "")
    doing = DOING.get(intent, "do that")
    body = result["content"] if isinstance(result.get("content"), str) else ""  # the agent sends text
    if result.get("is_error"):
        if "declin" in body.lower():
            who = "An operator" if "operator" in body.lower() else "You"
            return f"{who} declined, so I did not {doing}." + (" Nothing was charged." if intent == "pay" else "")
        why = body.strip().rstrip(".") if "{" not in body else ""
        return f"I could not {doing}." + (f" {why}." if why else "")
    closing = " Thank you for shopping with us!" if intent == "pay" else ""
    return " ".join([DONE.get(intent, "Done."), *_facts(intent, _json(body))]) + closing


def _facts(intent: str, data: dict) -> list[str]:
    cart = data.get("cart") if isinstance(data.get("cart"), dict) else {}
    facts = []
    if intent == "pay" and _plain(data.get("orderId")):
        facts.append(f"Your order number is {data['orderId']}, for {_money(data.get('amount'), data)}.")
    if intent == "coupon" and _plain(data.get("label")):
        code = f" ({data['coupon']})" if _plain(data.get("coupon")) else ""
        facts.append(f"{data['label']}{code} now applies to your order.")
    if intent == "add" and _plain(data.get("quantity")):
        of = f" of {_spoken([data['productId']])[0]}" if _plain(data.get("productId")) else ""
        facts.append(f"I added {data['quantity']}{of} to your cart.")
    if _plain(data.get("title")):
        facts.append(f"You are now on {data['title']}.")
    if isinstance(cart.get("itemCount"), int) and intent != "pay":
        facts.append(f"Your cart now holds {cart['itemCount']} item{'s' if cart['itemCount'] != 1 else ''}, "
                     f"{_money(cart.get('total'), cart)} in total.")
    if not facts:
        fields = [f"{_CAMEL.sub(' ', str(k)).replace('_', ' ').lower()} {v}" for k, v in data.items() if _plain(v)]
        facts = [f"It reported {_joined(fields[:3], 'and')}."] if fields else []
    return facts


def _stems(text: object) -> set[str]:
    return {re.sub(r"(?<=\w{3})s$", "", word) for word in _WORD.findall(str(text).lower())}


def _plain(value: object) -> bool:
    return isinstance(value, (str, int, float)) and not isinstance(value, bool) and "{" not in str(value)


def _money(amount: object, where: dict) -> str:
    currency = where.get("currency") if _plain(where.get("currency")) else ""
    return f"{amount:,.2f} {currency}".strip() if isinstance(amount, (int, float)) else "the total"


def _spoken(values: list) -> list[str]:
    return ["the " + " ".join(_WORD.findall(str(value).lower())) for value in values]


def _joined(items: list[str], last: str) -> str:
    items = [item for item in items if item]
    return "".join(items) if len(items) < 2 else ", ".join(items[:-1]) + f" {last} " + items[-1]


def _properties(tool: dict) -> dict:
    properties = (tool.get("input_schema") or {}).get("properties")
    return properties if isinstance(properties, dict) else {}


def _json(text: str) -> dict:
    try:
        found = json.loads(text)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _blocks(message: dict) -> list[dict]:
    content = message.get("content")
    return [_text(content)] if isinstance(content, str) else [b for b in content or [] if isinstance(b, dict)]


def _text(text: str) -> dict:
    return {"type": "text", "text": text}
