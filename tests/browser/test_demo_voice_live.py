"""The demo store's microphone end to end: real Chromium whose microphone is an
eSpeak NG recording (Chromium's fake capture device plays the WAV made at test
time), the store on a real daphne process with the offline speech engines
(PocketSphinx listening for a small grammar, eSpeak NG speaking), and the
anthropic agent through the real SDK to the fake Messages API, which plays the
model. What the test checks is what the store's widget shows and counts
(OwlLayer.diagnostics()), and what the server stored."""
from __future__ import annotations

import math
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from playwright.async_api import Page, expect

from aitp.models import ConversationMessage, ToolCall
from aitp_client import AitpClient
from tests.browser.conftest import MODEL_API_KEY, Store, eventually, print_logs, start_store
from tests.browser.store_support import (
    WIDGET,
    answers,
    heard,
    mic,
    nothing_dropped,
    open_panel,
    status,
    tool_calls,
    wire,
)
from tests.browser.voice_support import (  # noqa: F401 (browser, microphone_*: fixtures)
    MIC_CHUNK_BYTES,
    browser,
    microphone_allowed,
    microphone_loops,
    speech_wav,
    wav_seconds,
)
from tests.speech.conftest import needs_espeak
from tests.support.fake_anthropic import StreamedMessage, TextBlock, text_response, tool_use_response

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True), needs_espeak]

# What the shopper says: words of the grammar below, spoken at a speed this
# model hears reliably (tests/aitp/test_voice_e2e.py).
HEARD = "add two headphones to my cart"
WORDS_PER_MINUTE = 130
# The page opens the microphone, then starts the utterance: the recording
# begins with a moment of silence so that none of it is spoken before.
LEAD_SECONDS = 1.0
# The silence after the words: a looping recording speaks again this much
# later, which gives the agent time to answer (on a busy machine too) before
# the shopper's next words; the first answer is longer than that.
PAUSE_SECONDS = 8.0
# How long the shopper takes to click after the last word.
CLICK_AFTER_SECONDS = 0.5
# A quiet room's noise under the recording (about -35 dBFS, below the page's
# speech level). Over digital silence, and through Chromium's noise
# suppression, PocketSphinx often hears another command or nothing.
HISS = 600.0
GRAMMAR = """#JSGF V1.0;
grammar shop;
public <command> = (add | remove) (one | two | three) (headphones | speakers) to my cart
                 | what is in my cart | show me the headphones;
"""
FIRST_WORDS = "Adding two Pro Headphones."
ANSWER = "Two Pro Headphones are in your cart."
PRODUCT_PATH = "/demo/products/pro-headphones/"
# An answer whose first sentences take some twelve seconds to say: the
# recording, playing again, speaks over them.
LONG_ANSWER = ("The Pro Headphones are closed-back and wireless, with active noise cancelling "
               "that keeps a busy train quiet. Their battery lasts thirty hours on one charge, "
               "and they fold flat into the travel case that comes with them.")
NEVER_SAID = "They ship tomorrow by express courier."
# Short: said before the recording speaks again.
SECOND_ANSWER = "Of course."


@pytest.fixture(scope="module")
def microphone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return speech_wav(tmp_path_factory.mktemp("voice"), HEARD, words_per_minute=WORDS_PER_MINUTE,
                      lead_seconds=LEAD_SECONDS, pause_seconds=PAUSE_SECONDS, hiss=HISS)


@pytest.fixture
def voice_store(daphne_factory, model, tmp_path) -> Iterator[Store]:
    """The store with voice on the offline engines and the anthropic agent."""
    grammar = tmp_path / "shop.jsgf"
    grammar.write_text(GRAMMAR)
    started = start_store(daphne_factory, {
        "OWLLAYER_LLM": "anthropic",
        "ANTHROPIC_API_KEY": MODEL_API_KEY,
        "ANTHROPIC_BASE_URL": model.base_url,
        "OWLLAYER_LLM_MAX_RETRIES": "0",
        "OWLLAYER_VOICE": "1",
        "OWLLAYER_STT": "pocketsphinx",
        "OWLLAYER_TTS": "espeak",
        "OWLLAYER_STT_GRAMMAR": str(grammar),
    })
    yield started
    print_logs(started)


