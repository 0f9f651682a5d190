"""The in-page client's wire behaviour, in real Chromium, against a scripted
server: what it sends, what it drops, when it reconnects (docs/protocol.md),
and what it tells the page: the agent's activity and each tool call."""
from __future__ import annotations

import json
import re

import pytest
from jsonschema import Draft202012Validator
from playwright.async_api import expect

from aitp.close_codes import FINAL_CODES
from aitp.wire_schema import frame_schema, load
from tests.browser.conftest import (
    CLIENT_PATH,
    FakeConnection,
    ack,
    eventually,
    frame,
    module_page,
    open_client_page,
)

pytestmark = [pytest.mark.browser]

ADD_TO_CART = {
    "name": "add_to_cart",
    "description": "Add the product to the cart",
    "parameters": {"type": "OBJECT", "properties": {"quantity": {"type": "NUMBER"}},
                   "required": ["quantity"]},
    "risk": "low",
}
RECORD_EVENTS = (
    "window.errors = []; window.retries = []; window.states = [];"
    "client.on('error', (e) => window.errors.push(e.message));"
    "client.on('state', (s) => { window.states.push(s);"
    " if (s === 'reconnecting') window.retries.push(window.__owl.retryInMs); });"
)


async def acknowledge(connection: FakeConnection) -> None:
    await connection.recv_type("HANDSHAKE_INIT")
    await connection.send(ack())


def sent(connection: FakeConnection, type_: str) -> list[dict]:
    return [message for message in connection.received if message["type"] == type_]


async def test_sends_the_handshake_at_open_and_one_full_context_snapshot_after_the_ack(fake_server, page):
    fake = await fake_server(acknowledge)
    setup = (
        f"client.registerTool({json.dumps(ADD_TO_CART)}, () => ({{added: true}}));"
        "client.setContext({page: 'product_detail', price: 149.99});"
    )
    await open_client_page(page, fake, setup)
    await eventually(lambda: len(fake.connections) == 1 and sent(fake.connections[0], "CONTEXT_UPDATE"),
                     what="the first context update")
    connection = fake.connections[0]

    assert connection.query == {"apiKey": ["pk_live_fake"]}
    init = connection.received[0]
    assert init["type"] == "HANDSHAKE_INIT"
    assert re.fullmatch(r"msg_[0-9a-f-]{36}", init["id"])
    assert isinstance(init["timestamp"], int)
    assert set(init["payload"]) == {"apiKey", "userAgent", "viewport", "sdkVersion", "protocolVersion",
                                    "resume"}
    # A first socket offers to continue its session later, with no token yet.
    assert init["payload"]["resume"] == {}
    assert init["payload"]["apiKey"] == "pk_live_fake"
    assert init["payload"]["sdkVersion"] == "0.4.0"
    assert init["payload"]["protocolVersion"] == "1.0.0"
    assert init["payload"]["viewport"] == "1280x800"
    # The tool and the context were set before the ACK: one snapshot, not two.
    updates = sent(connection, "CONTEXT_UPDATE")
    assert len(updates) == 1
    assert updates[0]["payload"] == {
        "url": "/shop/headphones",
        "title": "Pro Headphones - Store",
        "activeTools": [ADD_TO_CART],
        "context": {"page": "product_detail", "price": 149.99},
    }
    assert await page.evaluate("window.__owl.state") == "connected"


# Frames the deployed client drops, and frames it keeps (unknown keys are stripped).
DROPPED = [
    ack(maxActiveTools=0),
    frame("SYSTEM_EVENT", {"kind": "error", "message": None}),
    frame("SYSTEM_EVENT", {"kind": "error", "message": "boom"}, meta=None),
    frame("SYSTEM_EVENT", {"kind": "shutdown", "message": "bye"}),
    frame("TOOL_CALL", {"callId": "tc_1", "name": "add_to_cart", "args": []}),
    frame("APPROVAL_REQUEST", {"callId": "tc_2", "toolName": "pay", "risk": "critical",
                               "args": {}, "message": ""}),
    frame("USER_INPUT", {"modality": "text", "content": "a client frame"}),
    frame("AGENT_RESPONSE", {"chunk": "x", "done": "true"}),
    frame("AGENT_RESPONSE", {"chunk": "x", "done": True}, timestamp="now"),
    frame("AGENT_RESPONSE", {"chunk": "x", "done": True}, id=""),
    "not json",
]
KEPT = [
    ack(maxActiveTools=2, region="eu"),
    frame("SYSTEM_EVENT", {"kind": "waiting", "message": "hold on", "data": {"code": "x"}, "extra": 1}),
    frame("TOOL_CALL", {"callId": "tc_1", "name": "add_to_cart", "args": {"quantity": 2}}),
    frame("APPROVAL_REQUEST", {"callId": "tc_2", "toolName": "pay", "risk": "critical",
                               "args": {}, "message": "Pay?"}),
    frame("AGENT_RESPONSE", {"chunk": "x", "done": True}, meta={"sessionId": "ses_fake"}),
    frame("AUDIO_STREAM", {"data": "AAAA", "mimeType": "audio/pcm;rate=24000"}),
    frame("VOICE_STATE_EVENT", {"event": "interrupted", "reason": "barge_in"}),
]


def schema_accepts(text: str) -> bool:
    """Whether the protocol's JSON Schema (the file aitp_client validates
    with) takes ``text`` for a frame a server sends."""
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return SERVER_FRAME.is_valid(value)


SERVER_FRAME = Draft202012Validator(frame_schema(load(), "ServerFrame"))


async def test_drops_every_invalid_frame_silently_and_counts_it(fake_server, page):
    invalid = DROPPED

    async def script(connection: FakeConnection) -> None:
        await connection.recv_type("HANDSHAKE_INIT")
        for text in invalid:
            await connection.send(text)
        # Unknown keys are stripped, never a reason to drop.
        for text in KEPT[:2]:
            await connection.send(text)

    fake = await fake_server(script)
    tools = [dict(ADD_TO_CART, name=name) for name in ("one", "two", "three")]
    setup = "".join(f"client.registerTool({json.dumps(tool)}, () => null);" for tool in tools)
    await open_client_page(page, fake, RECORD_EVENTS + setup)
    await eventually(lambda: fake.connections and sent(fake.connections[0], "CONTEXT_UPDATE"),
                     what="the context update after the valid ack")
    await eventually(lambda: page.evaluate("window.__owl.frames.length === 2"), what="two valid frames")

    owl = await page.evaluate("window.__owl")
    assert owl["dropped"] == len(invalid)
    assert [f["type"] for f in owl["frames"]] == ["HANDSHAKE_ACK", "SYSTEM_EVENT"]
    assert "region" not in owl["frames"][0]["payload"]
    assert owl["state"] == "connected"
    # Nothing of the dropped frames happened: no error shown, no tool answered.
    assert await page.evaluate("window.errors") == []
    connection = fake.connections[0]
    assert sent(connection, "TOOL_RESULT") == []
    # The ACK's maxActiveTools applies to the registry.
    names = [tool["name"] for tool in sent(connection, "CONTEXT_UPDATE")[0]["payload"]["activeTools"]]
    assert names == ["one", "two"]


