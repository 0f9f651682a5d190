"""Voice turns over a real socket: a real daphne process with the offline
engines (PocketSphinx listening for a small grammar, eSpeak NG speaking), the
fake Messages API through the real SDK, and the project's client playing a
page that streams eSpeak NG speech as its microphone."""
from __future__ import annotations

import asyncio
import base64
import io
import json
import threading
import wave

import pytest

from aitp.models import ConversationMessage, Session, ToolCall
from aitp.voice.audio import agent_chunks
from aitp_client import AitpClient, final_text, system_event
from speech.offline import EspeakTts
from tests.aitp.conftest import ADD_TO_CART, ORIGIN
from tests.speech.conftest import espeak_config, needs_espeak, room_noise, silence, speak
from tests.support.fake_anthropic import (
    FakeAnthropicServer,
    StreamedMessage,
    TextBlock,
    text_response,
    tool_use_response,
)

pytestmark = [pytest.mark.django_db(transaction=True), needs_espeak]

API_KEY = "sk-ant-voice-e2e"
WPM = 140
GRAMMAR = """#JSGF V1.0;
grammar shop;
public <command> = (add | remove) (one | two | three) (headphones | speakers) to my cart
                 | what is in my cart | show me the headphones;
"""
# A person speaking a command; eSpeak NG much faster swallows "my cart" for this model.
MIC_WPM = 130
MIC_CHUNK = 8192  # 256 ms of 16 kHz 16-bit mono, as the deployed client sends
# A turn's frames on a loaded machine: speech engines, the model, the database.
PATIENCE = 20


@pytest.fixture
def fake():
    with FakeAnthropicServer(api_key=API_KEY) as server:
        yield server


@pytest.fixture
def server(daphne_factory, fake, tmp_path):
    return start_server(daphne_factory, fake, tmp_path)


def start_server(daphne_factory, fake, tmp_path, **env):
    grammar = tmp_path / "shop.jsgf"
    grammar.write_text(GRAMMAR)
    settings = {
        "OWLLAYER_LLM": "anthropic",
        "ANTHROPIC_API_KEY": API_KEY,
        "ANTHROPIC_BASE_URL": fake.base_url,
        "OWLLAYER_MODEL": "claude-test-model",
        "OWLLAYER_LLM_MAX_RETRIES": 0,
        "OWLLAYER_LLM_TIMEOUT": 30,
        "OWLLAYER_VOICE": "1",
        "OWLLAYER_STT": "pocketsphinx",
        "OWLLAYER_TTS": "espeak",
        "OWLLAYER_STT_GRAMMAR": str(grammar),
        "OWLLAYER_ESPEAK_WPM": str(WPM),
        "OWLLAYER_VOICE_IDLE_SECONDS": "2",
        "OWLLAYER_VOICE_BYTES_PER_SECOND": "32000",
        "OWLLAYER_HANDSHAKE_TIMEOUT": "60",
    }
    return daphne_factory(**{**settings, **env})


async def open_client(server, api_key) -> AitpClient:
    client = AitpClient(server.ws_url(), api_key=api_key.raw, origin=ORIGIN)
    ack = await client.connect(timeout=PATIENCE)
    assert "audio" in ack["capabilities"]
    await client.context_update("/products/headphones", "Pro Headphones", tools=[ADD_TO_CART],
                                context={"productId": "pro-headphones"})
    await client.recv_until(system_event("tools_effective"), timeout=PATIENCE)
    return client


def microphone(text: str) -> list[str]:
    """`text` spoken with a little silence around it, as base64 AUDIO_STREAM chunks."""
    pcm = silence(0.3) + speak(text, words_per_minute=MIC_WPM).pcm + silence(0.3)
    return [base64.b64encode(pcm[i:i + MIC_CHUNK]).decode() for i in range(0, len(pcm), MIC_CHUNK)]


async def say_aloud(client: AitpClient, text: str, *, end: bool = True) -> None:
    for data in microphone(text):
        await client.send("AUDIO_STREAM", {"data": data, "mimeType": "audio/pcm;rate=16000"})
    if end:
        await client.send("VOICE_INPUT_END", {"reason": "user_stop"})


