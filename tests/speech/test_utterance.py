"""An utterance ends on the client's word, the server's VAD, its longest length, or a stalled stream."""
from __future__ import annotations

import pytest

from speech.utterance import AudioBudget, UtteranceBuffer, VoiceLimits

ONE_SECOND = b"\1\0" * 16000


def limits(**overrides) -> VoiceLimits:
    values = {"max_utterance_seconds": 3.0, "bytes_per_second": 64000, "idle_seconds": 5.0,
              "server_vad": False, "vad_silence_seconds": 0.8}
    values.update(overrides)
    return VoiceLimits(**values)


def test_the_client_ending_the_utterance_gives_all_the_audio_and_its_reason():
    buffer = UtteranceBuffer(limits(), now=0.0)
    assert buffer.append(ONE_SECOND, now=1.0) is None
    assert buffer.append(ONE_SECOND, now=2.0) is None
    utterance = buffer.end("user_stop")
    assert (utterance.reason, utterance.audio.seconds, utterance.truncated) == ("user_stop", 2.0, False)
    assert utterance.audio.pcm == ONE_SECOND * 2


def test_the_longest_utterance_ends_it_as_timeout_and_later_audio_is_dropped():
    buffer = UtteranceBuffer(limits(max_utterance_seconds=2.5), now=0.0)
    assert buffer.append(ONE_SECOND, now=1.0) is None
    assert buffer.append(ONE_SECOND, now=2.0) is None
    assert buffer.append(ONE_SECOND, now=3.0) == "timeout"
    assert buffer.append(ONE_SECOND, now=4.0) is None  # already over
    utterance = buffer.end("user_stop")
    assert utterance.reason == "timeout", "the first reason is the one recorded"
    assert utterance.audio.seconds == 2.5
    assert utterance.truncated


def test_a_stream_that_stalls_ends_as_timeout_after_the_idle_bound():
    buffer = UtteranceBuffer(limits(idle_seconds=5.0), now=0.0)
    buffer.append(ONE_SECOND, now=1.0)
    assert buffer.idle_deadline() == 6.0
    assert buffer.idle(now=5.9) is None
    assert buffer.idle(now=6.0) == "timeout"
    assert buffer.end("vad").reason == "timeout"


def test_an_unknown_end_reason_is_our_bug():
    with pytest.raises(ValueError):
        UtteranceBuffer(limits(), now=0.0).end("bored")


def test_a_page_streaming_in_real_time_stays_inside_the_audio_budget():
    budget = AudioBudget(64000, now=0.0)
    chunk = 8192  # 256 ms at 16 kHz
    assert all(budget.take(chunk, now=i * 0.256) for i in range(1000))


def test_a_page_sending_faster_than_the_budget_is_refused_once_the_burst_is_spent():
    budget = AudioBudget(64000, now=0.0)
    taken = 0
    while budget.take(8192, now=0.0):
        taken += 8192
    assert 64000 * 3 < taken <= 64000 * 4  # the burst: four seconds of the allowed rate
    assert budget.take(8192, now=0.2), "the budget refills with time"
