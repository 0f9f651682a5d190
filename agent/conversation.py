"""The session's conversation, kept by its agent: the messages the model is
sent (``history``, Anthropic content blocks) and the stored copies that wait
for the turn's next checkpoint (``unsaved``, each with its number).

The model's copy and the stored one differ only where the record says more:
a voice turn's words marked heard or said (``agent.voice.voice_record``), a
failed turn's ``turn_error`` block (read by ``aitp.transcript``).
"""
from __future__ import annotations

from agent.parts import PageSnapshot
from agent.voice import Speaker, voice_record

# What the model is told of a call whose socket dropped before it was answered.
NOT_ANSWERED = "The page was disconnected before it answered; the call's outcome is unknown."


class Conversation:
    def __init__(self) -> None:
        self.history: list[dict] = []
        self.unsaved: list[dict] = []
        self._seq = 0
        self._last_page: PageSnapshot | None = None

    @classmethod
    def restored(cls, stored: list[dict]) -> Conversation:
        """The conversation of a session continued on a new socket, from its
        stored messages (``seq``, ``role``, ``content``, in order): the
        model's copy without the record's marks, and a call left without
        its result answered as not answered, so that every tool_use the
        model sees has exactly one tool_result."""
        conversation = cls()
        for message in stored:
            conversation._seq = max(conversation._seq, message["seq"])
            content = [_model_block(block) for block in message["content"]
                       if isinstance(block, dict) and block.get("type") != "turn_error"]
            if content:
                _extend(conversation.history, message["role"], content)
        conversation.history = _answered(conversation.history)
        return conversation

    def append(self, role: str, content: list[dict], *, speaker: Speaker | None = None,
               interrupted: bool = False) -> None:
        """A message for the model and for the record; ``speaker``: the
        running voice turn's voice (the stored copy says what was heard or said)."""
        # Consecutive user messages (a turn that failed after its tool results)
        # are merged so the conversation keeps alternating.
        if role == "user":
            _extend(self.history, role, [_model_block(block) for block in content])
        else:
            self.history.append({"role": role, "content": content})
        self._seq += 1
        if speaker is not None:
            content = voice_record(role, content, speaker, interrupted=interrupted)
        # Written at the turn's next checkpoint, with the calls about to run
        # or with the turn's usage: one database round trip instead of one
        # per message.
        self.unsaved.append({"seq": self._seq, "role": role, "content": content})

    def awaits_answer(self) -> bool:
        """The last message is the user's (an answer cut short may be stored)."""
        return bool(self.history) and self.history[-1]["role"] == "user"

    def record_failure(self, code: str, message: str) -> None:
        """The turn failed with ``code``: the stored record says so (a
        ``turn_error`` block), on the turn's last message not yet written --
        the user's words, or the tool results the failed request carried --
        or else on a row of its own. The conversation the model is sent is
        unchanged."""
        mark = {"type": "turn_error", "code": code, "message": message}
        if self.unsaved and self.unsaved[-1]["role"] == "user":
            last = self.unsaved[-1]
            last["content"] = [*last["content"], mark]
        else:
            self._seq += 1
            self.unsaved.append({"seq": self._seq, "role": "assistant", "content": [mark]})

    def page_blocks(self, page: PageSnapshot) -> list[dict]:
        """The page the user is on, as a block of their message, when it
        changed since the last one the model was told of."""
        if page == self._last_page:
            return []
        self._last_page = page
        return [{"type": "text", "text": page.describe()}]

    def written(self, messages: list[dict]) -> None:
        """``messages`` (the first of ``unsaved``) reached the database."""
        del self.unsaved[: len(messages)]


# What a block of the time a person was in charge of the chat (``human_block``) is.
TAKEN_OVER = "taken_over"
TO_OPERATOR = "to_operator"  # the page user's words, read by the operator
OPERATOR = "operator"  # the operator's words, shown to the page user as the agent's
HANDED_BACK = "handed_back"
NO_OPERATOR = "no_operator"  # the agent asked for a person, and none was free in time
OPERATOR_TOOL = "operator_tool"  # a page tool the operator ran: "name {arguments}: what it answered"
HUMAN_KINDS = (TAKEN_OVER, TO_OPERATOR, OPERATOR, HANDED_BACK, NO_OPERATOR, OPERATOR_TOOL)


def human_block(kind: str, text: str = "", *, operator: str = "") -> dict:
    """A stored text block of the time an operator is in charge of the chat
    (``operators.handover``): ``human`` says which kind, ``operator`` who.
    It is a user message of the conversation: the model, given it at the
    hand back, reads it as told by ``_model_block``, never as its own words."""
    block = {"type": "text", "text": text, "human": kind}
    if operator:
        block["operator"] = operator
    return block


def _human_words(block: dict) -> str:
    kind, text, name = block["human"], block.get("text", ""), block.get("operator") or "an operator"
    if kind == TAKEN_OVER:
        return (f"[A human operator, {name}, took this chat over from you. Until it is handed back, the "
                "user's messages go to the operator, who answers them; you do not.]")
    if kind == TO_OPERATOR:
        return f"[The user, to the human operator:] {text}"
    if kind == OPERATOR:
        return f"[The human operator {name}, to the user:] {text}"
    if kind == OPERATOR_TOOL:
        return f"[The human operator {name} ran the page tool {text}]"
    if kind == NO_OPERATOR:
        return ("[No human operator was free to join the chat in time, and the user was told so. "
                "Go on helping them yourself.]")
    note = f" with this note: {text}" if text else ""
    return f"[The human operator {name} handed the chat back to you{note}. You answer the user again.]"


def _model_block(block: dict) -> dict:
    """A stored block as the model is sent it: without its voice mark; a
    block of an operator's time in charge told as such."""
    if block.get("human") in HUMAN_KINDS:
        return {"type": "text", "text": _human_words(block)}
    return {name: value for name, value in block.items() if name != "voice"}


def _extend(history: list[dict], role: str, content: list[dict]) -> None:
    if history and history[-1]["role"] == role:
        history[-1] = {"role": role, "content": [*history[-1]["content"], *content]}
    else:
        history.append({"role": role, "content": content})


def _answered(history: list[dict]) -> list[dict]:
    """``history`` where each assistant message's tool_use blocks are
    answered by the next message, first, and tool results that answer
    nothing are left out."""
    repaired: list[dict] = []
    asked: list[str] = []
    for message in history:
        if message["role"] == "assistant":
            if asked:
                repaired.append({"role": "user", "content": _results(asked, [])})
            repaired.append(message)
            asked = [block["id"] for block in message["content"] if block.get("type") == "tool_use"]
            continue
        content = _results(asked, message["content"])
        asked = []
        if content:
            _extend(repaired, "user", content)
    if asked:
        repaired.append({"role": "user", "content": _results(asked, [])})
    return repaired


def _results(asked: list[str], content: list[dict]) -> list[dict]:
    """The user's content with a result for each call in ``asked`` first
    (its own, or "not answered"), and no result for any other call."""
    given = {block.get("tool_use_id"): block for block in content if block.get("type") == "tool_result"}
    results = [given.get(call_id) or {"type": "tool_result", "tool_use_id": call_id,
                                      "content": NOT_ANSWERED, "is_error": True}
               for call_id in asked]
    return [*results, *(block for block in content if block.get("type") != "tool_result")]