def kind(frame: dict) -> str:
    if frame["type"] == "SYSTEM_EVENT":
        payload = frame["payload"]
        if payload["kind"] == "transcript":
            return f"transcript:{payload['data']['role']}"
        return f"{payload['kind']}:{(payload.get('data') or {}).get('code', '')}"
    if frame["type"] == "VOICE_STATE_EVENT":
        return f"voice:{frame['payload']['event']}"
    return frame["type"]


async def frames_until(client: AitpClient, wanted: str) -> list[dict]:
    frames = []
    while True:
        try:
            frame = await client.recv(PATIENCE)
        except TimeoutError:
            raise AssertionError(f"no {wanted} after {[kind(f) for f in frames]}") from None
        frames.append(frame)
        if kind(frame) == wanted or (wanted == "done" and frame["type"] == "AGENT_RESPONSE"
                                     and frame["payload"]["done"]):
            return frames


LISTEN = 2.0


async def frames_for(client: AitpClient, seconds: float) -> list[dict]:
    """Every frame that arrives within ``seconds``."""
    frames = []
    deadline = asyncio.get_running_loop().time() + seconds
    while (left := deadline - asyncio.get_running_loop().time()) > 0:
        try:
            frames.append(await client.recv(left))
        except TimeoutError:
            break
    return frames


def frames_of_speech(sentence: str) -> int:
    """How many AUDIO_STREAM frames the server's eSpeak NG makes of this sentence."""
    audio = EspeakTts(espeak_config(words_per_minute=WPM)).synthesize_now(sentence)
    return len(agent_chunks(audio))


async def stored(session_id: str) -> list[tuple[str, list]]:
    return [(m.role, m.content) async for m in
            ConversationMessage.objects.filter(session_id=session_id).order_by("seq")]


async def test_a_spoken_request_is_heard_answered_and_spoken_back_while_the_model_writes(
        server, fake, api_key):
    hold = threading.Event()
    fake.enqueue(StreamedMessage(
        blocks=[TextBlock(["Sure thing. ", "Two are now ", "in your cart."])],
        hold=hold, hold_after_events=4,  # message_start, block start, ping, the first sentence
    ))
    client = await open_client(server, api_key)
    try:
        await say_aloud(client, "add two headphones to my cart")
        heard = await frames_until(client, "transcript:user")
        assert heard[-1]["payload"]["data"] == {"role": "user", "text": "add two headphones to my cart"}
        before_audio = await frames_until(client, "AUDIO_STREAM")
        # The model's stream is still open (held after its first sentence).
        assert fake.requests[0].outcome == "pending"
        hold.set()
        rest = await frames_until(client, "done")
    finally:
        await client.close()

    frames = heard + before_audio + rest
    kinds = [kind(f) for f in frames]
    audio = [f for f in frames if f["type"] == "AUDIO_STREAM"]
    assert {f["payload"]["mimeType"] for f in audio} == {"audio/pcm;rate=24000"}
    assert len(audio) == frames_of_speech("Sure thing.") + frames_of_speech("Two are now in your cart.")
    last_audio = max(i for i, k in enumerate(kinds) if k == "AUDIO_STREAM")
    assert kinds[last_audio + 1:] == ["voice:turn_complete", "AGENT_RESPONSE"]
    agent_said = [f["payload"]["data"]["text"] for f in frames if kind(f) == "transcript:agent"]
    assert agent_said == ["Sure thing.", "Two are now in your cart."]
    assert final_text(frames) == "Sure thing. Two are now in your cart."
    user_text = fake.requests[0]["messages"][0]["content"][0]["text"]
    assert user_text == "add two headphones to my cart"


