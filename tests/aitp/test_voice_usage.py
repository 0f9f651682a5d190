"""What a voice turn leaves behind, over a real socket: the seconds of speech
heard and of audio sent on the session's row and the tenant's day, and a
record the console and the operators' live page show as voice -- what was
heard, what was said, and where a barge-in cut it.

The same real daphne, offline engines and fake Messages API as
tests/aitp/test_voice_e2e.py, whose helpers these tests use."""
from __future__ import annotations

import base64
import threading

import pytest
from asgiref.sync import sync_to_async
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from aitp.models import ConversationMessage, DailyUsage, Session
from aitp.transcript import INTERRUPTED_NOTE
from aitp_client import AitpClient, system_event
from tests.aitp.conftest import ADD_TO_CART
from tests.aitp.test_voice_e2e import (
    PATIENCE,
    fake,  # noqa: F401 (fixture)
    frames_of_speech,
    frames_until,
    microphone,
    open_client,
    start_server,
)
from tests.speech.conftest import needs_espeak
from tests.support.fake_anthropic import StreamedMessage, TextBlock, text_response
from tests.support.people import make_user

pytestmark = [pytest.mark.django_db(transaction=True), needs_espeak]

REQUEST = "what is in my cart"
FIRST = "Your cart now holds two pairs of headphones."
REST = ["They ship tomorrow ", "by express courier."]


@pytest.fixture
def server(daphne_factory, fake, tmp_path):
    # Every count written at once: the tenant's day is read right after the turn.
    return start_server(daphne_factory, fake, tmp_path, OWLLAYER_USAGE_FLUSH_INTERVAL="0")


async def speak_request(client: AitpClient) -> int:
    """The request spoken into the microphone; returns the bytes of speech sent."""
    chunks = microphone(REQUEST)
    for data in chunks:
        await client.send("AUDIO_STREAM", {"data": data, "mimeType": "audio/pcm;rate=16000"})
    await client.send("VOICE_INPUT_END", {"reason": "user_stop"})
    return sum(len(base64.b64decode(data)) for data in chunks)


def audio_bytes(frames: list[dict]) -> int:
    """The agent's audio the page received, in bytes (24 kHz 16-bit mono)."""
    return sum(len(base64.b64decode(f["payload"]["data"])) for f in frames if f["type"] == "AUDIO_STREAM")


def heard_ms(size: int) -> int:
    return round(size / 32)  # 16 kHz, 2 bytes a sample: 32 bytes a millisecond


def spoken_ms(size: int) -> int:
    return round(size / 48)  # 24 kHz, 2 bytes a sample: 48 bytes a millisecond


