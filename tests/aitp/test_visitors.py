"""A tenant vouches for its visitor (docs/protocol.md §3c): its backend
signs a short visitor token with the tenant's visitor secret; a new session
offered one is linked to the visitor, its agent told of the visitor's
earlier conversations, and the widget can read the visitor's last one. A
token that does not hold links nothing and says why; nothing links a page
without one."""
from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from types import SimpleNamespace

import jwt
import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient
from django.urls import reverse

from aitp import tenancy, visitors
from aitp.models import Session
from tests.aitp.conftest import ORIGIN
from tests.aitp.test_agent import fake, llm, turn  # noqa: F401 (fixtures)
from tests.aitp.test_resume import dropped
from tests.support.fake_anthropic import text_response

SECRET = "vsec_" + "s" * 64
NOW = 1_800_000_000.0


def signed(secret: str = SECRET, *, algorithm: str = "HS256", **claims) -> str:
    body = {"sub": "visitor-42", "exp": int(time.time()) + 600, **claims}
    return jwt.encode({k: v for k, v in body.items() if v is not None}, secret, algorithm=algorithm)


# --- the token, alone ---------------------------------------------------------------


def test_a_token_signed_with_the_tenants_secret_names_its_visitor():
    assert visitors.visitor_id(signed(exp=NOW + 600), SECRET, now=NOW) == "visitor-42"


@pytest.mark.parametrize("claims, why", [
    ({"exp": NOW - 31}, "has expired"),
    ({"nbf": NOW + 31, "exp": NOW + 600}, "not valid yet"),
    ({"exp": NOW + 24 * 3600 + 31}, "at most 24 hours"),
    ({"exp": None}, "not a JWT"),
    ({"sub": None, "exp": NOW + 600}, "not a JWT"),
    ({"sub": "", "exp": NOW + 600}, "1 to 128 printable"),
    ({"sub": "v" * 129, "exp": NOW + 600}, "1 to 128 printable"),
    ({"sub": "ada\nbob", "exp": NOW + 600}, "1 to 128 printable"),
    ({"sub": 42, "exp": NOW + 600}, "1 to 128 printable"),
], ids=["expired", "not-yet-valid", "valid-too-long", "no-exp", "no-sub", "empty-sub", "long-sub",
        "control-character", "number-sub"])
def test_a_token_that_does_not_hold_is_refused_saying_why(claims, why, monkeypatch):
    monkeypatch.setattr(time, "time", lambda: NOW)

    refused = visitors.visitor_id(signed(**claims), SECRET, now=NOW)

    assert isinstance(refused, visitors.VisitorRefusal) and refused.code == "invalid_visitor_token"
    assert why in refused.message


def test_clocks_thirty_seconds_apart_still_agree(monkeypatch):
    monkeypatch.setattr(time, "time", lambda: NOW)

    assert visitors.visitor_id(signed(exp=NOW - 20, iat=NOW + 20), SECRET, now=NOW) == "visitor-42"
    assert visitors.visitor_id(signed(nbf=NOW + 20, exp=NOW + 600), SECRET, now=NOW) == "visitor-42"


def test_a_token_signed_with_another_secret_is_refused():
    refused = visitors.visitor_id(signed("vsec_other" + "x" * 40, exp=NOW + 600), SECRET, now=NOW)

    assert isinstance(refused, visitors.VisitorRefusal) and "signature" in refused.message


@pytest.mark.parametrize("algorithm", ["HS384", "HS512"])
def test_a_token_of_another_algorithm_is_refused(algorithm):
    token = signed(algorithm=algorithm, exp=NOW + 600)

    assert isinstance(visitors.visitor_id(token, SECRET, now=NOW), visitors.VisitorRefusal)


def test_an_unsigned_token_is_refused():
    header = jwt.utils.base64url_encode(json.dumps({"alg": "none", "typ": "JWT"}).encode()).decode()
    body = jwt.utils.base64url_encode(json.dumps({"sub": "visitor-42", "exp": NOW + 600}).encode()).decode()

    assert isinstance(visitors.visitor_id(f"{header}.{body}.", SECRET, now=NOW), visitors.VisitorRefusal)


