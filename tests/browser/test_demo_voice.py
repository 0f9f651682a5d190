"""The demo store's microphone (the widget's), in real Chromium on the store
a real daphne process serves (under its CSP), with the assistant's socket
answered by a script (Playwright's WebSocket routing): the server side of
voice is tested on its own. The microphone is an eSpeak NG recording
(voice_support.py)."""
from __future__ import annotations

import json
import re

import pytest
from playwright.async_api import Page, expect

from tests.browser.conftest import WATCH_VIOLATIONS, ack, eventually, frame
from tests.browser.store_support import (
    WIDGET,
    answers,
    chat_input,
    heard,
    mic,
    open_panel,
    status,
    widget_error,
    wire,
)
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
    tone_chunks,
    transcript,
    voice_state,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


class TurnByTurnAssistant(ScriptedAssistant):
    """A ScriptedAssistant whose answers differ: the first VOICE_INPUT_END
    gets the first list of frames, the next one the second, and so on."""

    def __init__(self, ack_frame: str, *turns: list[str]) -> None:
        super().__init__(ack_frame)
        self.turns = list(turns)

    def receive(self, ws, message: str | bytes) -> None:
        if json.loads(message)["type"] == "VOICE_INPUT_END":
            self.answer = self.turns.pop(0) if self.turns else []
        super().receive(ws, message)


async def open_scripted_store(page: Page, store, assistant: ScriptedAssistant) -> None:
    await page.add_init_script(WATCH_VIOLATIONS)
    await page.route_web_socket(re.compile(r"/owllayer\?"), assistant.route)
    await page.goto(store.url)
    await open_panel(page)
    await expect(status(page)).to_have_text("Online")


def cut_answers(page: Page):
    return page.locator(f"{WIDGET} .msg.agent[data-cut=true]")


async def no_violations(page: Page) -> None:
    assert await page.evaluate("window.__cspViolations") == []


async def test_without_voice_on_the_server_the_chat_has_no_microphone(store, page):
    assistant = ScriptedAssistant(ack())
    await open_scripted_store(page, store, assistant)

    await expect(mic(page)).to_be_hidden()
    assert await wire(page, "voice.state") == "off"


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
    await expect(status(page)).to_have_text(re.compile("^Listening"))
    await eventually(lambda: len(assistant.sent("AUDIO_STREAM")) >= 4, what="the microphone's chunks")
    await shot("listening")
    await mic(page).click()

    await expect(heard(page)).to_have_text(HEARD)
    await expect(answers(page)).to_have_text(ANSWER)
    await expect(mic(page)).to_have_attribute("data-state", "speaking")
    await expect(status(page)).to_have_text(re.compile("^Speaking"))
    await shot("speaking")
    # (The page's CSP refuses wait_for_function's eval.)
    await eventually(lambda: page.evaluate("OwlLayer.diagnostics().voice.playedChunks === 24"),
                     what="the answer's chunks played")
    await expect(mic(page)).to_have_attribute("data-state", "ready")
    await expect(status(page)).to_have_text("Online")
    await shot("answered")

    assert [m["payload"] for m in assistant.sent("VOICE_INPUT_END")] == [{"reason": "user_stop"}]
    assert {m["payload"]["mimeType"] for m in assistant.sent("AUDIO_STREAM")} == {MIC_MIME}
    assert assistant.sent("VOICE_INTERRUPT") == []
    assert await page.locator(f"{WIDGET} .msg[data-cut]").count() == 0
    await no_violations(page)


async def test_talking_over_the_spoken_answer_cuts_it_off_and_listens(store, page, shot):
    # Twenty seconds of answer: the looping recording speaks up in it.
    assistant = ScriptedAssistant(audio_ack(), answer_frames(80))
    await open_scripted_store(page, store, assistant)
    await mic(page).click()
    await eventually(lambda: assistant.sent("AUDIO_STREAM"), what="the microphone's first chunk")
    await mic(page).click()
    await expect(answers(page)).to_contain_text(ANSWER)

    await eventually(lambda: assistant.sent("VOICE_INTERRUPT"), timeout=40, what="the barge-in")
    await expect(cut_answers(page)).to_have_count(1)
    await expect(cut_answers(page).locator(".cutoff")).to_have_text("(cut off)")
    await expect(mic(page)).to_have_attribute("data-state", "listening")
    await expect(status(page)).to_have_text(re.compile("^Listening"))
    await shot("cut-off")

    assert [m["payload"] for m in assistant.sent("VOICE_INTERRUPT")] == [{"reason": "barge_in"}]
    voice = await wire(page, "voice")
    assert voice["stoppedChunks"] > 0 and voice["playedChunks"] < 80
    await expect(heard(page).first).to_have_text(HEARD)
    await no_violations(page)


# What the agent had written when the shopper spoke over it, and its next answer.
WRITING = "The Pro Headphones are closed-back and wireless, with thirty hours of battery."
SECOND = "Of course."


async def test_an_answer_cut_while_still_being_written_keeps_its_words_and_the_next_answer_has_its_own(
        store, page, shot):
    # The first answer is being written and spoken (twenty seconds of it) when
    # the looping recording speaks over it; the cut turn ends without a done frame.
    cut_turn = [transcript("user", HEARD), frame("AGENT_RESPONSE", {"chunk": WRITING, "done": False}),
                *tone_chunks(80)]
    # The next one has no voice to speak over.
    next_turn = [transcript("user", HEARD), frame("AGENT_RESPONSE", {"chunk": SECOND, "done": False}),
                 voice_state("turn_complete"), frame("AGENT_RESPONSE", {"chunk": SECOND, "done": True})]
    assistant = TurnByTurnAssistant(audio_ack(), cut_turn, next_turn)
    await open_scripted_store(page, store, assistant)
    await mic(page).click()
    await eventually(lambda: assistant.sent("AUDIO_STREAM"), what="the microphone's first chunk")
    await mic(page).click()
    await eventually(lambda: assistant.sent("VOICE_INTERRUPT"), timeout=40, what="the barge-in")
    await expect(cut_answers(page).locator("p")).to_have_text(WRITING)
    await expect(mic(page)).to_have_attribute("data-state", "listening")
    spoken_over = len(assistant.sent("AUDIO_STREAM"))
    await eventually(lambda: len(assistant.sent("AUDIO_STREAM")) > spoken_over, what="the next words")
    await mic(page).click()

    await expect(heard(page)).to_have_text([HEARD, HEARD])
    await expect(answers(page).last).to_have_text(SECOND)
    await expect(status(page)).to_have_text("Online")
    await shot("answered-after-the-cut")
    # The cut answer keeps its words and its mark; the next one is whole.
    await expect(cut_answers(page)).to_have_count(1)
    await expect(cut_answers(page).locator("p")).to_have_text(WRITING)
    await expect(answers(page)).to_have_count(2)
    await no_violations(page)


@pytest.mark.parametrize("microphone_allowed", [False])
async def test_a_refused_microphone_is_explained_and_typing_still_works(store, page):
    assistant = ScriptedAssistant(audio_ack())
    await open_scripted_store(page, store, assistant)

    await mic(page).click()

    await expect(widget_error(page)).to_have_text(
        "The microphone is not available: allow it for this site in the browser, or type instead.")
    await expect(mic(page)).to_have_attribute("data-state", "ready")
    await expect(mic(page)).to_have_attribute("aria-pressed", "false")
    await expect(chat_input(page)).to_be_editable()
    await expect(page.locator(f"{WIDGET} button.send")).to_be_enabled()
    assert assistant.sent("AUDIO_STREAM") == []