async def test_a_navigating_tool_sends_the_new_pages_context_before_its_result(fake_server, page):
    fake = await fake_server(acknowledge)
    pay = {"name": "pay", "description": "Pay", "risk": "critical"}
    setup = (
        "client.registerTool({name: 'go_to_cart', description: 'Open the cart'}, () => {"
        "  history.pushState({}, '', '/shop/cart'); document.title = 'Cart';"
        "  client.unregisterTool('go_to_cart');"
        f"  client.registerTool({json.dumps(pay)}, () => null);"
        "  client.setContext({page: 'cart'});"
        "  return {url: location.pathname};"
        "});"
    )
    await open_client_page(page, fake, setup)
    await eventually(lambda: fake.connections and sent(fake.connections[0], "CONTEXT_UPDATE"),
                     what="the first context update")
    connection = fake.connections[0]
    await connection.send(frame("TOOL_CALL", {"callId": "tc_nav", "name": "go_to_cart", "args": {}}))
    await eventually(lambda: sent(connection, "TOOL_RESULT"), what="the tool result")

    after = [m for m in connection.received if m["type"] in ("CONTEXT_UPDATE", "TOOL_RESULT")][1:]
    assert [m["type"] for m in after] == ["CONTEXT_UPDATE", "TOOL_RESULT"]
    assert after[0]["payload"] == {
        "url": "/shop/cart", "title": "Cart", "activeTools": [pay], "context": {"page": "cart"},
    }
    assert after[1]["payload"] == {"callId": "tc_nav", "status": "success", "result": {"url": "/shop/cart"}}


async def test_a_context_change_just_before_a_message_reaches_the_server_first(fake_server, page):
    fake = await fake_server(acknowledge)
    await open_client_page(page, fake)
    await eventually(lambda: fake.connections and sent(fake.connections[0], "CONTEXT_UPDATE"),
                     what="the first context update")
    connection = fake.connections[0]

    await page.evaluate("client.setContext({step: 2}); client.sendText('next')")

    await eventually(lambda: sent(connection, "USER_INPUT"), what="the user input")
    kinds = [m["type"] for m in connection.received if m["type"] in ("CONTEXT_UPDATE", "USER_INPUT")]
    assert kinds == ["CONTEXT_UPDATE", "CONTEXT_UPDATE", "USER_INPUT"]
    assert sent(connection, "CONTEXT_UPDATE")[1]["payload"]["context"] == {"step": 2}


async def test_unknown_tools_bad_arguments_and_failing_handlers_come_back_as_errors(fake_server, page):
    fake = await fake_server(acknowledge)
    setup = (
        "window.calls = 0;"
        f"client.registerTool({json.dumps(ADD_TO_CART)}, (args) => {{"
        "  window.calls += 1; if (args.quantity > 5) throw new Error('only 5 left'); return null; });"
    )
    await open_client_page(page, fake, setup)
    await eventually(lambda: fake.connections and sent(fake.connections[0], "CONTEXT_UPDATE"),
                     what="the first context update")
    connection = fake.connections[0]
    calls = [
        ("tc_unknown", "fly", {}),
        ("tc_args", "add_to_cart", {"quantity": "two"}),
        ("tc_missing", "add_to_cart", {}),
        ("tc_throws", "add_to_cart", {"quantity": 9}),
        ("tc_ok", "add_to_cart", {"quantity": 1}),
    ]
    for call_id, name, args in calls:
        await connection.send(frame("TOOL_CALL", {"callId": call_id, "name": name, "args": args}))
    await eventually(lambda: len(sent(connection, "TOOL_RESULT")) == len(calls), what="five results")

    results = {m["payload"]["callId"]: m["payload"] for m in sent(connection, "TOOL_RESULT")}
    assert results["tc_unknown"] == {"callId": "tc_unknown", "status": "error", "result": None,
                                     "error": "unknown tool: fly"}
    assert results["tc_args"]["status"] == "error"
    assert "args.quantity must be number" in results["tc_args"]["error"]
    assert "args.quantity is required" in results["tc_missing"]["error"]
    assert results["tc_throws"] == {"callId": "tc_throws", "status": "error", "result": None,
                                    "error": "only 5 left"}
    assert results["tc_ok"] == {"callId": "tc_ok", "status": "success", "result": None}
    # The handler never ran for the calls that failed validation.
    assert await page.evaluate("window.calls") == 2


async def test_a_critical_tool_waits_for_the_dialog_and_a_decline_never_runs_it(fake_server, page):
    fake = await fake_server(acknowledge)
    setup = (
        "window.paid = 0;"
        "client.registerTool({name: 'process_payment', description: 'Pay', risk: 'critical',"
        "  parameters: {type: 'OBJECT', properties: {amount: {type: 'NUMBER'}}, required: ['amount']},"
        "  approvalMessage: (args) => 'Pay ' + args.amount.toFixed(2) + ' USD?'},"
        "  (args) => { window.paid += 1; return {paid: true, amount: args.amount}; });"
    )
    await open_client_page(page, fake, setup)
    await eventually(lambda: fake.connections and sent(fake.connections[0], "CONTEXT_UPDATE"),
                     what="the first context update")
    connection = fake.connections[0]
    dialog = page.locator("dialog#owl-approval")

    await connection.send(frame("TOOL_CALL", {"callId": "tc_pay1", "name": "process_payment",
                                              "args": {"amount": 10}}))
    await expect(dialog).to_be_visible()
    await expect(dialog).to_contain_text("Pay 10.00 USD?")
    request = sent(connection, "APPROVAL_REQUEST")
    assert [m["payload"] for m in request] == [{
        "callId": "tc_pay1", "toolName": "process_payment", "risk": "critical",
        "args": {"amount": 10}, "message": "Pay 10.00 USD?",
    }]
    await dialog.get_by_role("button", name="Decline").click()
    await eventually(lambda: sent(connection, "APPROVAL_RESPONSE"), what="the decline")
    assert sent(connection, "APPROVAL_RESPONSE")[0]["payload"] == {
        "callId": "tc_pay1", "approved": False, "error": "Action denied by user",
    }
    await expect(dialog).to_have_count(0)

    await connection.send(frame("TOOL_CALL", {"callId": "tc_pay2", "name": "process_payment",
                                              "args": {"amount": 10}}))
    await dialog.get_by_role("button", name="Approve").click()
    await eventually(lambda: len(sent(connection, "APPROVAL_RESPONSE")) == 2, what="the approval")
    assert sent(connection, "APPROVAL_RESPONSE")[1]["payload"] == {
        "callId": "tc_pay2", "approved": True, "result": {"paid": True, "amount": 10},
    }
    # An approval replaces the TOOL_RESULT: none was ever sent.
    assert sent(connection, "TOOL_RESULT") == []
    assert await page.evaluate("window.paid") == 1


