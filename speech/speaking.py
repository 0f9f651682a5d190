"""The agent's words on their way to speech: sentences as they complete, and where a barge-in cut them.

SentenceSplitter takes the model's text deltas and hands out each sentence as
soon as it is complete, so text to speech starts on the first sentence while
the model is still writing (a "." only ends a sentence once the next character
shows it is not "149.99" or "e.g."). Each sentence knows where it sits in the
agent's full text.

SpokenProgress follows the agent's voice frames as they are sent: after a
VOICE_INTERRUPT, cut() is the offset in the agent's text up to which the user
actually heard it (whole sentences sent, then the share of the current
sentence's audio sent, back to a word boundary). The stored assistant message
is cut there.

Pure: no Django, no asyncio.
"""
from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

# A sentence this long without an end is split at a pause (",", ";", ":")
# or a space, so that a run-on answer still starts speaking early.
MAX_SENTENCE_CHARS = 240
_ABBREVIATIONS = frozenset({
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e", "approx",
    "no", "fig", "inc", "ltd", "co", "jan", "feb", "mar", "apr", "jun", "jul", "aug",
    "sep", "sept", "oct", "nov", "dec", "mon", "tue", "wed", "thu", "fri", "sat", "sun",
})
_END = re.compile(r"[.!?…。！？]+[\"'”’)\]]*(?=\s)|\n\s*\n|\n(?=\s*(?:[-*•]|\d+[.)])\s)")
_PAUSE = re.compile(r"[,;:—–]\s")
_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
_MARKUP = re.compile(r"`{1,3}|\*{1,3}|_{2,}|^#{1,6}\s*|^\s*[-*•]\s+|^\s*>\s*", re.MULTILINE)
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class Sentence:
    # What text to speech says: the sentence without Markdown marks.
    text: str
    # Where the sentence sits in the agent's full text: text[start:end].
    start: int
    end: int


def speakable(text: str) -> str:
    """Text as it should be read aloud: links by their words, no Markdown marks, single spaces."""
    text = _LINK.sub(r"\1", text)
    text = _MARKUP.sub(" ", text)
    return _SPACE.sub(" ", text).strip()


class SentenceSplitter:
    def __init__(self, *, max_chars: int = MAX_SENTENCE_CHARS) -> None:
        self.text = ""
        self._done = 0  # offset of the first character not yet handed out
        self._max_chars = max_chars

    def feed(self, delta: str) -> list[Sentence]:
        """The sentences that this delta completed, in order."""
        self.text += delta
        sentences = []
        while True:
            cut = self._next_end()
            if cut is None:
                break
            sentence = self._take(cut)
            if sentence is not None:
                sentences.append(sentence)
        return sentences

    def flush(self) -> Sentence | None:
        """The rest once the model has finished (None when nothing speakable is left)."""
        return self._take(len(self.text))

    def _next_end(self) -> int | None:
        pending = self.text[self._done:]
        for match in _END.finditer(pending):
            if match.group().startswith((".",)) and self._is_abbreviation(pending, match.start()):
                continue
            return self._done + match.end()
        if len(pending) > self._max_chars:
            window = pending[: self._max_chars]
            pauses = list(_PAUSE.finditer(window))
            if pauses:
                return self._done + pauses[-1].end()
            space = window.rfind(" ")
            return self._done + (space + 1 if space > 0 else self._max_chars)
        return None

    @staticmethod
    def _is_abbreviation(pending: str, dot: int) -> bool:
        word = re.search(r"([\w.]+)$", pending[:dot])
        if word is None:
            return False
        token = word.group(1).lower().rstrip(".")
        # "J. Smith", "e.g.", "Dr." do not end a sentence.
        return (len(token) == 1 and token.isalpha()) or token in _ABBREVIATIONS

    def _take(self, end: int) -> Sentence | None:
        start = self._done
        self._done = end
        text = speakable(self.text[start:end])
        if not any(ch.isalnum() for ch in text):
            return None
        return Sentence(text, start, end)


class SpokenProgress:
    """Which part of the agent's text has been sent as voice."""

    def __init__(self) -> None:
        self._queued: deque[tuple[Sentence, int]] = deque()  # (sentence, its audio bytes)
        self._current: tuple[Sentence, int] | None = None
        self._sent_in_current = 0
        self._spoken_to = 0  # offset in the full text: end of the last sentence fully sent

    def queue(self, sentence: Sentence, audio_bytes: int) -> None:
        """A sentence whose audio (of this many bytes) is about to be sent, in order."""
        self._queued.append((sentence, audio_bytes))

    def sent(self, nbytes: int) -> None:
        """This many more bytes of the queued audio went out, in order."""
        while nbytes > 0 or (self._current is None and self._queued and self._queued[0][1] == 0):
            if self._current is None:
                if not self._queued:
                    raise ValueError("more audio sent than was queued")
                self._current, self._sent_in_current = self._queued.popleft(), 0
            sentence, total = self._current
            step = min(nbytes, total - self._sent_in_current)
            self._sent_in_current += step
            nbytes -= step
            if self._sent_in_current >= total:
                self._spoken_to = sentence.end
                self._current = None

    def cut(self, full_text: str) -> int:
        """The offset in full_text up to which the user heard the agent."""
        if self._current is None:
            return self._spoken_to
        sentence, total = self._current
        share = self._sent_in_current / total if total else 1.0
        point = sentence.start + int(share * (sentence.end - sentence.start))
        if point >= sentence.end:
            return sentence.end
        # Back to the end of the last whole word heard.
        space = full_text.rfind(" ", sentence.start, point + 1)
        return space if space > sentence.start else max(self._spoken_to, sentence.start)

    def spoken_text(self, full_text: str) -> str:
        return full_text[: self.cut(full_text)].rstrip()