@pytest.mark.parametrize("token", ["", "nonsense", "a.b.c", "x" * 5000])
def test_what_is_not_a_token_is_refused(token):
    assert isinstance(visitors.visitor_id(token, SECRET, now=NOW), visitors.VisitorRefusal)


def test_a_tenant_without_a_secret_accepts_no_token():
    assert isinstance(visitors.visitor_id(signed(exp=NOW + 600), "", now=NOW), visitors.VisitorRefusal)


# --- the account of earlier conversations ---------------------------------------------------


def said(role: str, *blocks, turn: int = 1):
    return SimpleNamespace(role=role, turn=turn, content=list(blocks))


def text(words: str) -> dict:
    return {"type": "text", "text": words}


def test_the_account_tells_each_earlier_conversation_newest_first_with_its_questions_and_tools():
    newer = visitors.Earlier(datetime(2026, 12, 3, 10, tzinfo=UTC), [
        said("user", text("[page]\nurl: /cart\ntitle: Cart\ncontext: {}"), text("Pay for my cart.")),
        said("assistant", text("Paying now."), {"type": "tool_use", "id": "t1", "name": "process_payment",
                                                "input": {"amount": 10}}),
    ])
    older = visitors.Earlier(datetime(2026, 11, 30, 9, tzinfo=UTC), [
        said("user", text("Do you have headphones?")), said("assistant", text("Yes.")),
        said("user", text("In black?"), turn=2),
    ])

    account = visitors.earlier_account([newer, older])

    assert account.splitlines() == [
        visitors.EARLIER_HEADING,
        '- 03 Dec 2026: asked "Pay for my cart." (tools used: process_payment)',
        '- 30 Nov 2026: asked "Do you have headphones?"; "In black?"',
    ]
    assert "amount" not in account and "Paying now" not in account


def test_the_account_is_bounded_however_long_the_earlier_conversations_were():
    long = visitors.Earlier(datetime(2026, 12, 3, tzinfo=UTC),
                            [said("user", text("word " * 2000), turn=n) for n in range(50)])

    account = visitors.earlier_account([long] * 10)

    assert len(account) <= visitors.EARLIER_CHARS
    assert account.count("\n- ") == visitors.EARLIER_CONVERSATIONS
    assert all(len(line) < 3 * (visitors.QUESTION_CHARS + 10) + 40 for line in account.splitlines()[1:])


def test_no_earlier_question_is_no_account():
    assert visitors.earlier_account([]) == ""
    assert visitors.earlier_account([visitors.Earlier(datetime(2026, 12, 3, tzinfo=UTC), [])]) == ""


# --- through the endpoint --------------------------------------------------------------------

endpoint = pytest.mark.django_db(transaction=True)


@pytest.fixture
def secret(tenant) -> str:
    return tenant.visitor_secret


async def asked(connect, raw_key: str, question: str, **handshake) -> tuple[str, list[dict]]:
    """A page that shook hands (with ``handshake``'s fields), asked once and
    left: its session id and every frame it got."""
    page = await connect()
    ack = await page.handshake(raw_key, **handshake)
    assert ack["type"] == "HANDSHAKE_ACK", ack
    first = await page.context(url="/products/headphones", title="Pro Headphones")
    frames = [first, *await turn(page, question)]
    await page.close()
    return ack["payload"]["sessionId"], frames


def errors(frames: list[dict]) -> list[str]:
    return [f["payload"]["data"]["code"] for f in frames
            if f["type"] == "SYSTEM_EVENT" and f["payload"].get("kind") == "error"]


@endpoint
async def test_a_session_opened_with_a_visitor_token_is_linked_to_its_visitor(llm, connect, api_key, secret):
    llm.enqueue(text_response("Hello."))

    session_id, frames = await asked(connect, api_key.raw, "Hi.", visitorToken=signed(secret))

    assert errors(frames) == []
    assert (await Session.objects.aget(id=session_id)).visitor_id == "visitor-42"


