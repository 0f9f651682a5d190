"""The page's audio is checked before anything is buffered: each refusal has its own code."""
from __future__ import annotations

import base64
import io
import wave

import pytest

from aitp.voice.audio import AudioRefused
from aitp.voice.inbound import stream_chunk, whole_message

MIC = "audio/pcm;rate=16000"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def wav_bytes(pcm: bytes, *, rate: int = 16000, channels: int = 1, width: int = 2) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(channels)
        writer.setsampwidth(width)
        writer.setframerate(rate)
        writer.writeframes(pcm)
    return buffer.getvalue()


def refusal(call, *args, **kwargs) -> AudioRefused:
    with pytest.raises(AudioRefused) as caught:
        call(*args, **kwargs)
    return caught.value


def test_a_microphone_chunk_of_256_ms_gives_its_samples_back():
    pcm = bytes(range(256)) * 32  # 8,192 bytes: 256 ms at 16 kHz
    assert stream_chunk(b64(pcm), MIC) == pcm


def test_the_mime_type_is_read_without_regard_to_case_or_spaces():
    assert stream_chunk(b64(b"\1\0\2\0"), "Audio/PCM; rate=16000") == b"\1\0\2\0"


@pytest.mark.parametrize("mime", [None, "", "audio/webm", "audio/wav", "text/plain", "audio/pcm"])
def test_a_chunk_that_is_not_16_khz_pcm_is_an_unsupported_audio_type(mime):
    assert refusal(stream_chunk, b64(b"\0\0"), mime).code == "unsupported_audio_type"


def test_a_chunk_at_another_rate_is_refused_for_its_rate():
    error = refusal(stream_chunk, b64(b"\0\0"), "audio/pcm;rate=24000")
    assert error.code == "unsupported_audio_rate"
    assert "16000" in error.message and "24000" in error.message


@pytest.mark.parametrize("data", ["not base64!", "QUJD=", "QUJDRA==QUJD", "é"])
def test_a_chunk_that_is_not_base64_is_invalid_audio(data):
    assert refusal(stream_chunk, data, MIC).code == "invalid_audio"


def test_an_odd_byte_count_is_invalid_audio():
    error = refusal(stream_chunk, b64(b"\0\0\0"), MIC)
    assert error.code == "invalid_audio"
    assert "even" in error.message


def test_an_empty_chunk_is_empty_audio():
    assert refusal(stream_chunk, "", MIC).code == "empty_audio"


def test_a_chunk_longer_than_two_seconds_is_too_large_before_it_is_decoded():
    three_seconds = b64(b"\0\0" * 48000)
    assert refusal(stream_chunk, three_seconds, MIC).code == "audio_too_large"
    # Garbage of that length is refused for its size, not decoded first.
    assert refusal(stream_chunk, "!" * len(three_seconds), MIC).code == "audio_too_large"


def test_a_whole_wav_message_becomes_its_samples_at_its_own_rate():
    pcm = b"\1\0" * 22050
    audio = whole_message(b64(wav_bytes(pcm, rate=22050)), "audio/wav", max_seconds=30)
    assert (audio.pcm, audio.rate) == (pcm, 22050)
    assert audio.seconds == pytest.approx(1.0)


def test_a_stereo_wav_message_is_mixed_down_to_mono():
    left_right = b"\x10\x00\x30\x00" * 1600  # left 16, right 48
    audio = whole_message(b64(wav_bytes(left_right, channels=2)), "audio/x-wav", max_seconds=30)
    assert audio.pcm == b"\x20\x00" * 1600


@pytest.mark.parametrize("rate", [4000, 7999, 48001, 96000])
def test_a_wav_message_whose_header_rate_is_out_of_range_is_refused_like_a_live_chunk(rate):
    live = refusal(stream_chunk, b64(b"\0\0"), f"audio/pcm;rate={rate}")
    wav = refusal(whole_message, b64(wav_bytes(b"\0\0" * 800, rate=rate)), "audio/wav", max_seconds=30)
    assert wav.code == live.code == "unsupported_audio_rate"
    assert str(rate) in wav.message


@pytest.mark.parametrize("rate", [8000, 48000])
def test_a_wav_message_at_either_end_of_the_range_is_kept(rate):
    audio = whole_message(b64(wav_bytes(b"\1\0" * 800, rate=rate)), "audio/wav", max_seconds=30)
    assert (audio.rate, len(audio.pcm)) == (rate, 1600)


def test_a_whole_pcm_message_takes_the_rate_of_its_mime_type():
    audio = whole_message(b64(b"\0\0" * 8000), "audio/pcm;rate=8000", max_seconds=30)
    assert (audio.rate, audio.seconds) == (8000, 1.0)


def test_an_8_bit_wav_message_is_an_unsupported_audio_type():
    data = wav_bytes(b"\x80" * 1600, width=1)
    assert refusal(whole_message, b64(data), "audio/wav", max_seconds=30).code == "unsupported_audio_type"


def test_a_file_that_only_claims_to_be_wav_is_invalid_audio():
    assert refusal(whole_message, b64(b"ID3\x04 an mp3"), "audio/wav", max_seconds=30).code == "invalid_audio"


def test_a_whole_message_longer_than_the_longest_utterance_is_too_large():
    error = refusal(whole_message, b64(b"\0\0" * 16000 * 3), MIC, max_seconds=2)
    assert error.code == "audio_too_large"
    assert "3.0 s" in error.message and "2 s" in error.message


def test_a_whole_message_without_a_mime_type_or_at_a_strange_rate_is_refused():
    assert refusal(whole_message, b64(b"\0\0"), None, max_seconds=30).code == "unsupported_audio_type"
    assert refusal(whole_message, b64(b"\0\0"), "audio/ogg", max_seconds=30).code == "unsupported_audio_type"
    assert refusal(whole_message, b64(b"\0\0"), "audio/pcm;rate=96000",
                   max_seconds=30).code == "unsupported_audio_rate"


def test_a_whole_pcm_message_with_an_odd_byte_count_is_invalid_audio():
    assert refusal(whole_message, b64(b"\0\0\0"), MIC, max_seconds=30).code == "invalid_audio"
