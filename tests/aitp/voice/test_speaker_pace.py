"""The agent's voice goes out at the pace it plays (agent.voice.Speaker)."""
from __future__ import annotations

import asyncio
import base64

from agent import voice as agent_voice
from agent.voice import Speaker
from aitp import protocol as p
from aitp.voice.base import Audio

RATE = 24000
AHEAD = 0.5


class SecondPerSentence:
    """Every sentence is one second of silence at 24 kHz, made at once."""

    async def synthesize(self, text: str, *, owner=None) -> Audio:
        return Audio(b"\0\0" * RATE, RATE)


def audio_seconds(frames: list[p.Message]) -> float:
    return sum(len(base64.b64decode(f.payload.data)) for f in frames
               if f.type == p.MessageType.AUDIO_STREAM) / (2 * RATE)


async def speak(monkeypatch, *sentences: str, pause: float = 0.0) -> tuple[Speaker, list, list]:
    monkeypatch.setattr(agent_voice, "get_tts", SecondPerSentence)
    loop = asyncio.get_running_loop()
    sent: list[p.Message] = []
    seen: list[tuple[float, float]] = []  # (seconds since the first frame, audio seconds sent)
    started: list[float] = []

    async def send(message: p.Message) -> None:
        sent.append(message)
        if message.type == p.MessageType.AUDIO_STREAM:
            started.append(started[0] if started else loop.time())
            seen.append((loop.time() - started[0], audio_seconds(sent)))

    speaker = Speaker(send, ahead=AHEAD)
    speaker.feed(sentences[0])
    if pause:
        await asyncio.sleep(pause)
    for sentence in sentences[1:]:
        speaker.feed(sentence)
    return speaker, sent, seen


async def test_audio_never_runs_more_than_the_lead_ahead_of_its_playback(monkeypatch):
    speaker, _, seen = await speak(monkeypatch, "One. ", "Two. ", "Three.")
    await speaker.finish()
    # Each frame went out when the page had at most AHEAD seconds left to play
    # (the frame itself added on top).
    for elapsed, audio in seen:
        assert audio - elapsed <= AHEAD + 0.3
    assert seen[-1][1] == 3.0


async def test_after_a_pause_the_next_sentence_is_paced_from_when_it_starts(monkeypatch):
    # The first sentence plays out during a pause longer than itself; the
    # page's playback starts again with the next one, which is paced too.
    speaker, _, seen = await speak(monkeypatch, "One. ", "Two. ", "Three.", pause=2.0)
    await speaker.finish()
    after = [(elapsed, audio) for elapsed, audio in seen if audio > 1.0]
    restart = after[0][0]
    for elapsed, audio in after:
        assert (audio - 1.0) - (elapsed - restart) <= AHEAD + 0.3