async def test_a_dialog_whose_connection_drops_goes_away_unanswered_and_its_tool_never_runs(fake_server, page):
    fake = await fake_server(acknowledge)
    setup = (
        "window.paid = 0;"
        "client.registerTool({name: 'process_payment', description: 'Pay', risk: 'critical',"
        "  parameters: {type: 'OBJECT', properties: {amount: {type: 'NUMBER'}}, required: ['amount']}},"
        "  () => { window.paid += 1; return {paid: true}; });"
    )
    await open_client_page(page, fake, setup)
    await eventually(lambda: fake.connections and sent(fake.connections[0], "CONTEXT_UPDATE"),
                     what="the first context update")
    first = fake.connections[0]
    dialog = page.locator("dialog#owl-approval")
    await first.send(frame("TOOL_CALL", {"callId": "tc_pay1", "name": "process_payment", "args": {"amount": 10}}))
    await expect(dialog).to_be_visible()

    await first.ws.close(1001, "going away")

    await expect(dialog).to_have_count(0)
    await eventually(lambda: len(fake.connections) == 2, what="the next connection")
    second = fake.connections[1]
    await eventually(lambda: sent(second, "CONTEXT_UPDATE"), what="the next connection's context")
    assert sent(first, "APPROVAL_RESPONSE") == [] and sent(second, "APPROVAL_RESPONSE") == []
    assert sent(second, "TOOL_RESULT") == []
    assert await page.evaluate("window.paid") == 0


async def test_a_server_side_approval_is_answered_from_the_dialog(fake_server, page):
    fake = await fake_server(acknowledge)
    await open_client_page(page, fake)
    await eventually(lambda: fake.connections and sent(fake.connections[0], "CONTEXT_UPDATE"),
                     what="the first context update")
    connection = fake.connections[0]
    for call_id in ("srv_1", "srv_2"):
        await connection.send(frame("APPROVAL_REQUEST", {
            "callId": call_id, "toolName": "cancel_order", "risk": "high",
            "args": {"number": "A1003"}, "message": "Cancel order A1003?",
        }))
    dialog = page.locator("dialog#owl-approval")
    # One dialog at a time: the second waits for the first.
    await expect(dialog).to_have_count(1)
    await expect(dialog).to_contain_text("Cancel order A1003?")
    await dialog.get_by_role("button", name="Approve").click()
    await expect(dialog).to_have_attribute("data-call-id", "srv_2")
    await dialog.get_by_role("button", name="Decline").click()
    await eventually(lambda: len(sent(connection, "APPROVAL_RESPONSE")) == 2, what="two answers")
    assert [m["payload"] for m in sent(connection, "APPROVAL_RESPONSE")] == [
        {"callId": "srv_1", "approved": True},
        {"callId": "srv_2", "approved": False, "error": "Action denied by user"},
    ]


async def test_deltas_are_appended_and_the_final_frame_carries_the_whole_text(fake_server, page):
    fake = await fake_server(acknowledge)
    await open_client_page(page, fake, RECORD_EVENTS)
    await eventually(lambda: fake.connections and sent(fake.connections[0], "CONTEXT_UPDATE"),
                     what="the first context update")
    connection = fake.connections[0]
    assert await page.evaluate("client.sendText('hello')") is True
    await eventually(lambda: sent(connection, "USER_INPUT"), what="the user input")
    assert sent(connection, "USER_INPUT")[0]["payload"] == {"modality": "text", "content": "hello"}
    assert await page.evaluate("window.__owl.state") == "thinking"

    for chunk, done in (("Hel", False), ("lo", False), ("Hello there.", True),
                        ("Partial", False), ("", True)):
        await connection.send(frame("AGENT_RESPONSE", {"chunk": chunk, "done": done}))
    await eventually(lambda: page.evaluate("window.agentEvents.length === 5"), what="five agent events")
    assert await page.evaluate("window.agentEvents") == [
        {"text": "Hel", "done": False},
        {"text": "Hello", "done": False},
        {"text": "Hello there.", "done": True},
        {"text": "Partial", "done": False},
        # An empty closing frame keeps what the deltas built.
        {"text": "Partial", "done": True},
    ]
    assert await page.evaluate("window.__owl.state") == "connected"


async def test_without_an_ack_it_closes_with_4000_and_tries_again(fake_server, page):
    async def silent(connection: FakeConnection) -> None:
        await connection.recv_type("HANDSHAKE_INIT")

    fake = await fake_server(silent)
    await open_client_page(page, fake, RECORD_EVENTS)
    # 5 s handshake timeout, then 2 s before the second attempt.
    await eventually(lambda: len(fake.connections) == 2, timeout=30, what="a second connection")
    first = fake.connections[0]
    assert (first.close_code, first.close_reason) == (4000, "Handshake timeout")
    assert await page.evaluate("window.errors") == ["Handshake timeout"]
    assert await page.evaluate("window.retries") == [2000]
    await eventually(lambda: fake.connections[1].received, what="the second handshake")
    assert fake.connections[1].received[0]["type"] == "HANDSHAKE_INIT"


@pytest.mark.parametrize("code", sorted(FINAL_CODES))
async def test_a_policy_close_is_permanent_and_shows_the_reason(fake_server, page, code):
    async def refuse(connection: FakeConnection) -> None:
        await connection.recv_type("HANDSHAKE_INIT")
        await connection.ws.close(code, "no entry")

    fake = await fake_server(refuse)
    await open_client_page(page, fake, RECORD_EVENTS)
    await eventually(lambda: page.evaluate("window.__owl.closes.length === 1"), what="the close")
    owl = await page.evaluate("window.__owl")
    assert owl["closes"] == [{"code": code, "reason": "no entry"}]
    # The decision is taken in the close handler: no retry is scheduled.
    assert owl["state"] == "error"
    assert owl["retryInMs"] is None
    assert await page.evaluate("window.retries") == []
    assert await page.evaluate("window.errors") == ["no entry"]


@pytest.mark.parametrize("code", [1000, 1001, 1013, 4001])
async def test_other_closes_reconnect_after_two_seconds(fake_server, page, code):
    async def close_first(connection: FakeConnection) -> None:
        await connection.recv_type("HANDSHAKE_INIT")
        if len(fake.connections) == 1:
            await connection.ws.close(code, "later")
        else:
            await connection.send(ack())

    fake = await fake_server(close_first)
    await open_client_page(page, fake, RECORD_EVENTS)
    await eventually(lambda: page.evaluate("window.__owl.state === 'connected'"), what="the reconnect")
    assert len(fake.connections) == 2
    assert await page.evaluate("window.retries") == [2000]


async def test_the_next_socket_of_the_tab_offers_the_token_its_last_ack_gave(fake_server, page):
    async def continue_each(connection: FakeConnection) -> None:
        init = await connection.recv_type("HANDSHAKE_INIT")
        number = len(fake.connections)
        await connection.send(ack(resumeToken=f"ses_fake.token{number}", resumed=number > 1))
        if number == 1:
            await connection.ws.close(1001, "going away")
        connection.offered = init["payload"]["resume"]

    fake = await fake_server(continue_each)
    await open_client_page(page, fake, "window.connects = []; client.on('connected', (e) => window.connects.push(e));")
    await eventually(lambda: len(fake.connections) == 2 and hasattr(fake.connections[1], "offered"),
                     what="the second socket")
    await page.reload()  # the same tab: its sessionStorage is kept
    await eventually(lambda: len(fake.connections) == 3 and hasattr(fake.connections[2], "offered"),
                     what="the socket after the reload")

    assert [c.offered for c in fake.connections] == [{}, {"token": "ses_fake.token1"},
                                                     {"token": "ses_fake.token2"}]
    # Frames without numbers: the session went on, but nothing says from where.
    assert await page.evaluate("window.connects") == [{"sessionId": "ses_fake", "resumed": True,
                                                       "continued": False}]


