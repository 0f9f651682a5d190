"""Stored conversation content (Anthropic content blocks) made readable.

One reading for every page that shows a conversation: the console's session
page, the approval detail in the admin and the live session page.

Pure: no Django, no queries. The stored shapes are the ones sent to the model:
a message's content is a list of blocks (text, tool_use, tool_result) or, from
older rows or other writers, a bare string. Anything else is shown as JSON
rather than dropped, so the record is never silently incomplete.

The agent stores, beside the user's words, a text block describing the page
they were on (``[page]`` then url, title and context lines; agent.loop). It is
read here as a block of its own kind, "page", so pages show the words as the
user wrote them and the page as a detail; the stored rows are unchanged.

A voice turn's stored text blocks carry one more key, ``voice``
(agent.voice.voice_record): "heard" on the user's words transcribed from
their speech, "said" on the agent's words spoken, "interrupted" on the
agent's words a barge-in cut (stored as far as they were said). It is read
into ``Block.voice``; a block without it was typed or written.
``action_words`` names a recorded operator action ("session_end") in words.

While an operator is in charge of the chat in the agent's place
(operators.handover), the stored text blocks carry ``human``
(agent.conversation.human_block): "taken_over" and "handed_back" mark the
moments (a hand back's text is the operator's note to the agent),
"to_operator" holds the page user's words read by the operator, "operator"
the operator's words, which the page user was shown as the agent's. Every
one is stored as a user message, for the model; ``operator`` names who.
It is read into ``Block.human`` and ``Block.operator``.

A turn that failed leaves a ``turn_error`` block (its error code and the
sentence the page was shown; agent.loop) on the stored copy of its last
message: read as a block of kind "error", so the record shows why the
question got no answer.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Block:
    kind: str  # "text", "page", "tool_use", "tool_result", "error" or "other"
    text: str  # for "page": the page's context, as indented JSON
    # the tool's name (tool_use), the page's title (page), the error code (error), the block's own type (other)
    name: str = ""
    ref: str = ""  # the tool_use id (tool_use, tool_result), the page's url (page)
    is_error: bool = False
    voice: str = ""  # text of a voice turn: "heard", "said" or "interrupted"
    human: str = ""  # text of an operator's time in charge: one of HUMAN_TITLES
    operator: str = ""  # the operator's name, as the page user was told it

    @property
    def title(self) -> str:
        """A one-line heading, for pages that show every kind of block alike."""
        if self.human:
            return HUMAN_TITLES[self.human].format(operator=self.operator or "an operator")
        if self.voice:
            return VOICE_TITLES[self.voice]
        if self.kind == "tool_use":
            return f"calls {self.name or '?'}"
        if self.kind == "tool_result":
            return "tool error" if self.is_error else "tool result"
        if self.kind == "page":
            return f"on {self.name or self.ref or 'a page'}"
        if self.kind == "error":
            return f"turn failed: {self.name or 'error'}"
        return self.name if self.kind == "other" else ""

    @property
    def cut_note(self) -> str:
        """Where a barge-in stopped the agent's voice; empty for any other block."""
        return INTERRUPTED_NOTE if self.voice == "interrupted" else ""


# What a voice mark says, as a text block's heading.
VOICE_TITLES = {
    "heard": "heard (spoken by the page user)",
    "said": "said aloud",
    "interrupted": "said aloud until the page user interrupted",
}
# What a block of an operator's time in charge is, as its heading.
HUMAN_TITLES = {
    "taken_over": "{operator} took the chat over",
    "to_operator": "to the operator",
    "operator": "operator {operator}",
    "handed_back": "{operator} handed the chat back",
    "no_operator": "the agent asked for a person; none took the chat over in time",
    "operator_tool": "{operator} ran a page tool",
}
# Shown where the voice stopped, after the text of an "interrupted" block.
INTERRUPTED_NOTE = "the page user spoke over the agent here; the rest of the answer was not said"


# Levels of objects and lists shown; deeper ones are summarised. Indented
# JSON is written by Python's recursive encoder: a context a few hundred
# levels deep (rows stored before the depth limit, or under a larger
# OWLLAYER_MAX_JSON_DEPTH) must not turn a page into a RecursionError.
MAX_SHOWN_DEPTH = 20


