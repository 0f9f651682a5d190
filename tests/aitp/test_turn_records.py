"""Each turn's record: how it ended, where its time went (the model, its
tools, a person's approval), its tokens and what they cost, written with
the turn's last checkpoint by both stores, and shown on the console's
session record and the admin's live page."""
from __future__ import annotations

import asyncio

import pytest
from django.test import Client
from django.urls import reverse

from aitp.models import TurnRecord
from tests.aitp.conftest import api_key, connect, tenant  # noqa: F401 (fixtures)
from tests.aitp.test_agent import (  # noqa: F401 (fixtures)
    answer_with,
    approval_request,
    close,
    errors,
    fake,
    llm,
    open_shop,
    turn,
    until_done,
)
from tests.support.fake_anthropic import error_response, text_response, tool_use_response

pytestmark = pytest.mark.django_db(transaction=True)

# claude-test-model's price in these tests: USD per million tokens.
PRICES = '{"claude-test": [3, 15, 0.3, 3.75]}'
USED = {"input_tokens": 1000, "output_tokens": 200, "cache_read_input_tokens": 5000,
        "cache_creation_input_tokens": 400}
# 1000 x 3 + 200 x 15 + 5000 x 0.3 + 400 x 3.75 millionths of a dollar, twice (two requests).
COST = 2 * (3000 + 3000 + 1500 + 1500)
APPROVAL_TAKES = 0.5  # seconds the page's user takes to approve


@pytest.fixture(params=["fast", "plain"])
def store_named(request, settings, monkeypatch):
    monkeypatch.setenv("OWLLAYER_MODEL_PRICES", PRICES)
    from owllayer_site.settings import env_prices

    settings.OWLLAYER_MODEL_PRICES = env_prices("OWLLAYER_MODEL_PRICES", {})
    settings.OWLLAYER_STORE = request.param
    return request.param


async def record_of(session_id: str, number: int = 1) -> TurnRecord:
    return await TurnRecord.objects.aget(session_id=session_id, number=number)


async def test_a_turn_records_its_outcome_its_times_its_tokens_and_their_cost(
        llm, connect, api_key, store_named):
    llm.enqueue(tool_use_response([("toolu_cart", "add_to_cart", {"quantity": 1})], usage=USED),
                text_response("Added.", usage=USED))
    page = await open_shop(connect, api_key)

    frames = await turn(page, "add one", on_tool_call=answer_with({"cart": 1}))
    await close(page)

    assert errors(frames) == []
    record = await record_of(page.session_id)
    assert (record.outcome, record.error_code, record.model) == ("answered", "", "claude-test-model")
    assert (record.input_tokens, record.output_tokens, record.cache_read_tokens,
            record.cache_write_tokens) == (2000, 400, 10000, 800)
    assert record.cost_micros == COST
    assert record.first_text_ms is not None
    assert record.started_at <= record.ended_at
    elapsed_ms = (record.ended_at - record.started_at).total_seconds() * 1000
    assert record.model_ms + record.tools_ms + record.approval_ms <= elapsed_ms + 1
    assert record.approval_ms == 0


async def test_a_turn_that_waits_for_an_approval_records_the_wait_apart_from_its_tools(
        llm, connect, api_key, settings, store_named):
    settings.OWLLAYER_TOOL_TIMEOUT = 10.0
    llm.enqueue(tool_use_response([("toolu_pay", "pay", {"amount": 42})]),
                text_response("Payment handled."))
    page = await open_shop(connect, api_key)
    await page.send("USER_INPUT", {"modality": "text", "content": "pay for it"})
    call = await page.recv_until("TOOL_CALL")
    await page.send("APPROVAL_REQUEST", approval_request(call))
    await asyncio.sleep(APPROVAL_TAKES)
    await page.send("APPROVAL_RESPONSE", {"callId": call["payload"]["callId"], "approved": True,
                                          "result": {"paid": True}})
    await until_done(page)
    await close(page)

    record = await record_of(page.session_id)
    assert record.outcome == "answered"
    # From the request's arrival to the answer's: the user's half second, less
    # whatever held the request on its way in.
    assert record.approval_ms >= APPROVAL_TAKES * 1000 / 2
    elapsed_ms = (record.ended_at - record.started_at).total_seconds() * 1000
    assert record.approval_ms + record.tools_ms + record.model_ms <= elapsed_ms + 1


