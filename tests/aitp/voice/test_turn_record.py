"""What a voice turn writes beside its words: the stored copy of each message
marked heard, said or interrupted (the model's copy untouched), and its audio
in milliseconds. Pure."""
from __future__ import annotations

from types import SimpleNamespace

from agent.voice import Listening, audio_usage, voice_record
from aitp.voice.base import Audio, SpeechError

SPEAKING = SimpleNamespace(failed=None, seconds=1.25)
PAGE = {"type": "text", "text": "[page]\nurl: /cart\ntitle: Cart\ncontext: {}"}


def test_the_users_words_are_stored_marked_heard_and_the_page_after_them_is_not():
    content = [{"type": "text", "text": "what is in my cart"}, PAGE]
    stored = voice_record("user", content, SPEAKING, interrupted=False)
    assert stored == [{"type": "text", "text": "what is in my cart", "voice": "heard"}, PAGE]
    assert content == [{"type": "text", "text": "what is in my cart"}, PAGE]  # the model's copy


def test_the_agents_text_is_stored_marked_said_and_its_tool_calls_are_left_as_they_are():
    tool_use = {"type": "tool_use", "id": "toolu_1", "name": "add_to_cart", "input": {}}
    stored = voice_record("assistant", [{"type": "text", "text": "Adding them."}, tool_use], SPEAKING,
                          interrupted=False)
    assert stored == [{"type": "text", "text": "Adding them.", "voice": "said"}, tool_use]


def test_the_message_a_barge_in_cut_is_stored_marked_interrupted():
    stored = voice_record("assistant", [{"type": "text", "text": "Your cart holds"}], SPEAKING,
                          interrupted=True)
    assert stored == [{"type": "text", "text": "Your cart holds", "voice": "interrupted"}]


def test_text_the_voice_failed_to_say_is_not_marked_said():
    failed = SimpleNamespace(failed=SpeechError("speech_failed"), seconds=0.0)
    content = [{"type": "text", "text": "Two are in your cart."}]
    assert voice_record("assistant", content, failed, interrupted=False) == content


def test_tool_results_of_a_voice_turn_are_not_marked():
    results = [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]
    assert voice_record("user", results, SPEAKING, interrupted=True) == results


async def test_a_voice_turns_audio_is_the_utterance_heard_and_the_audio_sent_in_milliseconds():
    voice = Listening(audio=Audio(b"\0\0" * 24000, 16000))  # 1.5 s
    await voice.wait()
    assert audio_usage(voice, SPEAKING) == {"audio_heard_ms": 1500, "audio_spoken_ms": 1250}
    assert audio_usage(voice, None) == {"audio_heard_ms": 1500, "audio_spoken_ms": 0}


def test_a_typed_turn_has_no_audio_and_an_utterance_not_yet_over_counts_nothing_heard():
    assert audio_usage(None, None) is None
    assert audio_usage(Listening(audio=Audio(b"\0\0", 16000)), None) == {
        "audio_heard_ms": 0, "audio_spoken_ms": 0}