async def test_a_final_close_forgets_the_token(fake_server, page):
    async def refuse_later(connection: FakeConnection) -> None:
        await connection.recv_type("HANDSHAKE_INIT")
        await connection.send(ack(resumeToken="ses_fake.token", resumed=False))
        await connection.ws.close(1008, "ended by an operator")

    fake = await fake_server(refuse_later)
    await open_client_page(page, fake)
    await eventually(lambda: page.evaluate("window.__owl.closes.length === 1"), what="the close")

    assert await page.evaluate("Object.keys(sessionStorage).filter((k) => k.startsWith('owllayer-resume'))") == []


# --- numbered frames: a turn goes on across a drop and a reload (protocol.md §3a) ---

RECORD_CONNECTS = "window.connects = []; client.on('connected', (e) => window.connects.push(e));"
RESUME_KEY = "'owllayer-resume:' + client.endpoint"


def numbered(text: str, seq: int, **meta) -> str:
    """A frame as the server sends it to a client that offered to resume
    (``meta``: more of its meta, an ACK's ``lastInput``)."""
    body = json.loads(text)
    body["meta"] = {"seq": seq, **meta}
    return json.dumps(body)


def answer(chunk: str, done: bool, seq: int) -> str:
    return numbered(frame("AGENT_RESPONSE", {"chunk": chunk, "done": done}), seq)


async def offered(connection: FakeConnection) -> dict:
    """Read the handshake; keep what it offered to continue as connection.offered."""
    init = await connection.recv_type("HANDSHAKE_INIT")
    connection.offered = init["payload"]["resume"]
    return connection.offered


async def stored_resume(page) -> dict | None:
    return await page.evaluate(f"JSON.parse(sessionStorage.getItem({RESUME_KEY}))")


async def test_the_next_socket_and_the_one_after_a_reload_offer_the_last_frame_handled_and_the_answer_goes_on(
        fake_server, page):
    async def script(connection: FakeConnection) -> None:
        await offered(connection)
        number = len(fake.connections)
        if number == 1:
            await connection.send(numbered(ack(resumeToken="ses_fake.token1", resumed=False), 0))
            question.update(await connection.recv_type("USER_INPUT"))
            await connection.send(answer("Hel", False, 1))
            await connection.send(answer("lo", False, 2))
            await connection.ws.close(1001, "going away")
        elif number == 2:
            # The same process: it takes up at the number offered, and took the question.
            await connection.send(numbered(ack(resumeToken="ses_fake.token2", resumed=True), 2,
                                           lastInput=question["id"]))
            await connection.send(answer(" there", False, 3))
        else:
            await connection.send(numbered(ack(resumeToken="ses_fake.token3", resumed=True), 3,
                                           lastInput=question["id"]))
            await connection.send(answer("", True, 4))

    question: dict = {}

    fake = await fake_server(script)
    await open_client_page(page, fake, RECORD_EVENTS + RECORD_CONNECTS)
    await eventually(lambda: page.evaluate("window.__owl.state === 'connected'"), what="the first ack")
    assert await page.evaluate("client.sendText('hello')") is True
    await eventually(lambda: page.evaluate("window.__owl.lastSeq === 3"), what="the frame after the reconnect")

    assert await page.evaluate("window.agentEvents") == [
        {"text": "Hel", "done": False}, {"text": "Hello", "done": False},
        {"text": "Hello there", "done": False},
    ]
    # The turn that goes on, as the page last showed it: its question and its text so far.
    assert await page.evaluate("window.connects") == [
        {"sessionId": "ses_fake", "resumed": False, "continued": False},
        {"sessionId": "ses_fake", "resumed": True, "continued": True, "turn": {"question": "hello", "text": "Hello"}},
    ]
    # The turn the drop cut goes on: still thinking.
    assert await page.evaluate("window.__owl.state") == "thinking"
    # With the question whose turn goes on, whole.
    assert await stored_resume(page) == {"token": "ses_fake.token2", "lastSeq": 3, "text": "Hello there",
                                         "busy": True, "input": question}

    await page.reload()  # the same tab: its sessionStorage is kept
    await eventually(lambda: page.evaluate("window.agentEvents.length === 1"), what="the end of the answer")

    assert [c.offered for c in fake.connections] == [
        {}, {"token": "ses_fake.token1", "lastSeq": 2}, {"token": "ses_fake.token2", "lastSeq": 3},
    ]
    # The reloaded page is told the whole answer, not only what came after the reload.
    assert await page.evaluate("window.agentEvents") == [{"text": "Hello there", "done": True}]
    assert await page.evaluate("window.connects") == [
        {"sessionId": "ses_fake", "resumed": True, "continued": True,
         "turn": {"question": "hello", "text": "Hello there"}},
    ]
    assert await page.evaluate("window.states") == ["connecting", "thinking", "connected"]
    assert await stored_resume(page) == {"token": "ses_fake.token3", "lastSeq": 4, "text": "", "busy": False}
    # The session had taken the question: it was never sent again.
    assert [len(sent(c, "USER_INPUT")) for c in fake.connections] == [1, 0, 0]


async def test_a_numbered_frame_the_tab_already_handled_is_not_emitted_or_run_again(fake_server, page):
    call = numbered(frame("TOOL_CALL", {"callId": "tc_1", "name": "add_to_cart", "args": {"quantity": 1}}), 1)
    said = answer("Added", False, 2)

    async def script(connection: FakeConnection) -> None:
        await offered(connection)
        if len(fake.connections) == 1:
            await connection.send(numbered(ack(resumeToken="ses_fake.token1", resumed=False), 0))
            await connection.send(call)
            await connection.send(said)
            await connection.recv_type("TOOL_RESULT")
            await connection.ws.close(1001, "going away")
        else:
            await connection.send(numbered(ack(resumeToken="ses_fake.token2", resumed=True), 2))
            # Sent again: twice what the tab handled before the drop, once what it just handled.
            for text in (call, said, answer("Added.", True, 3), answer("Added.", True, 3)):
                await connection.send(text)

    fake = await fake_server(script)
    setup = "window.calls = 0;" + register(ADD_TO_CART, "() => { window.calls += 1; return null; }")
    await open_client_page(page, fake, RECORD_EVENTS + setup)
    await eventually(lambda: page.evaluate("window.__owl.repeated === 3"), timeout=20, what="three repeats")

    assert await page.evaluate("window.calls") == 1
    assert len(sent(fake.connections[0], "TOOL_RESULT")) == 1
    assert sent(fake.connections[1], "TOOL_RESULT") == []
    assert await page.evaluate("window.agentEvents") == [
        {"text": "Added", "done": False}, {"text": "Added.", "done": True},
    ]
    owl = await page.evaluate("window.__owl")
    assert [f["type"] for f in owl["frames"]] == [
        "HANDSHAKE_ACK", "TOOL_CALL", "AGENT_RESPONSE", "HANDSHAKE_ACK", "AGENT_RESPONSE",
    ]
    assert owl["lastSeq"] == 3
    assert owl["dropped"] == 0