async def test_a_failed_turn_records_its_error_code_and_no_first_text(
        llm, connect, api_key, store_named):
    llm.enqueue(error_response(401))
    page = await open_shop(connect, api_key)

    await turn(page, "hi")
    await close(page)

    record = await record_of(page.session_id)
    assert (record.outcome, record.error_code, record.first_text_ms) == ("failed", "auth_failed", None)


async def test_a_model_without_a_price_records_its_tokens_and_no_cost(llm, connect, api_key, settings):
    settings.OWLLAYER_MODEL_PRICES = (("claude-other", 1.0, 1.0, 1.0, 1.0),)
    llm.enqueue(text_response("Hello.", usage=USED))
    page = await open_shop(connect, api_key)

    await turn(page, "hi")
    await close(page)

    record = await record_of(page.session_id)
    assert (record.input_tokens, record.cost_micros) == (1000, None)


async def test_each_turn_of_a_session_has_its_own_record(llm, connect, api_key, store_named):
    llm.enqueue(text_response("One."), text_response("Two."))
    page = await open_shop(connect, api_key)

    await turn(page, "first")
    await turn(page, "second")
    await close(page)

    numbers = [r.number async for r in TurnRecord.objects.filter(session_id=page.session_id)]
    assert numbers == [1, 2]


def test_the_record_pages_show_each_turns_breakdown(transactional_db):
    from aitp import tenancy
    from tests.support.people import make_session, make_user

    shop = tenancy.tenant_create(slug="breakdown", name="Breakdown shop")
    session = make_session(shop)
    TurnRecord.objects.create(
        session=session, number=1, started_at=session.started_at, ended_at=session.started_at,
        outcome="answered", first_text_ms=412, model_ms=1530, tools_ms=220, approval_ms=8100,
        input_tokens=1234, output_tokens=56, cost_micros=12_345, model="claude-test-model",
        trace_id="4bf92f3577b34da6a3ce929d0e0e4736")
    root = make_user("root", tenant=shop, superuser=True)
    client = Client()
    client.force_login(root)

    for url in (reverse("console:session", args=[shop.slug, session.pk]),
                reverse("operators:live_session", args=[session.pk])):
        page = client.get(url).content.decode()
        for shown in ("412 ms", "1530 ms", "220 ms", "8100 ms", "1234 / 56", "$0.0123",
                      "4bf92f3577b34da6a3ce929d0e0e4736", "Answered"):
            assert shown in page, (url, shown)


def test_the_usage_page_shows_the_cost_of_each_day_and_each_session(transactional_db):
    from django.utils import timezone

    from aitp import tenancy
    from tests.support.people import make_session, make_user

    shop = tenancy.tenant_create(slug="costs", name="Costs shop")
    priced, unpriced = make_session(shop), make_session(shop)
    now = timezone.now()
    for session, number, cost in ((priced, 1, 120_000), (priced, 2, 5_000), (unpriced, 1, None)):
        TurnRecord.objects.create(session=session, number=number, started_at=now, ended_at=now,
                                  outcome="answered", cost_micros=cost)
    owner = make_user("owner", tenant=shop)
    client = Client()
    client.force_login(owner)

    page = client.get(reverse("console:usage", args=[shop.slug])).content.decode()

    assert "data-cost-total>$0.1250<" in page  # the days' total
    assert page.count('data-cost>$0.1250<') == 2  # the day, and the session with prices
    assert 'data-cost>-<' in page  # the session whose model had none