async def test_a_voice_turns_json_log_lines_name_its_session_and_tenant(
        daphne_factory, fake, api_key, tmp_path):
    server = start_server(daphne_factory, fake, tmp_path, OWLLAYER_LOG_FORMAT="json")
    fake.enqueue(text_response("Done.", chunks=1))
    client = await open_client(server, api_key)
    try:
        await say_aloud(client, "add two headphones to my cart")
        await frames_until(client, "done")
    finally:
        await client.close()
    server.stop()

    lines = [json.loads(line) for line in server.logs().splitlines() if line.strip()]
    heard = [line for line in lines if line["message"].startswith("utterance ended")]
    assert heard, lines
    assert all((line["session_id"], line["tenant_id"]) == (client.ack["sessionId"], api_key.tenant_id)
               for line in heard)


async def test_a_barge_in_stops_the_voice_and_stores_what_the_user_heard(server, fake, api_key):
    hold = threading.Event()
    first = "Your cart now holds two pairs of headphones. "
    fake.enqueue(
        StreamedMessage(blocks=[TextBlock([first, "They ship tomorrow ", "by express courier."])],
                        hold=hold, hold_after_events=4),
        text_response("Of course.", chunks=1),
    )
    client = await open_client(server, api_key)
    try:
        await say_aloud(client, "what is in my cart")
        sent = frames_of_speech(first.strip())
        frames: list[dict] = []
        while sum(f["type"] == "AUDIO_STREAM" for f in frames) < sent:
            frames.append(await client.recv(PATIENCE))
        await client.send("VOICE_INTERRUPT", {"reason": "barge_in"})
        stopped = await frames_until(client, "voice:interrupted")
        hold.set()
        assert stopped[-1]["payload"] == {"event": "interrupted", "reason": "barge_in"}
        # The next turn works, and no voice of the cut answer follows.
        await client.send("USER_INPUT", {"modality": "text", "content": "thanks"})
        after = await frames_until(client, "done")
    finally:
        await client.close()

    assert "AUDIO_STREAM" not in [kind(f) for f in stopped + after]
    assert final_text(after) == "Of course."
    messages = await stored(client.session_id)
    assert messages[1] == ("assistant", [{"type": "text", "text": first.strip(), "voice": "interrupted"}])
    assert [role for role, _ in messages] == ["user", "assistant", "user", "assistant"]


async def test_the_answer_is_spoken_at_the_pace_it_plays_so_a_barge_in_leaves_the_rest_unsaid(
    server, fake, api_key
):
    sentences = [f"Sentence number {n} of a long answer about your cart. " for n in range(1, 9)]
    fake.enqueue(text_response("".join(sentences).strip(), chunks=8),
                 text_response("Of course.", chunks=1))
    client = await open_client(server, api_key)
    try:
        await say_aloud(client, "what is in my cart")
        frames = await frames_until(client, "AUDIO_STREAM")
        # Listen two seconds: eSpeak NG makes the whole answer's audio in far
        # less, yet what arrives is what plays in two seconds and a little.
        frames += await frames_for(client, LISTEN)
        await client.send("VOICE_INTERRUPT", {"reason": "barge_in"})
        frames += await frames_until(client, "voice:interrupted")
        await client.send("USER_INPUT", {"modality": "text", "content": "thanks"})
        await frames_until(client, "done")
    finally:
        await client.close()

    # The whole answer takes half a minute to say; the page got a few seconds
    # of it (at most one second ahead of playback, however fast it was made).
    heard_seconds = sum(len(base64.b64decode(f["payload"]["data"])) for f in frames
                        if f["type"] == "AUDIO_STREAM") / (2 * 24000)
    assert heard_seconds < LISTEN + 6
    messages = await stored(client.session_id)
    said = messages[1][1][0]["text"]
    assert messages[1][1][0]["voice"] == "interrupted"
    whole = " ".join(sentence.strip() for sentence in sentences)
    assert said and whole.startswith(said) and len(said) < len(whole) // 2