@endpoint
async def test_the_next_visit_tells_the_agent_what_the_visitor_asked_before(llm, connect, api_key, secret):
    llm.enqueue(text_response("They are $199."), text_response("Welcome back."))
    await asked(connect, api_key.raw, "How much are the Pro Headphones?", visitorToken=signed(secret))

    await asked(connect, api_key.raw, "Hello again.", visitorToken=signed(secret))

    system = llm.requests[-1]["system"][0]["text"]
    assert visitors.EARLIER_HEADING in system
    assert '"How much are the Pro Headphones?"' in system
    assert "How much" not in llm.requests[0]["system"][0]["text"]


@endpoint
async def test_another_visitor_and_another_tenants_visitor_of_the_same_id_are_not_told(
        llm, connect, api_key, secret):
    other_tenant = await sync_to_async(tenancy.tenant_create)(slug="globex", name="Globex")
    _, other_raw = await sync_to_async(tenancy.key_create)(tenant=other_tenant, name="web",
                                                           allowed_origins=[ORIGIN])
    llm.enqueue(*(text_response("Noted.") for _ in range(3)))
    await asked(connect, api_key.raw, "My secret is 1234.", visitorToken=signed(secret, sub="ada"))
    await asked(connect, other_raw, "Hi from Globex.", visitorToken=signed(other_tenant.visitor_secret))

    await asked(connect, api_key.raw, "Hello.", visitorToken=signed(secret))

    system = llm.requests[-1]["system"][0]["text"]
    assert "1234" not in system and "Globex" not in system and visitors.EARLIER_HEADING not in system


@endpoint
async def test_a_page_without_a_visitor_token_is_linked_to_nothing_and_told_nothing(llm, connect, api_key, secret):
    llm.enqueue(text_response("Noted."), text_response("Hello."))
    await asked(connect, api_key.raw, "I am Ada.", visitorToken=signed(secret))

    session_id, frames = await asked(connect, api_key.raw, "Hello.")

    assert errors(frames) == []
    assert (await Session.objects.aget(id=session_id)).visitor_id == ""
    assert visitors.EARLIER_HEADING not in llm.requests[-1]["system"][0]["text"]


@endpoint
@pytest.mark.parametrize("token", [
    "forged", "expired", "other-tenant", "unsigned", "rotated"])
async def test_a_visitor_token_that_does_not_hold_opens_an_unlinked_session_and_says_why(
        llm, connect, api_key, secret, tenant, token):
    other_tenant = await sync_to_async(tenancy.tenant_create)(slug="globex", name="Globex")
    offered = {
        "forged": signed(secret)[:-4] + "AAAA",
        "expired": signed(secret, exp=int(time.time()) - 120),
        "other-tenant": signed(other_tenant.visitor_secret),
        "unsigned": signed(secret).rsplit(".", 1)[0] + ".",
        "rotated": signed(secret),
    }[token]
    if token == "rotated":
        await sync_to_async(tenancy.visitor_secret_rotate)(tenant=tenant, by=None)
    llm.enqueue(text_response("Hello."))

    session_id, frames = await asked(connect, api_key.raw, "Hi.", visitorToken=offered)

    assert errors(frames) == ["invalid_visitor_token"]
    assert [f["payload"]["chunk"] for f in frames if f["type"] == "AGENT_RESPONSE" and f["payload"]["done"]]
    assert (await Session.objects.aget(id=session_id)).visitor_id == ""


@endpoint
async def test_a_continued_session_keeps_its_visitor_and_is_not_told_again(llm, connect, api_key, secret):
    llm.enqueue(text_response("Hello."))
    page = await connect()
    ack = (await page.handshake(api_key.raw, resume={}, visitorToken=signed(secret)))["payload"]
    await dropped(page)

    again = await connect()
    continued = await again.handshake(api_key.raw, resume={"token": ack["resumeToken"]},
                                      visitorToken=signed(secret, sub="someone-else"))

    assert continued["payload"]["resumed"] is True
    assert (await Session.objects.aget(id=ack["sessionId"])).visitor_id == "visitor-42"
    await again.close()