async def audio_of(session_id: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """(heard, spoken) milliseconds of the session's row and of its tenant's day."""
    session = await Session.objects.aget(pk=session_id)
    day = await DailyUsage.objects.aget(tenant_id=session.tenant_id, date=timezone.localdate())
    return (session.audio_heard_ms, session.audio_spoken_ms), (day.audio_heard_ms, day.audio_spoken_ms)


async def test_a_voice_turn_adds_the_speech_heard_and_the_audio_sent_to_its_session_and_its_tenants_day(
        server, fake, api_key):
    fake.enqueue(text_response("Sure thing. Two are now in your cart.", chunks=2))
    client = await open_client(server, api_key)
    try:
        sent = await speak_request(client)
        frames = await frames_until(client, "done")
    finally:
        await client.close()

    received = audio_bytes(frames)
    assert received > 0
    expected = (heard_ms(sent), spoken_ms(received))
    assert await audio_of(client.session_id) == (expected, expected)


async def test_a_typed_turn_adds_no_audio(server, fake, api_key):
    fake.enqueue(text_response("Hello.", chunks=1))
    client = await open_client(server, api_key)
    try:
        await client.send("USER_INPUT", {"modality": "text", "content": "hello"})
        await frames_until(client, "done")
    finally:
        await client.close()
    assert await audio_of(client.session_id) == ((0, 0), (0, 0))


async def barged_in_turn(fake, client: AitpClient) -> tuple[int, list[dict]]:
    """A spoken request whose answer the user interrupts once its first
    sentence was sent; the model is still writing the rest. Returns the bytes
    of speech sent and every frame the page received."""
    hold = threading.Event()
    fake.enqueue(StreamedMessage(blocks=[TextBlock([FIRST + " ", *REST])], hold=hold, hold_after_events=4))
    sent = await speak_request(client)
    frames: list[dict] = []
    while sum(f["type"] == "AUDIO_STREAM" for f in frames) < frames_of_speech(FIRST):
        frames.append(await client.recv(PATIENCE))
    await client.send("VOICE_INTERRUPT", {"reason": "barge_in"})
    frames += await frames_until(client, "voice:interrupted")
    hold.set()
    return sent, frames


async def test_a_barge_in_counts_only_the_audio_that_was_sent(server, fake, api_key):
    client = await open_client(server, api_key)
    try:
        sent, frames = await barged_in_turn(fake, client)
    finally:
        await client.close()

    received = audio_bytes(frames)
    (session_audio, day_audio) = await audio_of(client.session_id)
    assert session_audio == day_audio == (heard_ms(sent), spoken_ms(received))
    # The whole answer would have been longer than what was sent.
    assert frames_of_speech(FIRST) < frames_of_speech(FIRST + " " + "".join(REST))


def pages(session_id: str) -> tuple[str, str]:
    """The session's record in the tenant console and on the operators' live page."""
    session = Session.objects.select_related("tenant").get(pk=session_id)
    person = make_user("olivia", tenant=session.tenant, staff=True)
    browser = Client()
    browser.force_login(person)
    console = browser.get(reverse("console:session", args=[session.tenant.slug, session_id]))
    live = browser.get(reverse("operators:live_session", args=[session_id]))
    assert (console.status_code, live.status_code) == (200, 200)
    return console.content.decode(), live.content.decode()


async def test_the_console_and_the_live_page_show_what_was_heard_what_was_said_and_where_it_was_cut(
        server, fake, api_key):
    client = await open_client(server, api_key)
    try:
        await barged_in_turn(fake, client)
        fake.enqueue(text_response("Of course.", chunks=1))
        await client.send("USER_INPUT", {"modality": "text", "content": "thanks"})
        await frames_until(client, "done")
    finally:
        await client.close()

    stored = [m.content[0] async for m in
              ConversationMessage.objects.filter(session_id=client.session_id).order_by("seq")]
    assert [block.get("voice") for block in stored] == ["heard", "interrupted", None, None]
    assert stored[1]["text"] == FIRST  # cut where the voice stopped

    console, live = await sync_to_async(pages)(client.session_id)
    for html in (console, live):
        heard_at = html.index('data-voice="heard"')
        cut_at = html.index('data-voice="interrupted"')
        assert heard_at < html.index(REQUEST) < cut_at < html.index(FIRST) < html.index(INTERRUPTED_NOTE)
        assert html.count("data-voice=") == 2  # the typed turn is not voice
        assert "s heard" in html and "s spoken" in html
        assert REST[0].strip() not in html  # never said, never shown as said


@pytest.mark.browser
async def test_an_operator_watching_live_sees_the_voice_turn_heard_said_and_interrupted(
        browser, server, fake, api_key, request):
    from tests.operators.test_live_pages_browser import operator_tab, screenshot, until_the_feed_shows_moves

    olivia = await sync_to_async(make_user)("olivia", tenant=api_key.tenant, staff=True)
    client = await open_client(server, api_key)
    tab, errors = await operator_tab(browser, server, olivia)
    try:
        await tab.goto(f"{server.http_url}{reverse('operators:live_session', args=[client.session_id])}")
        await tab.wait_for_selector("#live-status.state-live")

        async def move(url: str) -> None:
            await client.context_update(url, "Pro Headphones", tools=[ADD_TO_CART],
                                        context={"productId": "pro-headphones"})
            await client.recv_until(system_event("tools_effective"), timeout=PATIENCE)

        await until_the_feed_shows_moves(tab, move, back_to="/products/headphones")
        await barged_in_turn(fake, client)
    finally:
        await client.close()

    feed = "#live-feed"
    await tab.wait_for_selector(f"{feed} >> text=Page user (heard, spoken)")
    await tab.wait_for_selector(f"{feed} .kind-user pre >> text={REQUEST}")
    await tab.wait_for_selector(f"{feed} >> text=Agent speaking (audio sent)")
    await tab.wait_for_selector(f"{feed} .kind-agent pre >> text={FIRST}")
    await tab.wait_for_selector(f"{feed} .kind-cut >> text=Interrupted: the agent's voice stopped here")
    # The record below follows: the cut answer is marked where the voice stopped.
    await tab.wait_for_selector('#conversation [data-voice="interrupted"] .voice-cut')
    assert await tab.text_content('#conversation [data-voice="interrupted"] pre') == FIRST
    assert await tab.text_content('#conversation [data-voice="heard"] pre') == REQUEST
    # Audio reaches the page as its length, never as samples.
    assert "data" not in await tab.evaluate(
        "() => [...document.querySelectorAll('#live-feed pre')].map(p => p.textContent).join(' ')")
    await screenshot(tab, request, "voice-turn")
    assert not errors, f"page script errors: {errors}"