@pytest.mark.parametrize("resumed, ack_seq", [(False, 0), (True, 7)], ids=["new-session", "other-process"])
async def test_a_socket_that_does_not_take_up_where_the_tab_left_off_starts_the_answer_afresh(
        fake_server, page, resumed, ack_seq):
    async def script(connection: FakeConnection) -> None:
        await offered(connection)
        if len(fake.connections) == 1:
            await connection.send(numbered(ack(resumeToken="ses_fake.token1", resumed=False), 0))
            await connection.send(answer("Hel", False, 1))
            await connection.send(answer("lo", False, 2))
            await connection.ws.close(1001, "going away")
        else:
            # Its numbers start at the ACK's, lower or higher than the tab's.
            await connection.send(numbered(ack(resumeToken="ses_fake.token2", resumed=resumed), ack_seq))
            await connection.send(answer("New", False, ack_seq + 1))
            await connection.send(answer("", True, ack_seq + 2))

    fake = await fake_server(script)
    await open_client_page(page, fake, RECORD_CONNECTS)
    await eventually(lambda: page.evaluate("window.agentEvents.length === 4"), timeout=20,
                     what="the second socket's answer")

    assert fake.connections[1].offered == {"token": "ses_fake.token1", "lastSeq": 2}
    assert await page.evaluate("window.connects.at(-1)") == {
        "sessionId": "ses_fake", "resumed": resumed, "continued": False}
    assert await page.evaluate("window.agentEvents") == [
        {"text": "Hel", "done": False}, {"text": "Hello", "done": False},
        {"text": "New", "done": False}, {"text": "New", "done": True},
    ]
    assert await page.evaluate("[window.__owl.lastSeq, window.__owl.repeated]") == [ack_seq + 2, 0]


# --- a question the drop may have lost (protocol.md §3a, meta.lastInput) ---

RECORD_UNANSWERED = (
    "window.unanswered = []; client.on('unanswered', (e) => window.unanswered.push(e));"
    "window.states = []; client.on('state', (s) => window.states.push(s));"
)
TOOLS_EFFECTIVE = frame("SYSTEM_EVENT", {"kind": "tools_effective", "data": {}})


def questions(connection: FakeConnection) -> list[dict]:
    return sent(connection, "USER_INPUT")


async def next_question_arrives(page, connection: FakeConnection) -> None:
    """Have the page ask again, and wait for it: every frame the page sent
    before is then in connection.received."""
    assert await page.evaluate("client.sendText('next')") is True
    await eventually(lambda: any(q["payload"]["content"] == "next" for q in questions(connection)),
                     what="the next question")


@pytest.mark.parametrize("last_input", ["older", None, "this"], ids=["older-input", "no-input", "this-input"])
async def test_a_question_the_continuing_ack_does_not_name_is_sent_again_with_its_id_after_the_context(
        fake_server, page, last_input):
    async def script(connection: FakeConnection) -> None:
        await offered(connection)
        if len(fake.connections) == 1:
            await connection.send(numbered(ack(resumeToken="ses_fake.token1", resumed=False), 0))
            await connection.send(numbered(TOOLS_EFFECTIVE, 1))
            # The question is lost on its way: the session never takes it.
            first.update(await connection.recv_type("USER_INPUT"))
            await connection.ws.close(1001, "going away")
        else:
            meta = {}
            if last_input == "older":
                meta["lastInput"] = "msg_an_older_question"
            elif last_input == "this":
                meta["lastInput"] = first["id"]
            await connection.send(numbered(ack(resumeToken="ses_fake.token2", resumed=True), 1, **meta))
            await connection.recv_type("CONTEXT_UPDATE")
            await connection.send(answer("Hello.", True, 2))

    first: dict = {}
    fake = await fake_server(script)
    await open_client_page(page, fake, RECORD_CONNECTS + RECORD_UNANSWERED)
    await eventually(lambda: page.evaluate("window.__owl.lastSeq === 1"), what="the first frame")
    assert await page.evaluate("client.sendText('hello')") is True
    await eventually(lambda: page.evaluate("window.agentEvents.length === 1"), timeout=20,
                     what="the answer on the next socket")
    second = fake.connections[1]
    await next_question_arrives(page, second)

    assert second.offered == {"token": "ses_fake.token1", "lastSeq": 1}
    assert await page.evaluate("window.connects.at(-1)") == {
        "sessionId": "ses_fake", "resumed": True, "continued": True, "turn": {"question": "hello", "text": ""}}
    if last_input == "this":
        # Taken: its answer follows as numbered frames; nothing is sent again.
        assert [q["payload"]["content"] for q in questions(second)] == ["next"]
        assert await page.evaluate("window.__owl.resent") == 0
    else:
        # The very frame again, id and all, after the context its tools are in.
        assert questions(second)[0] == first
        kinds = [m["type"] for m in second.received if m["type"] in ("CONTEXT_UPDATE", "USER_INPUT")]
        assert kinds == ["CONTEXT_UPDATE", "USER_INPUT", "USER_INPUT"]
        assert await page.evaluate("window.__owl.resent") == 1
    # Thinking from the continuing ACK until the done frame.
    assert await page.evaluate("window.states") == [
        "connecting", "connected", "thinking", "reconnecting", "connecting", "thinking", "connected",
        "thinking"]
    assert await page.evaluate("window.agentEvents") == [{"text": "Hello.", "done": True}]
    assert await page.evaluate("window.unanswered") == []


@pytest.mark.parametrize("resumed, ack_seq", [(False, 0), (True, 0), (True, 9)],
                         ids=["new-session", "from-storage", "other-numbers"])
async def test_a_question_is_never_sent_again_after_an_ack_that_does_not_continue_and_the_page_is_told(
        fake_server, page, resumed, ack_seq):
    async def script(connection: FakeConnection) -> None:
        await offered(connection)
        if len(fake.connections) == 1:
            await connection.send(numbered(ack(resumeToken="ses_fake.token1", resumed=False), 0))
            await connection.send(numbered(TOOLS_EFFECTIVE, 1))
            await connection.recv_type("USER_INPUT")
            # Taken, and part of the answer sent, then the socket drops.
            await connection.send(answer("Hel", False, 2))
            await connection.ws.close(1001, "going away")
        else:
            # Even one that names an older question: it does not take up where the tab was.
            await connection.send(numbered(ack(resumeToken="ses_fake.token2", resumed=resumed), ack_seq,
                                           lastInput="msg_an_older_question"))

    fake = await fake_server(script)
    await open_client_page(page, fake, RECORD_ACTIVITY + RECORD_CONNECTS + RECORD_UNANSWERED)
    await eventually(lambda: page.evaluate("window.__owl.lastSeq === 1"), what="the first frame")
    assert await page.evaluate("client.sendText('hello')") is True
    question = (await page.evaluate("window.__owl.sent")).pop()
    await eventually(lambda: page.evaluate("window.unanswered.length === 1"), timeout=20,
                     what="the unanswered event")
    second = fake.connections[1]
    await next_question_arrives(page, second)

    assert await page.evaluate("window.connects.at(-1)") == {
        "sessionId": "ses_fake", "resumed": resumed, "continued": False}
    assert [q["payload"]["content"] for q in questions(second)] == ["next"]
    assert await page.evaluate("window.unanswered") == [{"id": question["id"], "text": "hello", "partial": "Hel"}]
    assert await page.evaluate("[window.__owl.resent, window.__owl.unanswered]") == [0, 1]
    # The widget left "thinking" at the drop and stayed out of it until the next question.
    states = await page.evaluate("window.states")
    assert states == ["connecting", "connected", "thinking", "reconnecting", "connecting", "connected", "thinking"]
    assert await page.evaluate("window.activity") == [THINKING, IDLE, THINKING]
    # The next question is the one the tab keeps now.
    assert (await stored_resume(page))["input"]["payload"]["content"] == "next"