async def read_last(raw_key: str, visitor_token: str, *, origin: str = ORIGIN, **extra):
    body = json.dumps({"apiKey": raw_key, "visitorToken": visitor_token, **extra})
    return await AsyncClient().post(reverse("conversation"), data=body, content_type="text/plain",
                                    headers={"Origin": origin})


@endpoint
async def test_a_later_visit_reads_the_visitors_last_conversation(llm, connect, api_key, secret):
    llm.enqueue(text_response("They are $199."), text_response("Docks are $49."))
    await asked(connect, api_key.raw, "How much are the headphones?", visitorToken=signed(secret))
    last, _ = await asked(connect, api_key.raw, "And the dock?", visitorToken=signed(secret))

    answer = await read_last(api_key.raw, signed(secret))

    assert answer.status_code == 200 and answer["Access-Control-Allow-Origin"] == ORIGIN
    body = answer.json()
    assert body["sessionId"] == last
    assert [m["text"] for m in body["messages"]] == ["And the dock?", "Docks are $49."]


@endpoint
async def test_a_visitor_of_another_tenant_with_the_same_id_reads_nothing(llm, connect, api_key, secret):
    other_tenant = await sync_to_async(tenancy.tenant_create)(slug="globex", name="Globex")
    _, other_raw = await sync_to_async(tenancy.key_create)(tenant=other_tenant, name="web",
                                                           allowed_origins=[ORIGIN])
    llm.enqueue(text_response("Noted."))
    await asked(connect, api_key.raw, "My card ends in 4242.", visitorToken=signed(secret))

    answer = await read_last(other_raw, signed(other_tenant.visitor_secret))

    assert answer.status_code == 404 and answer.json()["error"]["code"] == "unknown_conversation"


@endpoint
@pytest.mark.parametrize("how", ["forged", "expired", "other-tenant"])
async def test_a_visitor_token_that_does_not_hold_reads_nothing(llm, connect, api_key, secret, how):
    other_tenant = await sync_to_async(tenancy.tenant_create)(slug="globex", name="Globex")
    llm.enqueue(text_response("Noted."))
    await asked(connect, api_key.raw, "Hi.", visitorToken=signed(secret))
    token = {"forged": signed(secret)[:-4] + "AAAA", "expired": signed(secret, exp=int(time.time()) - 120),
             "other-tenant": signed(other_tenant.visitor_secret)}[how]

    answer = await read_last(api_key.raw, token)

    assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_visitor_token"
    assert "messages" not in answer.json()


@endpoint
async def test_a_body_with_both_tokens_is_not_one_request(api_key, secret):
    answer = await read_last(api_key.raw, signed(secret), token="ses_1." + "A" * 43)

    assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_message"


@endpoint
async def test_two_tabs_of_one_visitor_hold_two_conversations_and_each_gets_only_its_own_answer(
        llm, connect, api_key, secret):
    llm.enqueue(text_response("Answer for the first tab."), text_response("Answer for the second tab."))
    one, two = await connect(), await connect()
    acks = [(await tab.handshake(api_key.raw, resume={}, visitorToken=signed(secret)))["payload"]
            for tab in (one, two)]
    for tab in (one, two):
        await tab.context(url="/", title="Home")

    first = await turn(one, "First tab asks.")
    second = await turn(two, "Second tab asks.")

    def said(frames: list[dict]) -> str:
        return "".join(f["payload"]["chunk"] for f in frames if f["type"] == "AGENT_RESPONSE")

    assert acks[0]["sessionId"] != acks[1]["sessionId"]
    assert "first tab" in said(first) and "second tab" not in said(first)
    assert "second tab" in said(second) and "first tab" not in said(second)
    rows = [await Session.objects.aget(id=ack["sessionId"]) for ack in acks]
    assert [row.visitor_id for row in rows] == ["visitor-42", "visitor-42"]
    await one.close()
    await two.close()
