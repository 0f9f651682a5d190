"""The widget's microphone, in real Chromium on a tenant's page of another
origin, the widget served by a real daphne process, its socket answered by a
script (Playwright's WebSocket routing): the server side of voice is tested
on its own. The microphone is an eSpeak NG recording (voice_support.py)."""
from __future__ import annotations

import re

import pytest
from asgiref.sync import sync_to_async
from playwright.async_api import Page, expect

from tests.browser.conftest import ack, eventually
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
from tests.browser.widget_support import (  # noqa: F401 (host_site: a fixture)
    host_site,
    no_serious_violations,
    publish,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


async def open_scripted_widget(page: Page, store, site, assistant: ScriptedAssistant) -> None:
    await sync_to_async(publish)(site, store, allowed_origins=[site.origin])
    await page.route_web_socket(re.compile(r"/owllayer\?"), assistant.route)
    await page.goto(site.origin + "/")
    await page.get_by_role("button", name="Open chat").click()
    await expect(widget(page).locator(".status")).to_have_text("Online")


def widget(page: Page):
    return page.locator("owllayer-widget")


def mic(page: Page):
    return widget(page).locator("button.mic")


async def test_without_voice_on_the_server_the_widget_has_no_microphone(store, host_site, page):
    await open_scripted_widget(page, store, host_site, ScriptedAssistant(ack()))

    await expect(mic(page)).to_be_hidden()
    await expect(widget(page).get_by_role("button", name="Send")).to_be_visible()


@pytest.mark.parametrize("microphone_loops", [False])
async def test_a_spoken_question_shows_what_was_heard_then_the_answer_while_it_is_spoken(
        store, host_site, page, shot):
    # Six seconds of answer, which nobody talks over.
    assistant = ScriptedAssistant(audio_ack(), answer_frames(24))
    await open_scripted_widget(page, store, host_site, assistant)
    await expect(mic(page)).to_be_visible()
    await expect(mic(page)).to_have_attribute("aria-label", "Speak to the assistant")

    await mic(page).click()
    await expect(mic(page)).to_have_attribute("aria-pressed", "true")
    await expect(mic(page)).to_have_attribute("aria-label", "Stop and send what you said")
    await expect(widget(page).locator(".status")).to_have_text(re.compile("^Listening"))
    await no_serious_violations(page)
    await eventually(lambda: len(assistant.sent("AUDIO_STREAM")) >= 4, what="the microphone's chunks")
    await shot("listening")
    await mic(page).click()

    await expect(widget(page).locator(".msg.user[data-voice=true]")).to_have_text(HEARD)
    await expect(widget(page).locator(".msg.agent[aria-busy=false]")).to_have_text(ANSWER)
    await expect(mic(page)).to_have_attribute("data-state", "speaking")
    await expect(widget(page).locator(".status")).to_have_text(re.compile("^Speaking"))
    await shot("speaking")
    await expect(mic(page)).to_have_attribute("data-state", "ready", timeout=30_000)
    await expect(widget(page).locator(".status")).to_have_text("Online")

    assert [m["payload"] for m in assistant.sent("VOICE_INPUT_END")] == [{"reason": "user_stop"}]
    assert {m["payload"]["mimeType"] for m in assistant.sent("AUDIO_STREAM")} == {MIC_MIME}
    assert assistant.sent("VOICE_INTERRUPT") == []
    assert await widget(page).locator(".msg[data-cut]").count() == 0
    # The page heard both: the visitor's words (said, not typed) and the answer.
    assert await page.evaluate("window.seen.messages") == [
        {"role": "user", "text": HEARD, "voice": True}, {"role": "assistant", "text": ANSWER}]


async def test_talking_over_the_spoken_answer_cuts_it_off_and_the_answer_says_so(store, host_site, page, shot):
    # Twenty seconds of answer: the looping recording speaks up in it.
    assistant = ScriptedAssistant(audio_ack(), answer_frames(80))
    await open_scripted_widget(page, store, host_site, assistant)
    await mic(page).click()
    await eventually(lambda: assistant.sent("AUDIO_STREAM"), what="the microphone's first chunk")
    await mic(page).click()
    await expect(widget(page).locator(".msg.agent[aria-busy=false]")).to_contain_text(ANSWER)

    await eventually(lambda: assistant.sent("VOICE_INTERRUPT"), timeout=40, what="the barge-in")
    answer = widget(page).locator(".msg.agent[data-cut=true]")
    await expect(answer).to_have_count(1)
    await expect(answer.locator(".cutoff")).to_have_text("(cut off)")
    await expect(mic(page)).to_have_attribute("aria-pressed", "true")
    await shot("cut-off")
    assert [m["payload"] for m in assistant.sent("VOICE_INTERRUPT")] == [{"reason": "barge_in"}]


@pytest.mark.parametrize("microphone_allowed", [False])
async def test_a_refused_microphone_is_said_in_plain_words_and_typing_still_works(store, host_site, page):
    assistant = ScriptedAssistant(audio_ack())
    await open_scripted_widget(page, store, host_site, assistant)

    await mic(page).click()

    await expect(widget(page).get_by_role("alert")).to_have_text(
        "The microphone is not available: allow it for this site in the browser, or type instead.")
    await expect(mic(page)).to_have_attribute("aria-pressed", "false")
    await expect(widget(page).get_by_role("button", name="Send")).to_be_enabled()
    assert assistant.sent("AUDIO_STREAM") == []