def pretty_json(value: Any, *, max_depth: int = MAX_SHOWN_DEPTH) -> str:
    """Indented JSON for arguments and results; nothing for None. Values
    nested deeper than max_depth are shown as "... N more levels"."""
    if value is None:
        return ""
    return json.dumps(bounded(value, max_depth), ensure_ascii=False, indent=2, sort_keys=True,
                      default=str)


def bounded(value: Any, max_depth: int = MAX_SHOWN_DEPTH) -> Any:
    """A copy of a JSON value cut at max_depth levels of objects and lists
    (iterative: any depth is read without recursion)."""
    if not isinstance(value, (dict, list)):
        return value
    root: list = [None]
    # (source, the container to put its copy in, the key there, its depth)
    stack: list[tuple[Any, Any, Any, int]] = [(value, root, 0, 1)]
    while stack:
        source, parent, key, depth = stack.pop()
        if not isinstance(source, (dict, list)):
            parent[key] = source
        elif depth > max_depth:
            parent[key] = f"... {_depth_below(source)} more levels"
        elif isinstance(source, dict):
            copy: Any = dict.fromkeys(source)  # keeps the keys' order
            parent[key] = copy
            for child_key, child in source.items():
                stack.append((child, copy, child_key, depth + 1))
        else:
            copy = [None] * len(source)
            parent[key] = copy
            for index, child in enumerate(source):
                stack.append((child, copy, index, depth + 1))
    return root[0]


def _depth_below(value: Any) -> int:
    """Levels of objects and lists in value, itself included (iterative)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def result_text(content: Any) -> str:
    """A tool_result's content: a string, or a list of text (and other) blocks."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(item.get("text", "")) if isinstance(item, dict) and item.get("type") == "text"
            else pretty_json(item)
            for item in content
        )
    return pretty_json(content)


PAGE_MARK = "[page]\nurl: "
CONTEXT_MARK = "\ncontext: "
TITLE_MARK = "title: "


def page_block(text: str) -> Block | None:
    """The agent's description of the page as a "page" block; None for any
    other text. The url ends at the first line break; the context (one line
    of JSON) starts at the last "context: " line; the title is what lies
    between, whatever line breaks a page put in it."""
    if not text.startswith(PAGE_MARK):
        return None
    url, newline, rest = text[len(PAGE_MARK):].partition("\n")
    context_at = rest.rfind(CONTEXT_MARK)
    if not newline or not rest.startswith(TITLE_MARK) or context_at < 0:
        return None
    title = rest[len(TITLE_MARK):context_at]
    context_text = rest[context_at + len(CONTEXT_MARK):]
    try:
        context = json.loads(context_text)
    except (RecursionError, ValueError):
        shown = context_text
    else:
        shown = pretty_json(context) if context not in ({}, [], None, "") else ""
    return Block(kind="page", text=shown, name=title, ref=url)


def content_block(item: Any) -> Block:
    """One stored block; a bare string counts as text."""
    if isinstance(item, str):
        return Block(kind="text", text=item)
    if not isinstance(item, dict):
        return Block(kind="other", text=pretty_json(item))
    kind = item.get("type")
    if kind == "text":
        text = str(item.get("text", ""))
        human = item.get("human")
        if isinstance(human, str) and human in HUMAN_TITLES:
            return Block(kind="text", text=text, human=human, operator=str(item.get("operator") or ""))
        voice = item.get("voice")
        return page_block(text) or Block(kind="text", text=text,
                                         voice=voice if isinstance(voice, str) and voice in VOICE_TITLES else "")
    if kind == "tool_use":
        return Block(kind="tool_use", text=pretty_json(item.get("input", {})),
                     name=str(item.get("name", "")), ref=str(item.get("id", "")))
    if kind == "tool_result":
        return Block(kind="tool_result", text=result_text(item.get("content")),
                     ref=str(item.get("tool_use_id", "")), is_error=bool(item.get("is_error", False)))
    if kind == "turn_error":
        return Block(kind="error", text=str(item.get("message", "")), name=str(item.get("code", "")))
    return Block(kind="other", text=pretty_json(item), name=str(kind or ""))


def message_blocks(content: Any) -> list[Block]:
    """A message's whole content; a lone block or string is read as a list of one."""
    items = content if isinstance(content, list) else [content]
    return [content_block(item) for item in items]


