"""The demo store's microphone, in real Chromium on the store a real daphne
process serves (under its CSP), with the assistant's socket answered by a
script (Playwright's WebSocket routing): the server side of voice is tested
on its own. The microphone is an eSpeak NG recording (voice_support.py)."""
from __future__ import annotations

import re

import pytest
from playwright.async_api import Page, expect

from tests.browser.conftest import WATCH_VIOLATIONS, ack, eventually
from tests.browser.store_support import status
from tests.browser.voice_support import (  # noqa: F401 (browser, microphone*: fixtures)
    ANSWER,
    HEARD,
    MIC_MIME,
    ScriptedAssistant,
    answer_frames,
    audio_ack,
    browser,
    microphone,
    microphone_allowed,
    microphone_loops,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


async def open_scripted_store(page: Page, store, assistant: ScriptedAssistant) -> None:
    await page.add_init_script(WATCH_VIOLATIONS)
    await page.route_web_socket(re.compile(r"/owllayer\?"), assistant.route)
    await page.goto(store.url)
    await expect(status(page)).to_have_text("connected")


def mic(page: Page):
    return page.locator("#owl-mic")


async def no_violations(page: Page) -> None:
    assert await page.evaluate("window.__cspViolations") == []


async def test_without_voice_on_the_server_the_chat_has_no_microphone(store, page):
    assistant = ScriptedAssistant(ack())
    await open_scripted_store(page, store, assistant)

    await expect(mic(page)).to_be_hidden()
    assert await page.evaluate("window.__owl.voice.state") == "off"


@pytest.mark.parametrize("microphone_loops", [False])
async def test_a_spoken_question_shows_what_was_heard_and_the_answer_is_spoken(store, page, shot):
    # Six seconds of answer, which nobody talks over.
    assistant = ScriptedAssistant(audio_ack(), answer_frames(24))
    await open_scripted_store(page, store, assistant)
    await expect(mic(page)).to_be_visible()
    await expect(mic(page)).to_have_attribute("data-state", "ready")

    await mic(page).click()
    await expect(mic(page)).to_have_attribute("data-state", "listening")
    await expect(mic(page)).to_have_attribute("aria-pressed", "true")
    await expect(page.locator("#owl-activity")).to_have_text(re.compile("^Listening"))
    await eventually(lambda: len(assistant.sent("AUDIO_STREAM")) >= 4, what="the microphone's chunks")
    await shot("listening")
    await mic(page).click()

    await expect(page.locator(".owl-msg-user[data-voice=true]")).to_have_text(HEARD)
    await expect(page.locator(".owl-msg-agent[data-done=true]")).to_have_text(ANSWER)
    await expect(mic(page)).to_have_attribute("data-state", "speaking")
    await expect(page.locator("#owl-activity")).to_have_text(re.compile("^Speaking"))
    await shot("speaking")
    # (The page's CSP refuses wait_for_function's eval.)
    await eventually(lambda: page.evaluate("window.__owl.voice.playedChunks === 24"),
                     what="the answer's chunks played")
    await expect(mic(page)).to_have_attribute("data-state", "ready")
    await shot("answered")

    assert [m["payload"] for m in assistant.sent("VOICE_INPUT_END")] == [{"reason": "user_stop"}]
    assert {m["payload"]["mimeType"] for m in assistant.sent("AUDIO_STREAM")} == {MIC_MIME}
    assert assistant.sent("VOICE_INTERRUPT") == []
    assert await page.locator(".owl-msg-agent[data-cut]").count() == 0
    await no_violations(page)


async def test_talking_over_the_spoken_answer_cuts_it_off_and_listens(store, page, shot):
    # Twenty seconds of answer: the looping recording speaks up in it.
    assistant = ScriptedAssistant(audio_ack(), answer_frames(80))
    await open_scripted_store(page, store, assistant)
    await mic(page).click()
    await eventually(lambda: assistant.sent("AUDIO_STREAM"), what="the microphone's first chunk")
    await mic(page).click()
    await expect(page.locator(".owl-msg-agent[data-done=true]")).to_have_text(ANSWER)

    await eventually(lambda: assistant.sent("VOICE_INTERRUPT"), timeout=40, what="the barge-in")
    await expect(page.locator(".owl-msg-agent[data-cut=true]")).to_have_count(1)
    await expect(mic(page)).to_have_attribute("data-state", "listening")
    await shot("cut-off")

    assert [m["payload"] for m in assistant.sent("VOICE_INTERRUPT")] == [{"reason": "barge_in"}]
    voice = await page.evaluate("window.__owl.voice")
    assert voice["stoppedChunks"] > 0 and voice["playedChunks"] < 80
    await no_violations(page)
    # The chat keeps what was heard and the cut after a reload.
    await page.reload()
    await expect(page.locator(".owl-msg-agent[data-cut=true]")).to_have_count(1)
    await expect(page.locator(".owl-msg-user[data-voice=true]").first).to_have_text(HEARD)
    await no_violations(page)


@pytest.mark.parametrize("microphone_allowed", [False])
async def test_a_refused_microphone_is_explained_and_typing_still_works(store, page):
    assistant = ScriptedAssistant(audio_ack())
    await open_scripted_store(page, store, assistant)

    await mic(page).click()

    await expect(page.locator(".owl-msg-error")).to_have_text(re.compile("^I can't use your microphone"))
    await expect(mic(page)).to_have_attribute("data-state", "ready")
    await expect(page.locator("#owl-send")).to_be_enabled()
    assert assistant.sent("AUDIO_STREAM") == []