@pytest.mark.parametrize("continues", [True, False], ids=["continued", "not-continued"])
async def test_a_reload_right_after_a_question_offers_it_again_once_the_ack_continues(
        fake_server, page, continues):
    async def script(connection: FakeConnection) -> None:
        await offered(connection)
        if len(fake.connections) == 1:
            await connection.send(numbered(ack(resumeToken="ses_fake.token1", resumed=False), 0))
            await connection.send(numbered(TOOLS_EFFECTIVE, 1))
            # Whatever reaches this socket is never taken.
        elif continues:
            await connection.send(numbered(ack(resumeToken="ses_fake.token2", resumed=True), 1,
                                           lastInput="msg_an_older_question"))
            await connection.recv_type("USER_INPUT")
            await connection.send(answer("Hello", False, 2))
            await connection.send(answer("Hello.", True, 3))
        else:
            await connection.send(numbered(ack(resumeToken="ses_fake.token2", resumed=False), 0))

    fake = await fake_server(script)
    await open_client_page(page, fake, RECORD_CONNECTS + RECORD_UNANSWERED)
    await eventually(lambda: page.evaluate("window.__owl.lastSeq === 1"), what="the first frame")
    # The question and, in the same task, what the tab keeps for its next socket.
    kept = await page.evaluate(f"client.sendText('hello') && JSON.parse(sessionStorage.getItem({RESUME_KEY}))")
    question = kept["input"]
    assert kept == {"token": "ses_fake.token1", "lastSeq": 1, "text": "", "busy": True, "input": question}
    assert question["type"] == "USER_INPUT" and question["payload"] == {"modality": "text", "content": "hello"}

    await page.reload()  # the same tab: its sessionStorage is kept
    await eventually(lambda: len(fake.connections) == 2 and hasattr(fake.connections[1], "offered"),
                     what="the reloaded page's socket")
    second = fake.connections[1]
    assert second.offered == {"token": "ses_fake.token1", "lastSeq": 1}
    if continues:
        await eventually(lambda: page.evaluate("window.agentEvents.length === 2"), what="the answer")
        assert questions(second) == [question]
        assert await page.evaluate("window.agentEvents") == [
            {"text": "Hello", "done": False}, {"text": "Hello.", "done": True}]
        assert await page.evaluate("window.states") == ["connecting", "thinking", "connected"]
        assert await page.evaluate("window.unanswered") == []
        assert await stored_resume(page) == {"token": "ses_fake.token2", "lastSeq": 3, "text": "", "busy": False}
    else:
        await eventually(lambda: page.evaluate("window.unanswered.length === 1"), what="the unanswered event")
        await next_question_arrives(page, second)
        assert [q["payload"]["content"] for q in questions(second)] == ["next"]
        assert await page.evaluate("window.unanswered") == [{"id": question["id"], "text": "hello", "partial": ""}]
        assert await page.evaluate("window.states") == ["connecting", "connected", "thinking"]


async def test_a_final_close_forgets_the_last_frame_handled_with_the_token(fake_server, page):
    async def script(connection: FakeConnection) -> None:
        await offered(connection)
        if len(fake.connections) == 1:
            await connection.send(numbered(ack(resumeToken="ses_fake.token1", resumed=False), 0))
            await connection.send(answer("Hi", False, 1))
            await connection.ws.close(1008, "ended by an operator")
        else:
            await connection.send(numbered(ack(resumeToken="ses_fake.token2", resumed=False), 0))
            await connection.send(answer("Fresh", True, 1))

    fake = await fake_server(script)
    await open_client_page(page, fake)
    await eventually(lambda: page.evaluate("window.__owl.closes.length === 1"), what="the close")
    assert await page.evaluate("Object.keys(sessionStorage).filter((k) => k.startsWith('owllayer-resume'))") == []
    assert await page.evaluate("window.__owl.lastSeq") is None

    await page.evaluate("client.connect()")
    await eventually(lambda: page.evaluate("window.agentEvents.length === 2"), what="the new session's answer")

    assert fake.connections[1].offered == {}
    assert await page.evaluate("window.agentEvents") == [
        {"text": "Hi", "done": False}, {"text": "Fresh", "done": True},
    ]


async def test_a_token_kept_before_frames_were_numbered_is_still_offered(fake_server, page):
    async def script(connection: FakeConnection) -> None:
        await offered(connection)
        await connection.send(numbered(ack(resumeToken="ses_fake.token2", resumed=True), 5))

    fake = await fake_server(script)
    await open_client_page(page, fake, RECORD_CONNECTS + f"sessionStorage.setItem({RESUME_KEY}, 'ses_fake.old');")
    await eventually(lambda: page.evaluate("window.connects.length === 1"), what="the ack")

    assert fake.connections[0].offered == {"token": "ses_fake.old"}
    # Nothing said where the tab had got to: the server's numbers are taken as they are.
    assert await page.evaluate("window.connects") == [
        {"sessionId": "ses_fake", "resumed": True, "continued": False}]
    assert await stored_resume(page) == {"token": "ses_fake.token2", "lastSeq": 5, "text": "", "busy": False}


async def test_a_client_told_not_to_resume_offers_nothing(fake_server, page):
    fake = await fake_server(acknowledge)
    await open_client_page(page, fake, "client.resumeKey = null;")
    await eventually(lambda: fake.connections and fake.connections[0].received, what="the handshake")

    assert "resume" not in fake.connections[0].received[0]["payload"]


async def test_the_server_can_reload_and_redirect_the_page_but_not_to_a_script(fake_server, page):
    fake = await fake_server(acknowledge)
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: dialogs.append(dialog.message))
    fake.pages["/elsewhere"] = "<!doctype html><title>Moved</title>"
    await open_client_page(page, fake)
    await eventually(lambda: fake.connections and sent(fake.connections[0], "CONTEXT_UPDATE"),
                     what="the first context update")

    await fake.connections[0].send(frame("SYSTEM_EVENT", {"kind": "redirect",
                                                          "data": {"url": "javascript:alert(1)"}}))
    await fake.connections[0].send(frame("AGENT_RESPONSE", {"chunk": "after", "done": True}))
    await eventually(lambda: page.evaluate("window.agentEvents.length === 1"), what="the next frame")
    assert dialogs == []
    assert page.url == fake.page_url

    await fake.connections[0].send(frame("SYSTEM_EVENT", {"kind": "reload"}))
    await eventually(lambda: len(fake.connections) == 2 and sent(fake.connections[1], "CONTEXT_UPDATE"),
                     what="the reloaded page's session")
    await fake.connections[1].send(frame("SYSTEM_EVENT", {"kind": "redirect", "data": {"url": "/elsewhere"}}))
    await page.wait_for_url(f"http://127.0.0.1:{fake.port}/elsewhere")