def conversation_rows(messages: Iterable[Any]) -> list[dict]:
    """``ConversationMessage`` rows (in the order given) as the pages list them."""
    return [
        {"seq": message.seq, "turn": message.turn, "role": message.role,
         "created_at": message.created_at, "blocks": message_blocks(message.content)}
        for message in messages
    ]


# What operators and tenant members did (OperatorAction.action), in words.
ACTION_LABELS = {
    "session_end": "Session ended",
    "session_reload": "Page reloaded",
    "session_redirect": "Page sent elsewhere",
    "approval_approved": "Approved a tool call",
    "approval_denied": "Denied a tool call",
    "key_created": "Key created",
    "key_updated": "Key changed",
    "key_active": "Key re-activated",
    "key_disabled": "Key disabled",
    "key_revoked": "Key revoked",
    "member_added": "Member added",
    "member_role_changed": "Member's role changed",
    "member_removed": "Member removed",
    "tenant_updated": "Tenant changed",
    "tenant_budget_updated": "Budget or alert webhook changed",
    "visitor_secret_rotated": "Visitor secret rotated",
    "session_take_over": "Took the chat over",
    "session_operator_says": "Wrote to the page user",
    "session_operator_tool": "Ran a page tool",
    "session_hand_back": "Handed the chat back",
}


def action_words(code: str) -> str:
    """A recorded action in words; an unknown code is shown readable, not hidden."""
    return ACTION_LABELS.get(code) or (code.replace("_", " ").capitalize() if code else "-")


# The most entries a page is given back (the newest; the oldest go first).
MAX_HISTORY_ENTRIES = 200


def _voice_marks(blocks: list[Block]) -> dict:
    """A spoken message's marks: ``voice``, and ``cut`` for an answer the
    page user talked over (it ends where its voice stopped)."""
    marks = {"voice": True} if any(block.voice for block in blocks) else {}
    if any(block.voice == "interrupted" for block in blocks):
        marks["cut"] = True
    return marks


def visible_history(messages: Iterable[Any], *, limit: int = MAX_HISTORY_ENTRIES) -> tuple[list[dict], bool]:
    """What a shopper saw of a conversation, for a page drawing it again
    (docs/protocol.md §3b): the user's words and the agent's (an operator's
    in charge among them), a line per tool the agent called and the
    sentence a failed turn showed; never the page descriptions, tool
    arguments or results. ``ConversationMessage`` rows in order; the newest
    ``limit`` entries, and whether older ones were left out."""
    entries: list[dict] = []
    for message in messages:
        blocks = message_blocks(message.content)
        words = "\n\n".join(block.text for block in blocks
                             if block.kind == "text" and not block.human and block.text)
        if words:
            entries.append({"role": message.role, "text": words, "turn": message.turn,
                            **_voice_marks(blocks)})
        for block in blocks:
            if block.human and (entry := _human_entry(block, message.turn)) is not None:
                entries.append(entry)
        entries.extend({"role": "tool", "name": block.name, "turn": message.turn}
                       for block in blocks if block.kind == "tool_use")
        entries.extend({"role": "error", "code": block.name, "text": block.text, "turn": message.turn}
                       for block in blocks if block.kind == "error")
    return entries[-limit:], len(entries) > limit


# What the page user was shown, as the agent's text, when an operator took
# the chat over and when they handed it back (connection.turns sends them).
OPERATOR_JOINED = "{operator} has joined the chat and answers you now."
OPERATOR_LEFT = "{operator} has handed the chat back to the assistant."


def _human_entry(block: Block, turn: int) -> dict | None:
    """A block of an operator's time in charge as the page user saw it: the
    operator's words as the agent's (``operator`` says whose), their own
    words as theirs, the take over and the hand back as the sentence the
    page was shown. Never the hand back's note: it was for the agent, nor
    the end of a wait for a person (the page was told it as a notice), nor
    a page tool the operator ran (the page ran it)."""
    if block.human in ("no_operator", "operator_tool"):
        return None
    if block.human in ("to_operator", "operator"):
        if not block.text:
            return None
        if block.human == "to_operator":
            return {"role": "user", "text": block.text, "turn": turn}
        return {"role": "assistant", "text": block.text, "turn": turn, "operator": block.operator}
    shown = OPERATOR_JOINED if block.human == "taken_over" else OPERATOR_LEFT
    return {"role": "assistant", "text": shown.format(operator=block.operator or "An operator"), "turn": turn}
