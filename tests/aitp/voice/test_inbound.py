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


# --- what each refusal says, and the exact bounds ----------------------------------------

LONG_MIME = "audio/ogg\n" + "a" * 40  # 50 characters, one of them not printable


def wav_header_only() -> bytes:
    return wav_bytes(b"")


@pytest.mark.parametrize("call, args, code, message", [
    (stream_chunk, (b64(b"\0\0"), None), "unsupported_audio_type",
     "mimeType is required; send audio/pcm;rate=16000"),
    (stream_chunk, (b64(b"\0\0"), LONG_MIME), "unsupported_audio_type",
     "mimeType must be audio/pcm;rate=16000, got 'audio/ogg?aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa...'"),
    (stream_chunk, (b64(b"\0\0"), "x" * 40), "unsupported_audio_type",
     f"mimeType must be audio/pcm;rate=16000, got '{'x' * 40}'"),
    (stream_chunk, (b64(b"\0\0"), "x" * 41), "unsupported_audio_type",
     f"mimeType must be audio/pcm;rate=16000, got '{'x' * 40}...'"),
    (stream_chunk, (b64(b"\0\0"), "audio/pcm;rate=24000"), "unsupported_audio_rate",
     "live audio must be 16000 Hz, got 24000 Hz"),
    (stream_chunk, ("not base64!", MIC), "invalid_audio", "audio chunk is not valid base64"),
    (stream_chunk, (b64(b"\0\0\0"), MIC), "invalid_audio",
     "audio chunk is 3 bytes; 16-bit samples need an even count"),
    (stream_chunk, ("", MIC), "empty_audio", "audio chunk holds no audio"),
    (stream_chunk, (b64(b"\0\0" * 32001), MIC), "audio_too_large",
     "audio chunk is 64002 bytes; at most 64000 are allowed"),
    (stream_chunk, ("!" * 85341, MIC), "audio_too_large", "audio chunk is larger than 64000 bytes"),
    (whole_message, (b64(b"\0\0"), None), "unsupported_audio_type",
     "mimeType is required for audio input; send audio/pcm;rate=16000 or audio/wav"),
    (whole_message, (b64(b"\0\0"), "audio/ogg"), "unsupported_audio_type",
     "audio input must be audio/pcm;rate=N or audio/wav, got 'audio/ogg'"),
    (whole_message, (b64(b"\0\0"), "audio/pcm;rate=96000"), "unsupported_audio_rate",
     "audio rate 96000 Hz is outside 8000-48000 Hz"),
    (whole_message, (b64(wav_bytes(b"\0\0", rate=96000)), "audio/wav"), "unsupported_audio_rate",
     "WAV rate 96000 Hz is outside 8000-48000 Hz"),
    (whole_message, ("%%%", "audio/wav"), "invalid_audio", "audio message is not valid base64"),
    (whole_message, (b64(b"\0\0\0"), MIC), "invalid_audio",
     "audio message is 3 bytes; 16-bit samples need an even count"),
    (whole_message, (b64(wav_header_only()), "audio/wav"), "empty_audio",
     "audio message holds no audio"),
    (whole_message, (b64(wav_bytes(b"\x80" * 16, width=1)), "audio/wav"), "unsupported_audio_type",
     "WAV samples must be 16-bit, got 8-bit"),
    (whole_message, (b64(wav_bytes(b"\0" * 24, width=3)), "audio/wav"), "unsupported_audio_type",
     "WAV samples must be 16-bit, got 24-bit"),
    (whole_message, (b64(wav_bytes(b"\0\0" * 6, channels=3)), "audio/wav"), "unsupported_audio_type",
     "WAV must be mono or stereo, got 3 channels"),
], ids=lambda value: value.__name__ if callable(value) else None)
def test_each_refusal_names_its_code_and_says_what_was_wrong(call, args, code, message):
    kwargs = {"max_seconds": 30} if call is whole_message else {}
    error = refusal(call, *args, **kwargs)
    assert (error.code, error.message, str(error)) == (code, message, message)


def test_an_unreadable_wav_is_refused_with_the_readers_reason():
    error = refusal(whole_message, b64(b"RIFF\0\0\0\0WAVEjunk"), "audio/wav", max_seconds=30)
    assert error.code == "invalid_audio"
    assert error.message.startswith("not a readable PCM WAV file (") and error.message.endswith(")")
    assert len(error.message) > len("not a readable PCM WAV file ()")


def test_a_live_chunk_of_exactly_two_seconds_is_kept():
    pcm = b"\1\0" * 32000
    assert stream_chunk(b64(pcm), MIC) == pcm


def test_a_chunk_text_is_decoded_up_to_the_longest_valid_length_and_refused_past_it_unread():
    # 64,000 bytes are at most 85,336 base64 characters; 85,340 still get decoded.
    assert refusal(stream_chunk, "!" * 85340, MIC).code == "invalid_audio"
    assert refusal(stream_chunk, "!" * 85341, MIC).code == "audio_too_large"


@pytest.mark.parametrize("rate", [8000, 48000])
def test_a_whole_pcm_message_at_either_end_of_the_range_is_kept(rate):
    audio = whole_message(b64(b"\0\0" * rate), f"audio/pcm;rate={rate}", max_seconds=30)
    assert (audio.rate, audio.seconds) == (rate, 1.0)


def test_a_whole_message_exactly_as_long_as_the_longest_utterance_is_kept():
    audio = whole_message(b64(b"\0\0" * 16000 * 2), MIC, max_seconds=2)
    assert audio.seconds == 2.0


def test_the_longest_stereo_wav_at_the_highest_rate_is_kept():
    left_right = b"\1\0\3\0" * 48000
    audio = whole_message(b64(wav_bytes(left_right, rate=48000, channels=2)), "audio/wav", max_seconds=1)
    assert (audio.rate, audio.pcm) == (48000, b"\2\0" * 48000)


def test_a_whole_message_past_its_byte_bound_is_refused_before_its_length_is_read():
    # One second at most: 48,000 stereo 16-bit samples and 4,096 bytes of header.
    error = refusal(whole_message, b64(b"\0" * 196097), MIC, max_seconds=1)
    assert (error.code, error.message) == (
        "audio_too_large", "audio message is 196097 bytes; at most 196096 are allowed")


@pytest.mark.parametrize("mime", ["audio/wav;codecs=1", " Audio/WAV ; codecs=1 ; x=y", "audio/wave"])
def test_a_wav_mime_type_is_known_by_its_type_whatever_its_parameters(mime):
    audio = whole_message(b64(wav_bytes(b"\1\0" * 800)), mime, max_seconds=30)
    assert (audio.rate, len(audio.pcm)) == (16000, 1600)


@pytest.mark.parametrize("channels", [1, 2])
def test_a_wav_cut_in_the_middle_of_a_sample_keeps_its_whole_samples(channels):
    data = wav_bytes(b"\1\0" * 8 * channels, channels=channels)[:-1]
    audio = whole_message(b64(data), "audio/wav", max_seconds=30)
    assert audio.pcm == b"\1\0" * 7


def test_a_stereo_wav_is_mixed_down_to_the_floor_of_the_two_channels_mean():
    left_right = (-1).to_bytes(2, "little", signed=True) + (-2).to_bytes(2, "little", signed=True)
    audio = whole_message(b64(wav_bytes(left_right * 4, channels=2)), "audio/wav", max_seconds=30)
    assert audio.pcm == (-2).to_bytes(2, "little", signed=True) * 4