async def test_a_barge_in_over_a_typed_answer_stores_the_text_the_page_was_shown(
    server, fake, api_key
):
    hold = threading.Event()
    shown = "Your cart holds two pairs of headphones."
    fake.enqueue(
        StreamedMessage(blocks=[TextBlock([shown, " They ship tomorrow."])],
                        hold=hold, hold_after_events=4),
        text_response("Of course.", chunks=1),
    )
    client = await open_client(server, api_key)
    try:
        await client.send("USER_INPUT", {"modality": "text", "content": "what is in my cart"})
        first = await client.recv_until(
            lambda f: f["type"] == "AGENT_RESPONSE" and f["payload"]["chunk"], timeout=PATIENCE)
        await client.send("VOICE_INTERRUPT", {"reason": "barge_in"})
        stopped = await frames_until(client, "voice:interrupted")
        hold.set()
        await client.send("USER_INPUT", {"modality": "text", "content": "thanks"})
        after = await frames_until(client, "done")
    finally:
        await client.close()

    page_saw = first["payload"]["chunk"] + "".join(
        f["payload"]["chunk"] for f in stopped if f["type"] == "AGENT_RESPONSE")
    assert page_saw == shown
    assert final_text(after) == "Of course."
    messages = await stored(client.session_id)
    assert messages[1] == ("assistant", [{"type": "text", "text": shown}])
    assert [role for role, _ in messages] == ["user", "assistant", "user", "assistant"]


async def until_closed(session_id: str) -> None:
    """Until the server has ended the session's row (its turn is over by then)."""
    for _ in range(PATIENCE * 10):
        if (await Session.objects.aget(pk=session_id)).ended_at is not None:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the session was never closed")


async def test_a_page_closed_while_its_spoken_answer_plays_leaves_the_answer_stored_as_far_as_it_was_said(
    server, fake, api_key
):
    sentences = [f"Sentence number {n} of a long answer about your cart. " for n in range(1, 9)]
    fake.enqueue(text_response("".join(sentences).strip(), chunks=8))
    client = await open_client(server, api_key)
    try:
        await say_aloud(client, "what is in my cart")
        await frames_until(client, "AUDIO_STREAM")
        await frames_for(client, LISTEN)
    finally:
        await client.close()
    await until_closed(client.session_id)

    messages = await stored(client.session_id)
    assert [role for role, _ in messages] == ["user", "assistant"]
    [block] = messages[1][1]
    whole = " ".join(sentence.strip() for sentence in sentences)
    assert block["voice"] == "said"
    assert block["text"] and whole.startswith(block["text"]) and len(block["text"]) < len(whole) // 2


async def test_a_page_closed_while_its_typed_answer_streams_leaves_the_answer_stored_as_far_as_it_was_shown(
    server, fake, api_key
):
    hold = threading.Event()
    shown = "Your cart holds two pairs of headphones."
    fake.enqueue(StreamedMessage(blocks=[TextBlock([shown, " They ship tomorrow."])],
                                 hold=hold, hold_after_events=4))
    client = await open_client(server, api_key)
    try:
        await client.send("USER_INPUT", {"modality": "text", "content": "what is in my cart"})
        first = await client.recv_until(
            lambda f: f["type"] == "AGENT_RESPONSE" and f["payload"]["chunk"], timeout=PATIENCE)
    finally:
        await client.close()
    try:
        await until_closed(client.session_id)
    finally:
        hold.set()

    assert first["payload"]["chunk"] == shown
    messages = await stored(client.session_id)
    assert messages[1] == ("assistant", [{"type": "text", "text": shown}])
    assert [role for role, _ in messages] == ["user", "assistant"]