async def test_a_disconnect_event_ends_the_session_for_good(fake_server, page):
    fake = await fake_server(acknowledge)
    await open_client_page(page, fake, RECORD_EVENTS)
    await eventually(lambda: fake.connections and sent(fake.connections[0], "CONTEXT_UPDATE"),
                     what="the first context update")
    await fake.connections[0].send(frame("SYSTEM_EVENT", {
        "kind": "disconnect", "message": "An operator ended this session."}))
    # Even a close code that would normally be retried.
    await fake.connections[0].ws.close(1000, "ended")
    await eventually(lambda: page.evaluate("window.__owl.closes.length === 1"), what="the close")
    assert await page.evaluate("window.errors") == ["An operator ended this session."]
    assert await page.evaluate("[window.__owl.state, window.__owl.retryInMs]") == ["closed", None]
    assert await page.evaluate("window.retries") == []


async def test_a_disconnect_event_then_1001_reconnects_to_the_next_server_process(fake_server, page):
    fake = await fake_server(acknowledge)
    await open_client_page(page, fake, RECORD_EVENTS)
    await eventually(lambda: fake.connections and sent(fake.connections[0], "CONTEXT_UPDATE"),
                     what="the first context update")
    await fake.connections[0].send(frame("SYSTEM_EVENT", {
        "kind": "disconnect", "message": "The server is restarting; reconnecting."}))
    # A server process stopping: 1001, "going away".
    await fake.connections[0].ws.close(1001, "server shutting down")
    await eventually(lambda: len(fake.connections) == 2 and sent(fake.connections[1], "CONTEXT_UPDATE"),
                     what="the reconnected page's session")
    assert await page.evaluate("window.__owl.closes.map(c => c.code)") == [1001]


# --- what the page is told: the activity and each tool call ---------------------

RECORD_ACTIVITY = (
    "window.activity = []; window.toolEvents = [];"
    "client.on('activity', (a) => window.activity.push(a));"
    "client.on('tool.start', (e) => window.toolEvents.push(['start', e]));"
    "client.on('tool', (e) => window.toolEvents.push(['end', e]));"
)
PAY = {"name": "process_payment", "description": "Pay", "risk": "critical",
       "parameters": {"type": "OBJECT", "properties": {"amount": {"type": "NUMBER"}},
                      "required": ["amount"]}}
IDLE = {"activity": "idle"}
THINKING = {"activity": "thinking"}


def doing(activity: str, tool: str, call_id: str) -> dict:
    return {"activity": activity, "tool": tool, "callId": call_id}


def register(tool: dict, handler: str) -> str:
    return f"client.registerTool({json.dumps(tool)}, {handler});"


# A handler that finishes only when the test calls window.finish[callId](result).
HELD_HANDLER = ("(args, {callId}) => new Promise((resolve) => {"
                " (window.finish = window.finish || {})[callId] = resolve; })")


async def handler_started(page, call_id: str) -> None:
    """Wait until a HELD_HANDLER call is running (its finish function exists)."""
    await eventually(lambda: page.evaluate(f"Boolean(window.finish && window.finish.{call_id})"),
                     what=f"the handler of {call_id} to start")


async def connected_client(fake_server, page, setup: str) -> FakeConnection:
    fake = await fake_server(acknowledge)
    await open_client_page(page, fake, RECORD_ACTIVITY + setup)
    await eventually(lambda: fake.connections and sent(fake.connections[0], "CONTEXT_UPDATE"),
                     what="the first context update")
    return fake.connections[0]


async def start_turn(page, connection: FakeConnection) -> None:
    assert await page.evaluate("client.sendText('please')") is True
    await eventually(lambda: sent(connection, "USER_INPUT"), what="the user input")


async def call_tool(connection: FakeConnection, call_id: str, name: str, args: dict) -> None:
    await connection.send(frame("TOOL_CALL", {"callId": call_id, "name": name, "args": args}))


async def test_the_activity_goes_thinking_tool_thinking_idle_through_a_turn_with_one_low_risk_tool(
        fake_server, page):
    connection = await connected_client(fake_server, page, register(ADD_TO_CART, "() => ({added: true})"))
    assert await page.evaluate("[client.activity, window.__owl.activity]") == ["idle", "idle"]

    await start_turn(page, connection)
    await call_tool(connection, "tc_add", "add_to_cart", {"quantity": 2})
    await eventually(lambda: sent(connection, "TOOL_RESULT"), what="the tool result")
    await connection.send(frame("AGENT_RESPONSE", {"chunk": "Added.", "done": True}))
    await eventually(lambda: page.evaluate("window.agentEvents.length === 1"), what="the end of the turn")

    assert await page.evaluate("window.activity") == [
        THINKING, doing("tool", "add_to_cart", "tc_add"), THINKING, IDLE,
    ]
    assert await page.evaluate("[client.activity, window.__owl.activity]") == ["idle", "idle"]


async def test_a_tool_start_and_a_tool_event_bracket_each_call_even_of_an_unknown_tool(fake_server, page):
    connection = await connected_client(fake_server, page, register(ADD_TO_CART, "() => ({added: true})"))

    await call_tool(connection, "tc_add", "add_to_cart", {"quantity": 2})
    await eventually(lambda: len(sent(connection, "TOOL_RESULT")) == 1, what="the first result")
    await call_tool(connection, "tc_fly", "fly", {"speed": 3})
    await eventually(lambda: len(sent(connection, "TOOL_RESULT")) == 2, what="the second result")

    assert await page.evaluate("window.toolEvents") == [
        ["start", {"name": "add_to_cart", "callId": "tc_add", "args": {"quantity": 2}, "risk": "low"}],
        ["end", {"name": "add_to_cart", "callId": "tc_add", "outcome": {"result": {"added": True}}}],
        ["start", {"name": "fly", "callId": "tc_fly", "args": {"speed": 3}, "risk": "none"}],
        ["end", {"name": "fly", "callId": "tc_fly", "outcome": {"error": "unknown tool: fly"}}],
    ]


async def test_a_critical_tool_shows_approval_while_its_dialog_is_open_and_thinking_after_a_decline(
        fake_server, page):
    connection = await connected_client(fake_server, page, register(PAY, "() => ({paid: true})"))
    dialog = page.locator("dialog#owl-approval")

    await start_turn(page, connection)
    await call_tool(connection, "tc_pay", "process_payment", {"amount": 10})
    await expect(dialog).to_be_visible()
    assert await page.evaluate("client.activity") == "approval"
    await dialog.get_by_role("button", name="Decline").click()
    await eventually(lambda: sent(connection, "APPROVAL_RESPONSE"), what="the decline")

    assert await page.evaluate("window.activity") == [
        THINKING,
        doing("tool", "process_payment", "tc_pay"),
        doing("approval", "process_payment", "tc_pay"),
        THINKING,
    ]


async def test_a_declined_call_is_reported_on_the_tool_event_as_denied(fake_server, page):
    connection = await connected_client(fake_server, page, register(PAY, "() => ({paid: true})"))
    dialog = page.locator("dialog#owl-approval")

    await call_tool(connection, "tc_pay", "process_payment", {"amount": 10})
    await dialog.get_by_role("button", name="Decline").click()
    await eventually(lambda: page.evaluate("window.toolEvents.length === 2"), what="the tool event")

    assert await page.evaluate("window.toolEvents") == [
        ["start", {"name": "process_payment", "callId": "tc_pay", "args": {"amount": 10},
                   "risk": "critical"}],
        ["end", {"name": "process_payment", "callId": "tc_pay",
                 "outcome": {"error": "Action denied by user", "denied": True}}],
    ]


