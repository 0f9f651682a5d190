"""The numbered frames of a client that can resume (docs/protocol.md §3a).

Every frame sent to a client that offered ``resume`` carries ``meta.seq``:
1, 2, 3... after the number its HANDSHAKE_ACK gave. The outbox keeps the
latest frames, so that when the socket drops while the session's turn goes
on, the client's next socket on this process is sent what followed the last
frame it handled (its ``lastSeq``), in order, and only that. It also knows
which of the page's calls (TOOL_CALL, or APPROVAL_REQUEST) went out with
which number: a call the page handled but never answered may have run and
is not sent again (protocol.md §6).

Kept: at most ``max_frames`` frames and ``max_bytes`` of them, the oldest
dropped first. A client whose ``lastSeq`` is older than the oldest kept frame
is sent every kept frame; what was dropped is lost for it.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace

from aitp import protocol as p

MAX_FRAMES = 2000
MAX_BYTES = 2 * 1024 * 1024
# Call frames remembered, whether or not the frame itself is still kept.
MAX_CALLS = 1000
# The frames that ask the page to act on a call.
_CALL_FRAMES = (p.MessageType.TOOL_CALL, p.MessageType.APPROVAL_REQUEST)


@dataclass
class Outbox:
    # The number of the last frame given one (the ACK's is where the count starts).
    seq: int = 0
    max_frames: int = MAX_FRAMES
    max_bytes: int = MAX_BYTES
    _frames: deque[tuple[int, str]] = field(default_factory=deque)
    _bytes: int = 0
    # The envelope id of the last USER_INPUT taken from the client.
    last_input: str | None = None
    # (number, callId) of the latest call frames.
    _calls: deque[tuple[int, str]] = field(default_factory=lambda: deque(maxlen=MAX_CALLS))

    def ack_meta(self, last_input: str | None = None) -> dict:
        """The HANDSHAKE_ACK's ``meta``: where the count starts, and the id of
        the last USER_INPUT the session took (a continued one: the client
        sends again one it sent later, which never arrived)."""
        return {"seq": self.seq, **({"lastInput": last_input} if last_input else {})}

    def repeated(self, input_id: str) -> bool:
        """Whether a USER_INPUT is the one taken last, sent again on a new
        socket; otherwise it is taken now."""
        if input_id == self.last_input:
            return True
        self.last_input = input_id
        return False

    def numbered(self, message: p.Message) -> str:
        """The frame of ``message`` with the next number, kept."""
        self.seq += 1
        text = p.serialize(replace(message, meta={**(message.meta or {}), "seq": self.seq}))
        call_id = getattr(message.payload, "callId", None) if message.type in _CALL_FRAMES else None
        self.keep(self.seq, text, call_id=call_id)
        return text

    def keep(self, seq: int, text: str, *, call_id: str | None = None) -> None:
        self._frames.append((seq, text))
        self._bytes += len(text)
        if call_id is not None:
            self._calls.append((seq, call_id))
        while self._frames and (len(self._frames) > self.max_frames or self._bytes > self.max_bytes):
            self._bytes -= len(self._frames.popleft()[1])

    def position(self, last_seq: int | None) -> int:
        """Where a client that handled up to ``last_seq`` goes on from: its
        number when the frames after it are all kept; otherwise the number
        before the oldest kept frame. ``None`` (a client that does not say)
        counts as having handled everything sent."""
        if last_seq is None or last_seq >= self.seq:
            return self.seq
        oldest = self._frames[0][0] if self._frames else self.seq + 1
        return max(last_seq, oldest - 1)

    def after(self, position: int) -> list[tuple[int, str]]:
        """The kept frames numbered after ``position`` (number, text), in order."""
        return [(seq, text) for seq, text in self._frames if seq > position]

    def calls_through(self, position: int) -> list[str]:
        """The calls whose frame the client handled (numbered up to ``position``)."""
        return [call_id for seq, call_id in self._calls if seq <= position]