async def offers_voice(store: Store) -> None:
    """A first handshake, which offers audio: the page's own then does not
    wait for the server process to finish loading its speech engines (seconds
    on a busy machine; the page gives up after five)."""
    client = AitpClient(store.server.ws_url(), api_key=store.raw_key, origin=store.server.http_url)
    try:
        ack = await client.connect(timeout=60)
    finally:
        await client.close()
    assert "audio" in ack["capabilities"], store.server.logs()


async def open_product_page(page: Page, store: Store) -> None:
    """The Pro Headphones page (its tools include add_to_cart), with the microphone offered."""
    await offers_voice(store)
    await page.goto(f"{store.server.http_url}{PRODUCT_PATH}?apiKey={quote(store.raw_key, safe='')}")
    await open_panel(page)
    await expect(status(page)).to_have_text("Online")
    await expect(mic(page)).to_have_attribute("data-state", "ready")


def chat_entries(page: Page):
    """What the widget's conversation shows, entry by entry: messages, notes, tool lines."""
    return page.locator(f"{WIDGET} .log > *")


async def voice(page: Page) -> dict:
    """The client's voice counters (OwlLayer.diagnostics().voice)."""
    return await wire(page, "voice")


async def received(page: Page, type_: str) -> list[dict]:
    """The payloads of the frames of `type_` the page received, in order."""
    return [frame["payload"] for frame in await wire(page, "frames") if frame["type"] == type_]


async def sent(page: Page, *types: str) -> list[dict]:
    """The payloads of the frames of those types the page sent, in order."""
    return [frame["payload"] for frame in await wire(page, "sent") if frame["type"] in types]


def chunks_of(seconds: float) -> int:
    """How many of the page's microphone chunks `seconds` of it fill."""
    return math.ceil(seconds * 16000 * 2 / MIC_CHUNK_BYTES)


def words_seconds(recording: Path) -> float:
    """How long the recording's words last."""
    return wav_seconds(recording) - LEAD_SECONDS - PAUSE_SECONDS


async def sent_chunks(page: Page) -> int:
    return await wire(page, "voice.sentChunks")


async def speak_into_the_microphone(page: Page, recording: Path) -> None:
    """Click the microphone, say the words, click again to send."""
    await mic(page).click()
    await expect(mic(page)).to_have_attribute("data-state", "listening")
    await send_once_said(page, recording, LEAD_SECONDS + words_seconds(recording))


async def send_once_said(page: Page, recording: Path, seconds: float) -> None:
    """Click the microphone to send once `seconds` more of it went up."""
    wanted = await sent_chunks(page) + chunks_of(seconds + CLICK_AFTER_SECONDS)
    await eventually(lambda: page.evaluate(f"OwlLayer.diagnostics().voice.sentChunks >= {wanted}"),
                     timeout=30, what=f"{wanted} microphone chunks to go up")
    await mic(page).click()


async def stored(session_id: str) -> list[tuple[str, list]]:
    return [(m.role, m.content) async for m in
            ConversationMessage.objects.filter(session_id=session_id).order_by("seq")]


