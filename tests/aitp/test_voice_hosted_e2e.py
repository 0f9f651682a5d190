"""Voice turns with the hosted engines (OpenAI's audio endpoints, faked on
127.0.0.1 by tests/support/fake_speech.py) against a real daphne process: the
engine's words are the user's, its speech is the agent's voice, and its
failure is the page's error event while the session goes on."""
from __future__ import annotations

import base64

import pytest

from aitp_client import AitpClient, final_text, system_event
from tests.aitp.conftest import ORIGIN
from tests.aitp.test_voice_e2e import PATIENCE, frames_until, kind
from tests.support.fake_anthropic import FakeAnthropicServer, text_response, tool_use_response
from tests.support.fake_speech import FakeSpeechServer

pytestmark = [pytest.mark.django_db(transaction=True)]

API_KEY = "sk-ant-voice-hosted"
VOICE_KEY = "sk-voice-hosted"
# Any audio will do: the fake hears its queued transcript.
SPOKEN = base64.b64encode(b"\x10\x00" * 16000).decode()


@pytest.fixture
def fake():
    with FakeAnthropicServer(api_key=API_KEY) as server:
        yield server


@pytest.fixture
def speech():
    with FakeSpeechServer(api_key=VOICE_KEY, default_transcript="what is in my cart") as server:
        yield server


@pytest.fixture
def server(daphne_factory, fake, speech):
    return daphne_factory(
        OWLLAYER_LLM="anthropic",
        ANTHROPIC_API_KEY=API_KEY,
        ANTHROPIC_BASE_URL=fake.base_url,
        OWLLAYER_MODEL="claude-test-model",
        OWLLAYER_LLM_MAX_RETRIES=0,
        OWLLAYER_VOICE="1",
        OWLLAYER_STT="openai",
        OWLLAYER_TTS="openai",
        OWLLAYER_VOICE_API_KEY=VOICE_KEY,
        OWLLAYER_VOICE_BASE_URL=speech.base_url,
    )


async def open_client(server, api_key) -> AitpClient:
    client = AitpClient(server.ws_url(), api_key=api_key.raw, origin=ORIGIN)
    ack = await client.connect(timeout=PATIENCE)
    assert "audio" in ack["capabilities"]
    await client.context_update("/cart", "Cart")
    await client.recv_until(system_event("tools_effective"), timeout=PATIENCE)
    return client


async def speak_once(client: AitpClient) -> list[dict]:
    await client.send("AUDIO_STREAM", {"data": SPOKEN, "mimeType": "audio/pcm;rate=16000"})
    await client.send("VOICE_INPUT_END", {"reason": "user_stop"})
    return await frames_until(client, "done")


async def test_the_hosted_engines_hear_the_user_and_speak_the_answer(server, fake, speech, api_key):
    fake.enqueue(text_response("Your cart is empty.", chunks=2))
    client = await open_client(server, api_key)
    try:
        frames = await speak_once(client)
    finally:
        await client.close()
    kinds = [kind(f) for f in frames]
    assert frames[0]["payload"]["data"] == {"role": "user", "text": "what is in my cart"}
    assert kinds[-2:] == ["voice:turn_complete", "AGENT_RESPONSE"]
    assert "AUDIO_STREAM" in kinds
    assert final_text(frames) == "Your cart is empty."
    assert [r.path for r in speech.requests] == ["/v1/audio/transcriptions", "/v1/audio/speech"]


async def test_a_refused_speech_engine_is_the_pages_error_and_the_session_goes_on(
        server, fake, speech, api_key):
    speech.fail_next(401, "invalid_request_error", "Incorrect API key provided", "invalid_api_key")
    fake.enqueue(text_response("Typing works.", chunks=1))
    client = await open_client(server, api_key)
    try:
        failed = await speak_once(client)
        await client.send("USER_INPUT", {"modality": "text", "content": "hello"})
        after = await frames_until(client, "done")
    finally:
        await client.close()
    assert [kind(f) for f in failed] == ["error:speech_auth_failed", "voice:turn_complete", "AGENT_RESPONSE"]
    assert failed[-1]["payload"] == {"chunk": "", "done": True}
    assert final_text(after) == "Typing works."
    assert fake.requests and len(fake.requests) == 1


CHECKOUT = {
    "name": "checkout",
    "description": "Pay for the cart",
    "parameters": {"type": "OBJECT", "properties": {}},
    "risk": "high",
}


async def test_a_voice_turn_waiting_for_the_users_approval_says_so(server, fake, speech, api_key):
    fake.enqueue(
        tool_use_response([("toolu_pay", "checkout", {})]),
        text_response("Paid.", chunks=1),
    )
    speech.transcripts.append("pay for my cart")
    client = AitpClient(server.ws_url(), api_key=api_key.raw, origin=ORIGIN)
    await client.connect(timeout=PATIENCE)
    try:
        await client.context_update("/cart", "Cart", tools=[CHECKOUT])
        await client.recv_until(system_event("tools_effective"), timeout=PATIENCE)
        await client.send("AUDIO_STREAM", {"data": SPOKEN, "mimeType": "audio/pcm;rate=16000"})
        await client.send("VOICE_INPUT_END", {"reason": "user_stop"})
        call = (await frames_until(client, "TOOL_CALL"))[-1]["payload"]
        await client.send("APPROVAL_REQUEST", {"callId": call["callId"], "toolName": "checkout",
                                               "risk": "high", "args": {}, "message": "Pay now?"})
        waiting = await frames_until(client, "voice:waiting_for_input")
        await client.send("APPROVAL_RESPONSE", {"callId": call["callId"], "approved": True,
                                                "result": {"paid": True}})
        rest = await frames_until(client, "done")
    finally:
        await client.close()
    assert waiting[-1]["payload"] == {"event": "waiting_for_input"}
    assert final_text(rest) == "Paid."


async def test_speaking_counts_against_the_same_input_limit_as_typing(
        daphne_factory, fake, speech, api_key):
    server = daphne_factory(
        OWLLAYER_LLM="anthropic", ANTHROPIC_API_KEY=API_KEY, ANTHROPIC_BASE_URL=fake.base_url,
        OWLLAYER_MODEL="claude-test-model", OWLLAYER_LLM_MAX_RETRIES=0, OWLLAYER_VOICE="1",
        OWLLAYER_STT="openai", OWLLAYER_TTS="openai", OWLLAYER_VOICE_API_KEY=VOICE_KEY,
        OWLLAYER_VOICE_BASE_URL=speech.base_url, OWLLAYER_USER_INPUTS_PER_MINUTE="1",
    )
    fake.enqueue(text_response("Your cart is empty.", chunks=1))
    client = await open_client(server, api_key)
    try:
        first = await speak_once(client)
        second = await speak_once(client)
    finally:
        await client.close()
    assert final_text(first) == "Your cart is empty."
    assert [kind(f) for f in second] == ["error:rate_limited", "voice:turn_complete", "AGENT_RESPONSE"]
    assert len(fake.requests) == 1
