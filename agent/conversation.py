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


class Conversation:
    def __init__(self) -> None:
        self.history: list[dict] = []
        self.unsaved: list[dict] = []
        self._seq = 0
        self._last_page: PageSnapshot | None = None

    def append(self, role: str, content: list[dict], *, speaker: Speaker | None = None,
               interrupted: bool = False) -> None:
        """A message for the model and for the record; ``speaker``: the
        running voice turn's voice (the stored copy says what was heard or said)."""
        # Consecutive user messages (a turn that failed after its tool results)
        # are merged so the conversation keeps alternating.
        if role == "user" and self.history and self.history[-1]["role"] == "user":
            self.history[-1] = {"role": "user", "content": [*self.history[-1]["content"], *content]}
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