async def test_a_barge_in_during_a_tool_call_cancels_it_exactly_once(server, fake, api_key):
    fake.enqueue(
        tool_use_response([("toolu_voice", "add_to_cart", {"quantity": 2})], text="Adding them now."),
        text_response("Nothing was added.", chunks=1),
    )
    client = await open_client(server, api_key)
    try:
        await say_aloud(client, "add two headphones to my cart")
        call = (await frames_until(client, "TOOL_CALL"))[-1]
        await client.send("VOICE_INTERRUPT", {"reason": "barge_in"})
        await frames_until(client, "voice:interrupted")
        # The page answers late: the call is over, its result is not taken.
        await client.send("TOOL_RESULT", {"callId": call["payload"]["callId"], "status": "success",
                                          "result": {"added": True}})
        late = await frames_until(client, "error:unknown_call")
        await client.send("USER_INPUT", {"modality": "text", "content": "did it work"})
        after = await frames_until(client, "done")
    finally:
        await client.close()

    assert "AUDIO_STREAM" not in [kind(f) for f in late + after]
    assert final_text(after) == "Nothing was added."
    row = await ToolCall.objects.aget(session_id=client.session_id)
    assert (row.tool_use_id, row.status) == ("toolu_voice", "cancelled")
    results = [block for message in fake.requests[1]["messages"] for block in message["content"]
               if block.get("type") == "tool_result"]
    assert [block["tool_use_id"] for block in results] == ["toolu_voice"]


@pytest.mark.parametrize("payload, code", [
    ({"data": "AAAA", "mimeType": "audio/ogg"}, "unsupported_audio_type"),
    ({"data": "AAAA", "mimeType": "audio/pcm;rate=8000"}, "unsupported_audio_rate"),
    ({"data": base64.b64encode(b"\1\2\3").decode(), "mimeType": "audio/pcm;rate=16000"}, "invalid_audio"),
    ({"data": "*not base64*", "mimeType": "audio/pcm;rate=16000"}, "invalid_audio"),
    ({"data": base64.b64encode(b"\0" * 80000).decode(), "mimeType": "audio/pcm;rate=16000"},
     "audio_too_large"),
])
async def test_bad_audio_gets_its_code_and_the_session_goes_on(server, fake, api_key, payload, code):
    fake.enqueue(text_response("Still here.", chunks=1))
    client = await open_client(server, api_key)
    try:
        await client.send("AUDIO_STREAM", payload)
        error = (await frames_until(client, f"error:{code}"))[-1]
        await client.send("USER_INPUT", {"modality": "text", "content": "hello"})
        after = await frames_until(client, "done")
    finally:
        await client.close()
    assert error["payload"]["data"]["code"] == code
    assert final_text(after) == "Still here."


@pytest.mark.parametrize("rate", [4000, 96000])
async def test_a_wav_message_whose_header_rate_is_out_of_range_is_refused_like_a_live_chunk(
        server, fake, api_key, rate):
    fake.enqueue(text_response("Still here.", chunks=1))
    client = await open_client(server, api_key)
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes(silence(0.5))
    try:
        await client.send("AUDIO_STREAM", {"data": base64.b64encode(silence(0.25)).decode(),
                                           "mimeType": f"audio/pcm;rate={rate}"})
        live = (await frames_until(client, "error:unsupported_audio_rate"))[-1]
        await client.send("USER_INPUT", {"modality": "audio", "mimeType": "audio/wav",
                                         "content": base64.b64encode(buffer.getvalue()).decode()})
        whole = (await frames_until(client, "error:unsupported_audio_rate"))[-1]
        refused = await frames_until(client, "done")
        await client.send("USER_INPUT", {"modality": "text", "content": "hello"})
        after = await frames_until(client, "done")
    finally:
        await client.close()
    assert live["payload"]["data"]["code"] == whole["payload"]["data"]["code"] == "unsupported_audio_rate"
    assert str(rate) in whole["payload"]["message"]
    assert final_text(refused) == "", "the refused message's turn ends at once"
    assert final_text(after) == "Still here.", "no turn started: the session goes on"


async def test_a_stream_that_never_ends_is_heard_once_it_stalls(server, fake, api_key):
    fake.enqueue(text_response("Here are the headphones.", chunks=2))
    client = await open_client(server, api_key)
    try:
        await say_aloud(client, "show me the headphones", end=False)
        frames = await frames_until(client, "done")
    finally:
        await client.close()
    heard = [f["payload"]["data"]["text"] for f in frames if kind(f) == "transcript:user"]
    assert heard == ["show me the headphones"]
    assert "voice:turn_complete" in [kind(f) for f in frames]