async def test_an_approved_critical_tool_shows_tool_while_its_handler_runs(fake_server, page):
    connection = await connected_client(fake_server, page, register(PAY, HELD_HANDLER))
    dialog = page.locator("dialog#owl-approval")

    await call_tool(connection, "tc_pay", "process_payment", {"amount": 10})
    await dialog.get_by_role("button", name="Approve").click()
    await handler_started(page, "tc_pay")
    assert await page.evaluate("client.activity") == "tool"
    await page.evaluate("window.finish.tc_pay({paid: true})")
    await eventually(lambda: sent(connection, "APPROVAL_RESPONSE"), what="the approval response")

    assert await page.evaluate("window.activity") == [
        doing("tool", "process_payment", "tc_pay"),
        doing("approval", "process_payment", "tc_pay"),
        doing("tool", "process_payment", "tc_pay"),
        THINKING,
    ]


async def test_with_two_calls_open_the_activity_stays_on_a_tool_until_the_last_result(fake_server, page):
    check_stock = {"name": "check_stock", "description": "Check the stock"}
    setup = register(check_stock, HELD_HANDLER) + register(ADD_TO_CART, HELD_HANDLER)
    connection = await connected_client(fake_server, page, setup)

    await call_tool(connection, "tc_stock", "check_stock", {})
    await call_tool(connection, "tc_add", "add_to_cart", {"quantity": 1})
    await eventually(lambda: page.evaluate("Object.keys(window.finish || {}).length === 2"),
                     what="both handlers to start")
    await page.evaluate("window.finish.tc_add(null)")
    await eventually(lambda: len(sent(connection, "TOOL_RESULT")) == 1, what="the first result")
    assert await page.evaluate("window.activity.at(-1)") == doing("tool", "check_stock", "tc_stock")
    await page.evaluate("window.finish.tc_stock(null)")
    await eventually(lambda: len(sent(connection, "TOOL_RESULT")) == 2, what="the second result")

    assert await page.evaluate("window.activity") == [
        doing("tool", "check_stock", "tc_stock"),
        doing("tool", "add_to_cart", "tc_add"),
        doing("tool", "check_stock", "tc_stock"),
        THINKING,
    ]


async def test_a_server_side_approval_shows_approval_while_its_dialog_is_open(fake_server, page):
    connection = await connected_client(fake_server, page, "")
    dialog = page.locator("dialog#owl-approval")

    await start_turn(page, connection)
    await connection.send(frame("APPROVAL_REQUEST", {
        "callId": "srv_1", "toolName": "cancel_order", "risk": "high",
        "args": {"number": "A1003"}, "message": "Cancel order A1003?",
    }))
    await expect(dialog).to_be_visible()
    assert await page.evaluate("client.activity") == "approval"
    await dialog.get_by_role("button", name="Approve").click()
    await eventually(lambda: sent(connection, "APPROVAL_RESPONSE"), what="the answer")

    assert await page.evaluate("window.activity") == [
        THINKING, doing("approval", "cancel_order", "srv_1"), THINKING,
    ]


async def test_a_lost_connection_resets_the_activity_to_idle(fake_server, page):
    connection = await connected_client(fake_server, page, register(ADD_TO_CART, HELD_HANDLER))

    await start_turn(page, connection)
    await call_tool(connection, "tc_add", "add_to_cart", {"quantity": 1})
    await handler_started(page, "tc_add")
    await connection.ws.close(1001, "going away")
    await eventually(lambda: page.evaluate("window.__owl.closes.length === 1"), what="the close")

    assert await page.evaluate("window.activity") == [
        THINKING, doing("tool", "add_to_cart", "tc_add"), IDLE,
    ]


async def test_a_disconnect_event_resets_the_activity_to_idle(fake_server, page):
    connection = await connected_client(fake_server, page, "")

    await start_turn(page, connection)
    await connection.send(frame("SYSTEM_EVENT", {"kind": "disconnect", "message": "Ended."}))
    await eventually(lambda: page.evaluate("window.activity.length === 2"), what="the activity change")

    assert await page.evaluate("window.activity") == [THINKING, IDLE]


# --- the module itself ------------------------------------------------------------


async def test_the_in_page_frame_check_keeps_and_drops_what_the_wire_schema_does(fake_server, page):
    fake = await fake_server(acknowledge)
    texts = DROPPED + KEPT
    fake.pages["/check"] = module_page(
        f'import {{ validateFrame }} from "{CLIENT_PATH}";'
        f"window.kept = {json.dumps(texts)}.map((text) => !validateFrame(text).error);"
    )
    await page.goto(fake.url("/check"))
    await page.wait_for_function("window.kept !== undefined")

    kept = await page.evaluate("window.kept")
    assert kept == [schema_accepts(text) for text in texts] == [False] * len(DROPPED) + [True] * len(KEPT)



async def test_the_module_exports_the_class_and_its_helpers_also_as_static_properties(fake_server, page):
    fake = await fake_server(acknowledge)
    null_meta = frame("AGENT_RESPONSE", {"chunk": "x", "done": True}, meta=None)
    fake.pages["/exports"] = module_page(
        "import OwlLayer, { OwlLayerClient, SDK_VERSION, PROTOCOL_VERSION, validateFrame,"
        f' closeIsPermanent, argumentsError, showApprovalDialog }} from "{CLIENT_PATH}";'
        "window.exported = {"
        "  defaultIsTheClass: OwlLayer === OwlLayerClient,"
        "  versions: [SDK_VERSION, PROTOCOL_VERSION],"
        f"  nullMeta: validateFrame({json.dumps(null_meta)}),"
        "  permanent: [closeIsPermanent(1008), closeIsPermanent(1001)],"
        "  argumentsError: argumentsError({type: 'NUMBER'}, 'two', 'args.quantity'),"
        "  dialog: typeof showApprovalDialog,"
        "  statics: [OwlLayerClient.SDK_VERSION === SDK_VERSION,"
        "    OwlLayerClient.PROTOCOL_VERSION === PROTOCOL_VERSION,"
        "    OwlLayerClient.validateFrame === validateFrame,"
        "    OwlLayerClient.closeIsPermanent === closeIsPermanent,"
        "    OwlLayerClient.argumentsError === argumentsError,"
        "    OwlLayerClient.showApprovalDialog === showApprovalDialog],"
        "};"
    )
    await page.goto(fake.url("/exports"))
    await page.wait_for_function("window.exported !== undefined")

    assert await page.evaluate("window.exported") == {
        "defaultIsTheClass": True,
        "versions": ["0.4.0", "1.0.0"],
        "nullMeta": {"error": "meta must be an object"},
        "permanent": [True, False],
        "argumentsError": "args.quantity must be number",
        "dialog": "function",
        "statics": [True] * 6,
    }


async def test_the_module_sets_no_global_class_and_exposes_the_wire_state(fake_server, page):
    fake = await fake_server(acknowledge)
    await open_client_page(page, fake)

    assert await page.evaluate("[typeof window.OwlLayerClient, window.__owl === client.wire]") == [
        "undefined", True,
    ]
