"""The demo store across reloads, tabs, later visits and the end of a session:
real Chromium, a real daphne process, the widget the store carries. The
offline agent runs "/tool <name> {json}" commands; the anthropic agent talks
through the real SDK to the fake Messages API, which plays the model. Each step's screenshot lands in test-artifacts/.

The widget keeps no copy of the conversation: after a reload it reads the
earlier messages back from the server, and an answer cut by the reload goes
on from the frames the server sends again."""
from __future__ import annotations

import json
import re
import threading

import pytest
from asgiref.sync import sync_to_async
from playwright.async_api import Page, WebSocketRoute, expect

from aitp.models import ConversationMessage, ToolCall
from tests.browser.conftest import eventually
from tests.browser.store_support import (
    WIDGET,
    answers,
    chat_input,
    ended_line,
    idle,
    notes,
    nothing_dropped,
    open_panel,
    open_store,
    result_data,
    say,
    send,
    status,
    tool_calls,
    tool_line,
    tool_results,
    widget_error,
    wire,
)
from tests.support.fake_anthropic import (
    JsonPiece,
    StreamedMessage,
    TextBlock,
    ToolUseBlock,
    text_response,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def log_entries(page: Page):
    """Everything the widget's log shows: messages, notes, tool lines."""
    return page.locator(f"{WIDGET} .log > *")


def messages(page: Page):
    """The log's messages, the visitor's and the agent's."""
    return page.locator(f"{WIDGET} .log > .msg")


async def entry_texts(page: Page) -> list[str]:
    """What the log shows, entry by entry."""
    return [text.strip() for text in await log_entries(page).all_inner_texts()]


async def message_texts(page: Page) -> list[str]:
    return [text.strip() for text in await messages(page).all_inner_texts()]


def send_button(page: Page):
    return page.locator(f"{WIDGET} .send")


def spoken(request: dict) -> list[str]:
    """The conversation's text blocks in a Messages API request, without the page's."""
    return [block["text"] for message in request["messages"] for block in message["content"]
            if block["type"] == "text" and not block["text"].startswith("[page]")]


# --- a reload, another tab, a later visit, the end of a session ---------------------------


async def test_a_reload_shows_the_conversation_again_and_the_session_goes_on(store, page, shot):
    await open_store(page, store)
    await say(page, '/tool open_product {"productId": "charging-dock"}')
    before = await message_texts(page)
    assert len(before) == 2
    first_session = await wire(page, "sessionId")

    await page.reload()

    # The panel stays open; the conversation is read back from the server.
    await expect(status(page)).to_have_text("Online")
    await expect(messages(page)).to_have_count(len(before))
    assert await message_texts(page) == before
    await expect(notes(page)).to_have_count(0)
    await shot("reloaded")
    assert await wire(page, "sessionId") == first_session
    answer = await say(page, "/tool open_cart")
    assert answer.startswith("open_cart succeeded.")
    assert await message_texts(page) == [*before, "/tool open_cart", answer]


async def test_a_tab_opened_with_a_copy_of_the_first_takes_the_conversation_and_the_first_says_so(
        store, page, shot):
    await open_store(page, store)
    await say(page, '/tool open_product {"productId": "charging-dock"}')
    before = await message_texts(page)
    session_id = await wire(page, "sessionId")
    # A duplicated tab starts with a copy of the first one's sessionStorage.
    storage = await page.evaluate("JSON.stringify(Object.assign({}, sessionStorage))")
    second = await page.context.new_page()
    await second.add_init_script(
        f"Object.entries(JSON.parse({json.dumps(storage)})).forEach(([k, v]) => sessionStorage.setItem(k, v));")

    await second.goto(page.url)

    await open_panel(second)
    await expect(status(second)).to_have_text("Online")
    assert await wire(second, "sessionId") == session_id
    await expect(messages(second)).to_have_count(len(before))
    assert await message_texts(second) == before
    await expect(notes(page).last).to_have_text("This conversation goes on in another tab or window.")
    await expect(status(page)).to_have_text("Offline")
    await expect(send_button(page)).to_be_disabled()
    await shot("first-tab-let-go")
    answer = await say(second, "/tool open_cart")
    assert answer.startswith("open_cart succeeded.")
    await second.close()


async def test_after_a_reload_the_conversation_is_read_back_once_and_the_model_is_asked_with_it(
        llm_store, model, page, shot):
    model.enqueue(text_response("Nice to meet you, Ada."), text_response("You are Ada."))
    await open_store(page, llm_store)
    assert await say(page, "My name is Ada.") == "Nice to meet you, Ada."

    await page.reload()

    await expect(messages(page)).to_have_count(2)
    assert await entry_texts(page) == ["My name is Ada.", "Nice to meet you, Ada."]
    await expect(status(page)).to_have_text("Online")
    await shot("read-back")
    answer = await say(page, "What is my name?")

    assert answer == "You are Ada."
    await shot("remembered")
    assert spoken(model.requests[-1]) == ["My name is Ada.", "Nice to meet you, Ada.", "What is my name?"]
    assert await entry_texts(page) == ["My name is Ada.", "Nice to meet you, Ada.", "What is my name?",
                                       "You are Ada."]
    await nothing_dropped(page)


LAST_VISIT = re.compile(r"Your last conversation, \w{3} \d{1,2}, \d{4}, \d{1,2}:\d\d\s?[AP]M\. "
                        r"The assistant remembers what you asked then\.")


async def test_a_later_visit_shows_the_last_conversation_and_the_assistant_remembers_it(
        llm_store, model, page):
    model.enqueue(text_response("Nice to meet you, Ada."), text_response("You are Ada."))
    await open_store(page, llm_store)
    assert await say(page, "My name is Ada.") == "Nice to meet you, Ada."
    first_session = await wire(page, "sessionId")
    await page.close()

    # A new tab of the same browser: a new session, the same visitor.
    later = await page.context.new_page()
    await open_store(later, llm_store)

    await expect(log_entries(later)).to_have_count(3)
    shown = await entry_texts(later)
    assert shown[1:] == ["My name is Ada.", "Nice to meet you, Ada."]
    await expect(log_entries(later).first).to_have_class("note earlier")
    assert LAST_VISIT.fullmatch(shown[0].replace("\u202f", " ")), shown[0]
    assert await wire(later, "sessionId") != first_session
    assert await say(later, "What is my name?") == "You are Ada."
    system = model.requests[-1]["system"][0]["text"]
    assert '"My name is Ada."' in system
    await nothing_dropped(later)


# A long answer the model writes slowly: word00 ... word79, one word a delta.
WORDS = [f"word{number:02d}" for number in range(80)]
WORD_DELTAS = [WORDS[0]] + [" " + word for word in WORDS[1:]]
LONG_ANSWER = "".join(WORD_DELTAS)
# The stream waits after this many deltas (after message_start,
# content_block_start and the first ping) until the test lets it go on.
DELTAS_BEFORE_THE_RELOAD = 20


class HeldMessages:
    """Routes a page's socket to the server, holding what the page sends until let_go()."""

    def __init__(self) -> None:
        self.held: list[str | bytes] = []
        self.server: WebSocketRoute | None = None
        self.going = False

    def route(self, ws: WebSocketRoute) -> None:
        self.server = ws.connect_to_server()
        ws.on_message(self.to_server)

    def to_server(self, message: str | bytes) -> None:
        if self.going:
            self.server.send(message)
        else:
            self.held.append(message)

    def let_go(self) -> None:
        self.going = True
        for message in self.held:
            self.server.send(message)


async def test_a_reload_mid_answer_completes_the_answer_once_shows_it_once_and_the_next_question_has_its_context(
        llm_store, model, page, shot):
    go_on = threading.Event()
    model.enqueue(
        StreamedMessage(blocks=[TextBlock(WORD_DELTAS)], event_delay=0.05, hold=go_on,
                        hold_after_events=3 + DELTAS_BEFORE_THE_RELOAD),
        text_response("The last word was word79."),
    )
    await open_store(page, llm_store)
    await send(page, "Tell me eighty words.")
    before = "".join(WORD_DELTAS[:DELTAS_BEFORE_THE_RELOAD])
    await expect(messages(page).last).to_have_text(before)
    await shot("half-an-answer")

    # The model goes on while the page reloads: some of what it writes reaches
    # no page, the rest reaches the reloaded one.
    go_on.set()
    await page.reload()

    await expect(answers(page)).to_have_count(1)
    await expect(answers(page)).to_have_text(LONG_ANSWER)
    await idle(page)
    await shot("the-whole-answer")
    # The question read back from the server, then the answer, once.
    assert await entry_texts(page) == ["Tell me eighty words.", LONG_ANSWER]
    # The reloaded page took up where the earlier one had got to: its ACK
    # carries the number of the last frame handled, and the rest of the
    # answer came after it, numbered on from there.
    frames = await wire(page, "frames")
    assert frames[0]["type"] == "HANDSHAKE_ACK" and frames[0]["payload"]["resumed"] is True
    start = frames[0]["meta"]["seq"]
    assert start > 0
    numbers = [f["meta"]["seq"] for f in frames[1:]]
    assert numbers == list(range(start + 1, start + 1 + len(numbers)))
    assert any(f["type"] == "AGENT_RESPONSE" and not f["payload"]["done"] for f in frames)
    assert await wire(page, "repeated") == 0

    answer = await say(page, "Which word came last?")

    assert answer == "The last word was word79."
    assert len(model.requests) == 2
    assert spoken(model.requests[-1]) == ["Tell me eighty words.", LONG_ANSWER, "Which word came last?"]
    assert await entry_texts(page) == ["Tell me eighty words.", LONG_ANSWER, "Which word came last?",
                                       "The last word was word79."]
    await nothing_dropped(page)


async def test_a_reload_mid_answer_whose_turn_ends_before_the_reloaded_page_connects_shows_the_answer_once(
        llm_store, model, page, shot):
    go_on = threading.Event()
    model.enqueue(StreamedMessage(blocks=[TextBlock(WORD_DELTAS)], hold=go_on,
                                  hold_after_events=3 + DELTAS_BEFORE_THE_RELOAD))
    await open_store(page, llm_store)
    await send(page, "Tell me eighty words.")
    await expect(messages(page).last).to_have_text("".join(WORD_DELTAS[:DELTAS_BEFORE_THE_RELOAD]))

    # The reloaded page's handshake waits until the turn ended and was kept:
    # the server then holds the whole answer, and sends the page the frames
    # it missed.
    handshake = HeldMessages()
    await page.route_web_socket(re.compile(r"/owllayer\?"), handshake.route)
    await page.reload()
    await eventually(lambda: handshake.held, what="the reloaded page's handshake")
    go_on.set()
    await eventually(lambda: ConversationMessage.objects.filter(role="assistant").aexists(),
                     what="the turn to end")
    handshake.let_go()

    await expect(answers(page)).to_have_count(1)
    await idle(page)
    await shot("the-whole-answer-once")
    assert await entry_texts(page) == ["Tell me eighty words.", LONG_ANSWER]
    frames = await wire(page, "frames")
    assert frames[0]["type"] == "HANDSHAKE_ACK" and frames[0]["payload"]["resumed"] is True
    assert any(f["type"] == "AGENT_RESPONSE" and f["payload"]["done"] for f in frames)
    await nothing_dropped(page)


async def test_a_tool_call_made_while_the_page_reloads_is_run_once_by_the_reloaded_page(
        llm_store, model, page, shot):
    go_on = threading.Event()
    model.enqueue(
        # The words before the call, then the stream waits before the call.
        StreamedMessage(blocks=[TextBlock(["Let me ", "open ", "your cart."]),
                                ToolUseBlock("toolu_fake_cart", "open_cart", {}, [JsonPiece("{}")])],
                        stop_reason="tool_use", hold=go_on, hold_after_events=3 + 3),
        text_response("Here is your cart."),
    )
    await open_store(page, llm_store)
    await send(page, "Show me my cart.")
    await expect(messages(page).last).to_have_text("Let me open your cart.")

    # The reloaded page's handshake waits until the call was made: the
    # server sends it to no socket, then again to the new one.
    handshake = HeldMessages()
    await page.route_web_socket(re.compile(r"/owllayer\?"), handshake.route)
    await page.reload()
    await eventually(lambda: handshake.held, what="the reloaded page's handshake")
    go_on.set()
    await eventually(lambda: ToolCall.objects.filter(name="open_cart").aexists(), what="the call")
    handshake.let_go()

    # The answer after the call is the only one drawn live (those read back are not counted).
    await expect(answers(page)).to_have_count(1)
    await idle(page)
    await expect(page.locator("h1")).to_have_text("Your cart")
    await expect(page.locator(f"{WIDGET} .tool[data-tool=open_cart]")).to_have_count(1)
    await expect(tool_line(page, "open_cart")).to_have_attribute("data-status", "done")
    await shot("the-call-after-the-reload")
    # The words before the call once, above the call's line; the rest below it.
    assert await entry_texts(page) == [
        "Show me my cart.", "Let me open your cart.", "Done: Open cart", "Here is your cart."]
    [call] = await tool_calls("open_cart")
    assert call.status == ToolCall.Status.SUCCESS
    assert [f["type"] for f in await wire(page, "frames")].count("TOOL_CALL") == 1
    [result] = tool_results(model.requests[-1])
    assert result_data(result)["url"] == "/demo/cart/"
    await nothing_dropped(page)


class LosesAQuestion:
    """Routes a page's sockets to the server; once ``losing``, the next
    question (USER_INPUT) is lost on its way, as a network that drops takes it."""

    def __init__(self) -> None:
        self.losing = False
        self.lost: list[dict] = []
        self.questions: list[dict] = []

    def route(self, ws: WebSocketRoute) -> None:
        server = ws.connect_to_server()

        def to_server(message: str | bytes) -> None:
            sent = json.loads(message) if isinstance(message, str) else {}
            if sent.get("type") == "USER_INPUT":
                if self.losing:
                    self.losing = False
                    self.lost.append(sent)
                    return
                self.questions.append(sent)
            server.send(message)

        ws.on_message(to_server)


@pytest.fixture(params=["held", "not-held"])
def holding_store(request, daphne_factory):
    """The store (offline agent) on a process that holds a session past its
    socket (protocol.md §3a), or one that does not (the session goes on
    from the database)."""
    from tests.browser.conftest import print_logs, start_store

    env = {"OWLLAYER_LLM": "offline"}
    if request.param == "not-held":
        env["OWLLAYER_RESUME_HOLD_SECONDS"] = "0"
    started = start_store(daphne_factory, env)
    started.held = request.param == "held"
    yield started
    print_logs(started)


async def test_a_question_lost_on_its_way_just_before_a_reload_is_asked_again_and_answered_once(
        holding_store, page, shot):
    network = LosesAQuestion()
    await page.route_web_socket(re.compile(r"/owllayer\?"), network.route)
    await open_store(page, holding_store)
    first_answer = await say(page, '/tool open_product {"productId": "charging-dock"}')
    network.losing = True
    await send(page, "/tool open_cart")
    await eventually(lambda: network.lost, what="the question lost on its way")
    [lost] = network.lost

    await page.reload()

    if holding_store.held:
        # The session goes on: the reloaded page sends the question again, as
        # it was. (The answers read back from the server are not counted.)
        await expect(answers(page)).to_have_count(1)
        await expect(page.locator("h1")).to_have_text("Your cart")
        await idle(page)
        await shot("asked-again-after-the-reload")
        texts = await entry_texts(page)
        # The question once, then its answer once.
        assert texts[:4] == ['/tool open_product {"productId": "charging-dock"}', first_answer,
                             "/tool open_cart", "Done: Open cart"], texts
        assert texts[4].startswith("open_cart succeeded.") and len(texts) == 5, texts
        ack = (await wire(page, "frames"))[0]
        assert ack["type"] == "HANDSHAKE_ACK" and ack["payload"]["resumed"] is True
        # It named the question the session took last: the one before.
        assert ack["meta"]["lastInput"] == network.questions[0]["id"]
        assert network.questions[1] == lost
        assert len(await tool_calls("open_cart")) == 1
    else:
        # A session that does not take up where the page was: nothing is sent
        # again, a note says so and the visitor sends it again.
        await expect(notes(page).last).to_have_text(
            "Your message \u201c/tool open_cart\u201d was not answered. Please send it again.")
        await expect(status(page)).to_have_text("Online")
        await shot("not-answered-after-the-reload")
        assert network.questions[1:] == []
        await send(page, "/tool open_cart")
        await expect(answers(page)).to_have_count(1)
        await expect(page.locator("h1")).to_have_text("Your cart")
        await idle(page)
        assert network.questions[1]["id"] != lost["id"]
        assert [text for text in await message_texts(page) if text == "/tool open_cart"] == ["/tool open_cart"]
        assert len(await tool_calls("open_cart")) == 1
    assert await wire(page, "unanswered") == (0 if holding_store.held else 1)
    await nothing_dropped(page)


async def test_when_an_operator_ends_the_session_the_goodbye_is_a_notice_and_typing_stops(
        store, page, shot):
    import httpx

    from tests.support.people import admin_sign_in, make_user

    def operator() -> None:
        user = make_user("olga", tenant=store.key.tenant)
        user.set_password("pw-olga-123")
        user.save()

    await sync_to_async(operator)()
    await open_store(page, store)
    session_id = await wire(page, "sessionId")

    async with httpx.AsyncClient(base_url=store.server.http_url) as http:
        await admin_sign_in(http, "olga", "pw-olga-123")
        sent = await http.post(f"/admin/live/{session_id}/command/", data={
            "command": "end", "message": "Thanks for shopping with us. Goodbye!",
            "csrfmiddlewaretoken": http.cookies["csrftoken"]})
        assert sent.status_code == 302

    await expect(status(page)).to_have_text("Offline")
    await expect(notes(page).last).to_have_text("Thanks for shopping with us. Goodbye!")
    await expect(widget_error(page)).to_be_hidden()
    await expect(send_button(page)).to_be_disabled()
    # Nothing typed could be sent any more: the box says so instead of taking words that go nowhere.
    await expect(chat_input(page)).to_be_disabled()
    await expect(chat_input(page)).to_have_attribute(
        "placeholder", "This conversation has ended. Reload the page to start another.")
    await expect(chat_input(page)).to_be_hidden()
    await expect(ended_line(page)).to_have_text("This conversation has ended. Reload the page to start another.")
    await expect(ended_line(page)).to_be_visible()
    await shot("ended-by-an-operator")
    assert await page.evaluate("OwlLayer.send('Are you there?')") is False
    await expect(messages(page)).to_have_count(0)
    assert [f["type"] for f in await wire(page, "sent")].count("USER_INPUT") == 0
    assert await wire(page, "state") == "closed"