async def test_audio_faster_than_the_budget_is_refused(server, fake, api_key):
    client = await open_client(server, api_key)
    chunk = base64.b64encode(silence(2.0)).decode()  # 64,000 bytes; the burst allows 128,000
    try:
        for _ in range(3):
            await client.send("AUDIO_STREAM", {"data": chunk, "mimeType": "audio/pcm;rate=16000"})
        error = (await frames_until(client, "error:audio_too_fast"))[-1]
    finally:
        await client.close()
    assert error["payload"]["data"]["code"] == "audio_too_fast"


async def test_a_whole_audio_message_is_heard_and_answered(server, fake, api_key):
    fake.enqueue(text_response("Opening the headphones.", chunks=1))
    client = await open_client(server, api_key)
    pcm = silence(0.3) + speak("show me the headphones", words_per_minute=MIC_WPM).pcm + silence(0.3)
    try:
        await client.send("USER_INPUT", {"modality": "audio", "mimeType": "audio/pcm;rate=16000",
                                         "content": base64.b64encode(pcm).decode()})
        frames = await frames_until(client, "done")
    finally:
        await client.close()
    kinds = [kind(f) for f in frames]
    assert kinds[0] == "transcript:user" and frames[0]["payload"]["data"]["text"] == "show me the headphones"
    assert "AUDIO_STREAM" in kinds and kinds[-2:] == ["voice:turn_complete", "AGENT_RESPONSE"]


async def test_room_noise_gets_no_speech_and_no_model_request_while_speech_is_still_heard(
        daphne_factory, fake, tmp_path, api_key):
    # The full language model, which makes words of noise where a grammar would not.
    server = start_server(daphne_factory, fake, tmp_path, OWLLAYER_STT_GRAMMAR="")
    fake.enqueue(text_response("Here they are.", chunks=1))
    client = await open_client(server, api_key)
    noise = room_noise("pink", seconds=4.0, seed=6)
    speech = silence(0.3) + speak("show me the headphones", words_per_minute=MIC_WPM).pcm + silence(0.3)
    try:
        await client.send("USER_INPUT", {"modality": "audio", "mimeType": "audio/pcm;rate=16000",
                                         "content": base64.b64encode(noise.pcm).decode()})
        ignored = await frames_until(client, "done")
        await client.send("USER_INPUT", {"modality": "audio", "mimeType": "audio/pcm;rate=16000",
                                         "content": base64.b64encode(speech).decode()})
        heard = await frames_until(client, "done")
    finally:
        await client.close()
    assert [kind(f) for f in ignored] == ["error:no_speech", "voice:turn_complete", "AGENT_RESPONSE"]
    assert ignored[-1]["payload"] == {"chunk": "", "done": True}
    assert kind(heard[0]) == "transcript:user" and heard[0]["payload"]["data"]["text"]
    assert final_text(heard) == "Here they are."
    assert len(fake.requests) == 1, "the noise never reached the model"


async def test_the_servers_voice_activity_detection_ends_the_utterance(daphne_factory, fake, tmp_path, api_key):
    # Only the detector can end it: no VOICE_INPUT_END, and a pause far longer than the test.
    server = start_server(daphne_factory, fake, tmp_path, OWLLAYER_SERVER_VAD="1",
                          OWLLAYER_VOICE_IDLE_SECONDS="600")
    fake.enqueue(text_response("Here they are.", chunks=1))
    client = await open_client(server, api_key)
    try:
        await say_aloud(client, "show me the headphones", end=False)
        quiet = base64.b64encode(silence(0.25)).decode()
        for _ in range(5):  # well over the detector's 0.8 s of silence after the words
            await client.send("AUDIO_STREAM", {"data": quiet, "mimeType": "audio/pcm;rate=16000"})
        frames = await frames_until(client, "done")
    finally:
        await client.close()
    heard = [f["payload"]["data"]["text"] for f in frames if kind(f) == "transcript:user"]
    assert heard == ["show me the headphones"]
    assert final_text(frames) == "Here they are."