@pytest.mark.parametrize("microphone_loops", [False])
async def test_a_spoken_request_fills_the_cart_and_the_answer_is_shown_and_spoken(
        voice_store, model, page, microphone, shot):
    model.enqueue(
        tool_use_response([("toolu_voice_cart", "add_to_cart", {"quantity": 2})], text=FIRST_WORDS),
        text_response(ANSWER, chunks=3),
    )
    await open_product_page(page, voice_store)
    await shot("ready")

    await speak_into_the_microphone(page, microphone)

    # What was heard, the words before the call, the call, the answer: in that order.
    await expect(heard(page)).to_have_text(HEARD)
    # The words before the call are a bubble of their own, above the call's line.
    await expect(answers(page)).to_have_text([FIRST_WORDS, ANSWER])
    assert (await chat_entries(page).all_inner_texts())[-4:] == [
        HEARD, FIRST_WORDS, "Done: Add to cart", ANSWER]
    await expect(page.locator("#cart-count")).to_have_text("2")
    await shot("answered")
    # The answer was spoken to its end: every chunk played, in order, and
    # the server closed the voice turn.
    await expect(mic(page)).to_have_attribute("data-state", "ready")
    await expect(status(page)).to_have_text("Online")
    assert await received(page, "VOICE_STATE_EVENT") == [{"event": "turn_complete"}]
    spoken = await voice(page)
    assert spoken["receivedChunks"] == len(await received(page, "AUDIO_STREAM")) > 0
    assert spoken["played"] == list(range(1, spoken["receivedChunks"] + 1))
    assert spoken["playedChunks"] == spoken["receivedChunks"]
    assert (spoken["ignoredChunks"], spoken["stoppedChunks"], spoken["interrupts"]) == (0, 0, 0)
    said = [event["data"] for event in await received(page, "SYSTEM_EVENT") if event["kind"] == "transcript"]
    assert said[0] == {"role": "user", "text": HEARD}
    assert " ".join(event["text"] for event in said[1:]) == f"{FIRST_WORDS} {ANSWER}"
    assert await sent(page, "VOICE_INPUT_END") == [{"reason": "user_stop"}]
    await nothing_dropped(page)

    # The server's record: what was heard, the call and its result, the answer.
    assert model.requests[0]["messages"][-1]["content"][0]["text"] == HEARD
    [call] = await tool_calls("add_to_cart")
    assert (call.tool_use_id, call.status, call.arguments) == (
        "toolu_voice_cart", ToolCall.Status.SUCCESS, {"quantity": 2})
    assert call.result["cart"]["itemCount"] == 2
    messages = await stored(await wire(page, "sessionId"))
    assert [role for role, _ in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[0][1][0] == {"type": "text", "text": HEARD, "voice": "heard"}
    assert messages[1][1] == [
        {"type": "text", "text": FIRST_WORDS, "voice": "said"},
        {"type": "tool_use", "id": "toolu_voice_cart", "name": "add_to_cart", "input": {"quantity": 2}},
    ]
    assert messages[2][1][0]["tool_use_id"] == "toolu_voice_cart"
    assert messages[3][1] == [{"type": "text", "text": ANSWER, "voice": "said"}]


async def test_talking_over_the_spoken_answer_cuts_it_off_and_the_next_request_is_answered(
        voice_store, model, page, microphone, shot):
    # The model writes its first sentences, then waits: the answer is still
    # being written when the shopper speaks over it.
    writing = threading.Event()
    model.enqueue(
        StreamedMessage(blocks=[TextBlock([LONG_ANSWER + " ", NEVER_SAID])],
                        hold=writing, hold_after_events=4),
        text_response(SECOND_ANSWER, chunks=1),
    )
    cut = page.locator(f"{WIDGET} .msg.agent[data-cut=true]")
    try:
        await open_product_page(page, voice_store)
        await speak_into_the_microphone(page, microphone)
        await expect(heard(page)).to_have_text([HEARD])

        # The recording plays again: the shopper speaks over the answer.
        await eventually(lambda: page.evaluate("OwlLayer.diagnostics().voice.bargeIns > 0"), timeout=40,
                         what="the shopper to speak over the answer")
        await expect(mic(page)).to_have_attribute("data-state", "listening")
        await expect(status(page)).to_have_text(re.compile("^Listening"))
        await expect(cut).to_have_count(1)
        await expect(cut.locator("p")).to_have_text(LONG_ANSWER)
        await expect(cut.locator(".cutoff")).to_have_text("(cut off)")
        await shot("cut-off")
        await send_once_said(page, microphone, words_seconds(microphone))
    finally:
        writing.set()

    # The words that set the barge-in off were heard whole.
    await expect(heard(page)).to_have_text([HEARD, HEARD])
    # The cut answer keeps its words; the next one has a bubble of its own.
    await expect(cut.locator("p")).to_have_text(LONG_ANSWER)
    await expect(answers(page).last.locator("p")).to_have_text(SECOND_ANSWER)
    await expect(answers(page).last).not_to_have_attribute("data-cut", "true")
    await expect(mic(page)).to_have_attribute("data-state", "ready")
    await expect(status(page)).to_have_text("Online")
    await shot("answered-again")
    assert await received(page, "VOICE_STATE_EVENT") == [
        {"event": "interrupted", "reason": "barge_in"}, {"event": "turn_complete"}]
    assert await sent(page, "VOICE_INTERRUPT", "VOICE_INPUT_END") == [
        {"reason": "user_stop"}, {"reason": "barge_in"}, {"reason": "user_stop"}]
    spoken = await voice(page)
    assert (spoken["bargeIns"], spoken["interrupts"], spoken["utterances"]) == (1, 1, 2)
    # Cut off: some of the first answer's voice never played.
    assert spoken["stoppedChunks"] > 0
    assert spoken["playedChunks"] + spoken["stoppedChunks"] + spoken["ignoredChunks"] == spoken["receivedChunks"]
    await nothing_dropped(page)

    # The server stored the first answer as far as its voice went (sent at
    # the pace it plays: the rest was never sent), marked interrupted, and
    # then the second turn as usual.
    messages = await stored(await wire(page, "sessionId"))
    assert [role for role, _ in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[0][1][0] == {"type": "text", "text": HEARD, "voice": "heard"}
    [kept] = messages[1][1]
    assert kept["voice"] == "interrupted"
    assert kept["text"] and LONG_ANSWER.startswith(kept["text"])
    assert messages[2][1][0] == {"type": "text", "text": HEARD, "voice": "heard"}
    assert messages[3][1] == [{"type": "text", "text": SECOND_ANSWER, "voice": "said"}]

    # A reload reads the conversation back with its marks: what was heard, and the answer cut off.
    await page.reload()
    await open_panel(page)
    await expect(heard(page)).to_have_text([HEARD, HEARD])
    await expect(cut).to_have_count(1)
    await expect(cut.locator("p")).to_have_text(kept["text"])
    await expect(cut.locator(".cutoff")).to_have_text("(cut off)")
    await shot("read-back-after-a-reload")


# An answer the model writes in two parts, waiting between them.
WRITTEN_FIRST = "The Pro Headphones are closed-back and wireless. "
WRITTEN_AFTER = "They fold flat into their case."


@pytest.mark.parametrize("microphone_loops", [False])
async def test_a_reload_in_the_middle_of_a_spoken_answer_shows_what_was_heard_and_the_answer_once(
        voice_store, model, page, microphone, shot):
    writing = threading.Event()
    model.enqueue(StreamedMessage(blocks=[TextBlock([WRITTEN_FIRST, WRITTEN_AFTER])],
                                  hold=writing, hold_after_events=4))
    being_written = page.locator(f"{WIDGET} .msg.agent[aria-busy=true]")
    try:
        await open_product_page(page, voice_store)
        await speak_into_the_microphone(page, microphone)
        await expect(heard(page)).to_have_text([HEARD])
        await expect(being_written).to_have_text([WRITTEN_FIRST.strip()])

        # The answer is still being written: the reloaded page draws the
        # turn as the tab showed it, the utterance heard included.
        await page.reload()
        await open_panel(page)
        await expect(heard(page)).to_have_text([HEARD])
        await expect(being_written).to_have_text([WRITTEN_FIRST.strip()])
        await shot("reloaded-mid-answer")
    finally:
        writing.set()

    await expect(answers(page)).to_have_text([WRITTEN_FIRST + WRITTEN_AFTER])
    await expect(status(page)).to_have_text("Online")
    await expect(heard(page)).to_have_text([HEARD])
    assert (await chat_entries(page).all_inner_texts())[-2:] == [HEARD, WRITTEN_FIRST + WRITTEN_AFTER]
    frames = await wire(page, "frames")
    assert frames[0]["type"] == "HANDSHAKE_ACK" and frames[0]["payload"]["resumed"] is True
    await nothing_dropped(page)
    # The server kept the turn once: what was heard, the whole answer.
    messages = await stored(await wire(page, "sessionId"))
    assert [role for role, _ in messages] == ["user", "assistant"]
    assert messages[0][1][0] == {"type": "text", "text": HEARD, "voice": "heard"}
