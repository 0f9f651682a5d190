"""The watcher feed of one connection: what operators watching it live see.

Every frame in and out as it went over the wire, audio as its length only,
and every change of the session (opened, context, state, closed), queued on
the connection's ``aitp.live.LivePublisher`` so the connection never waits
on the channel layer, and published only while someone watches. The
connection's runner (``connection.runner``) owns one per open session.
"""
from __future__ import annotations

import json
from collections.abc import Iterable

from aitp import live
from aitp.session import AudioChunkReceived, HandshakeRequested, UserAudioReceived
from aitp.voice.audio import AGENT_RATE, CLIENT_MIME, CLIENT_RATE
from aitp.voice.base import SAMPLE_WIDTH

# Audio reaches watchers as its length, never its samples: an operator reads
# that the user or the agent is speaking, and for how long.
AUDIO_OUT_MARK = '"type":"AUDIO_STREAM"'


class WatcherFeed:
    def __init__(self, session) -> None:
        self.publisher = live.LivePublisher(session)

    def start(self, watched: bool | None = None) -> None:
        """Once the connection is in its session's group (``LivePublisher.start``)."""
        self.publisher.start(watched)

    def inbound(self, events: Iterable[object], frame: str | bytes) -> None:
        """A frame the page sent and the session machine's events of it: a
        frame that made none (refused) or only a handshake (it holds the
        key) is not shown."""
        shown = [event for event in events if not isinstance(event, HandshakeRequested)]
        if shown:
            # Described only when someone watches.
            self.publisher.frame("in", lambda: describe_inbound(shown[0], frame))

    async def watchers_changed(self, event: dict) -> None:
        """A watcher joined or left (the ``live.WATCHERS_COMMAND`` session command)."""
        await self.publisher.watchers_changed(event)

    def outbound(self, frame: str) -> None:
        if self.publisher.watched:
            self.publisher.frame("out", describe_outbound(frame))

    def session_changed(self, what: str, **fields) -> None:
        self.publisher.session_changed(what, **fields)

    async def aclose(self) -> None:
        await self.publisher.aclose()


def describe_inbound(event: object, frame: str | bytes) -> str:
    """An inbound frame for watchers: as the page sent it (the session
    machine parsed it, so it is UTF-8 JSON), its audio as its length."""
    if isinstance(event, AudioChunkReceived):
        body = {"type": "AUDIO_STREAM", "payload": _audio_length(CLIENT_MIME, len(event.pcm), CLIENT_RATE)}
    elif isinstance(event, UserAudioReceived):
        audio = event.audio
        body = {"type": "USER_INPUT", "payload": {
            "modality": "audio", **_audio_length(f"audio/pcm;rate={audio.rate}", len(audio.pcm), audio.rate)}}
    else:
        return frame.decode("utf-8") if isinstance(frame, bytes) else frame
    return json.dumps(body, ensure_ascii=False)


def describe_outbound(frame: str) -> str:
    """A frame sent to the page, for watchers: as sent, but the agent's
    audio as its length."""
    if AUDIO_OUT_MARK not in frame[:120]:
        return frame
    message = json.loads(frame)
    payload = message.get("payload") or {}
    data = str(payload.get("data", ""))
    size = len(data) * 3 // 4 - data[-2:].count("=")
    message["payload"] = _audio_length(str(payload.get("mimeType", "")), size, AGENT_RATE)
    return json.dumps(message, ensure_ascii=False)


def _audio_length(mime_type: str, size: int, rate: int) -> dict:
    return {"mimeType": mime_type, "bytes": size, "seconds": round(size / (SAMPLE_WIDTH * rate), 3)}
