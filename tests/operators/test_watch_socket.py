"""The staff watch socket, over the real ASGI application (auth middleware included).

Rows must be committed for the consumer's database thread to see them,
hence transaction=True. "Not delivered" is shown without waiting: the
foreign event is published first, an own event after it, and the first
message that arrives must be the own one (the channel keeps their order).
"""
from __future__ import annotations

import asyncio
import json
import logging

import pytest
from asgiref.sync import sync_to_async
from django.test import Client, override_settings
from django.urls import reverse

from aitp import live, store, tenancy
from aitp.models import Session
from tenants.models import TenantMembership
from tests.aitp.conftest import Page
from tests.operators.conftest import CONSUMER_PATIENCE, ORIGIN, make_session, make_user

pytestmark = [pytest.mark.django_db(transaction=True)]

in_db = sync_to_async


def is_type(kind: str):
    return lambda message: message["type"] == kind


async def test_an_anonymous_visitor_is_refused_with_4403(watch, acme_session):
    watcher = await watch(None)
    assert await watcher.recv() == {"type": "__close__", "code": 4403}


async def test_a_signed_in_user_without_staff_status_is_refused(watch, carl):
    watcher = await watch(carl)
    assert (await watcher.recv())["code"] == 4403


async def test_a_page_of_another_site_cannot_use_an_operators_cookie(watch, olivia):
    watcher = await watch(olivia, origin="https://evil.example")
    assert (await watcher.recv())["code"] == 4403


async def test_the_admin_site_itself_may_open_the_socket(watch, olivia, acme_session):
    watcher = await watch(olivia, origin="http://testserver")
    await watcher.send(type="list")
    assert [row["id"] for row in (await watcher.recv())["sessions"]] == ["ses_acme"]
    await watcher.close()


async def test_the_list_holds_only_the_operators_live_sessions(
    watch, olivia, acme_session, globex_session
):
    watcher = await watch(olivia)
    await watcher.send(type="list")
    message = await watcher.recv()
    assert message["type"] == "sessions"
    assert [row["id"] for row in message["sessions"]] == ["ses_acme"]
    assert message["sessions"][0]["detail_url"] == "/admin/live/ses_acme/"
    await watcher.close()


async def test_an_operator_gets_her_tenants_events_and_never_another_tenants(
    watch, olivia, acme_session, globex_session
):
    watcher = await watch(olivia)
    await Session.objects.filter(pk="ses_acme").aupdate(state=Session.State.ANSWERING)
    await live.publish_session(globex_session, "state", state="answering")
    await live.publish_session(acme_session, "state", state="answering")
    message = await watcher.recv()
    assert message["type"] == "session"
    assert message["session"]["id"] == "ses_acme"
    # The row is read again from the database, not copied from the event.
    assert message["session"]["state"] == "answering"
    assert message["session"]["tenant"] == "acme"
    await watcher.close()


async def test_a_superuser_gets_every_tenants_events_once(watch, root, acme_session, globex_session):
    watcher = await watch(root)
    await live.publish_session(globex_session, "opened")
    await live.publish_session(acme_session, "opened")
    first, second = await watcher.recv(), await watcher.recv()
    assert [first["session"]["id"], second["session"]["id"]] == ["ses_globex", "ses_acme"]
    await watcher.send(type="list")
    assert (await watcher.recv())["type"] == "sessions"  # no duplicate event in between
    await watcher.close()


async def acme_alone_is_listed_and_shown(watcher, acme_session, globex_session) -> None:
    """The list comes again with Acme's session alone, and of the two
    sessions' changes only Acme's reaches the socket."""
    listed = await watcher.recv()
    assert listed["type"] == "sessions"
    assert [row["id"] for row in listed["sessions"]] == ["ses_acme"]
    await live.publish_session(globex_session, "state", state="answering")
    await live.publish_session(acme_session, "state", state="answering")
    assert (await watcher.recv())["session"]["id"] == "ses_acme"


async def test_an_operator_removed_from_a_tenant_stops_getting_its_rows(
    watch, olivia, acme_session, globex
):
    await TenantMembership.objects.acreate(tenant=globex, user=olivia)
    globex_session = await in_db(make_session)(globex, "ses_globex2")
    watcher = await watch(olivia)
    await TenantMembership.objects.filter(user=olivia, tenant=globex).adelete()
    # At once, the list again: without the tenant's sessions.
    await acme_alone_is_listed_and_shown(watcher, acme_session, globex_session)
    await watcher.close()


async def test_an_operator_who_is_no_longer_staff_is_closed_and_the_log_names_her(
    watch, olivia, acme_session, caplog
):
    # The project's logging does not pass this logger's records up to the root.
    consumer_log = logging.getLogger("operators.consumer")
    consumer_log.addHandler(caplog.handler)
    try:
        watcher = await watch(olivia)

        olivia.is_staff = False
        await olivia.asave(update_fields=["is_staff"])

        assert await watcher.recv() == {"type": "__close__", "code": 4403}
    finally:
        consumer_log.removeHandler(caplog.handler)
    assert f"watch socket of user {olivia.pk} closed: no longer allowed to watch" in [
        r.getMessage() for r in caplog.records if r.name == "operators.consumer"]


async def test_an_operator_added_to_a_tenant_gets_its_rows_at_once(
    watch, olivia, acme_session, globex_session
):
    watcher = await watch(olivia)
    await TenantMembership.objects.acreate(tenant=globex_session.tenant, user=olivia)
    # At once, the list again: with the tenant's sessions, and its events from now on.
    listed = await watcher.recv()
    assert listed["type"] == "sessions"
    assert sorted(row["id"] for row in listed["sessions"]) == ["ses_acme", "ses_globex"]
    await live.publish_session(globex_session, "state", state="answering")
    assert (await watcher.recv())["session"]["id"] == "ses_globex"
    await watcher.close()


async def test_a_second_change_of_access_reaches_the_socket_as_the_first_did(
    watch, olivia, acme_session, globex
):
    await TenantMembership.objects.acreate(tenant=globex, user=olivia)
    watcher = await watch(olivia)
    await TenantMembership.objects.filter(user=olivia, tenant=globex).adelete()
    assert (await watcher.recv())["type"] == "sessions"

    olivia.is_staff = False
    await olivia.asave(update_fields=["is_staff"])

    assert await watcher.recv() == {"type": "__close__", "code": 4403}


async def test_a_change_that_leaves_an_operators_tenants_as_they_were_still_sends_the_list_again(
    watch, olivia, acme_session
):
    watcher = await watch(olivia)
    await olivia.asave(update_fields=["is_staff"])
    listed = await watcher.recv()
    assert listed["type"] == "sessions"
    assert [row["id"] for row in listed["sessions"]] == ["ses_acme"]
    await watcher.close()


async def test_a_recheck_that_finds_nothing_changed_sends_nothing(
    watch, olivia, acme_session, monkeypatch
):
    from operators import consumer

    reads: list[int] = []  # the socket's reads of the user's tenants: at connect, then per re-check
    real = consumer.tenant_ids_for_user
    monkeypatch.setattr(consumer, "tenant_ids_for_user", lambda user: reads.append(user.pk) or real(user))
    with override_settings(OWLLAYER_HEARTBEAT_INTERVAL=0.5):
        watcher = await watch(olivia)
        await asyncio.wait_for(_until(lambda: len(reads) >= 3), CONSUMER_PATIENCE)
        await live.publish_session(acme_session, "state", state="answering")
        # The first message is the event: no re-check sent the list.
        assert (await watcher.recv())["type"] == "session"
        await watcher.close()


async def test_a_tenant_lost_with_no_notice_is_left_at_the_next_recheck_and_the_list_sent_again(
    watch, olivia, acme_session, globex
):
    await TenantMembership.objects.acreate(tenant=globex, user=olivia)
    globex_session = await in_db(make_session)(globex, "ses_globex2")
    someone = await in_db(make_user)("ursula", staff=False)
    with override_settings(OWLLAYER_HEARTBEAT_INTERVAL=0.5):
        watcher = await watch(olivia)
        # A queryset update sends no signal, so no notice.
        await TenantMembership.objects.filter(user=olivia, tenant=globex).aupdate(user=someone)
        await acme_alone_is_listed_and_shown(watcher, acme_session, globex_session)
        await watcher.close()


async def _until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.05)


async def test_a_closed_session_is_sent_as_no_longer_live(watch, olivia, acme_session):
    watcher = await watch(olivia)
    await in_db(store.current().session_close)(session_id="ses_acme", code=1000)
    await live.publish_session(acme_session, "closed", code=1000)
    row = (await watcher.recv())["session"]
    assert (row["live"], row["state"], row["close_code"]) == (False, "ended", 1000)
    await watcher.close()


async def test_a_subscription_streams_the_sessions_frames(watch, olivia, acme_session):
    watcher = await watch(olivia)
    await watcher.send(type="subscribe", session_id="ses_acme")
    subscribed = await watcher.recv()
    assert subscribed["type"] == "subscribed" and subscribed["session"]["id"] == "ses_acme"
    text = json.dumps({"type": "AGENT_RESPONSE", "payload": {"chunk": "Hel", "done": False}})
    await live.publish_frame(acme_session, "out", text)
    assert await watcher.recv() == {
        "type": "frame", "session_id": "ses_acme", "direction": "out", "text": text,
    }
    await watcher.close()


async def test_subscribing_to_another_tenants_session_is_refused_and_streams_nothing(
    watch, olivia, acme_session, globex_session
):
    watcher = await watch(olivia)
    await watcher.send(type="subscribe", session_id="ses_globex")
    assert await watcher.recv() == {"type": "error", "message": "no such session"}
    await watcher.send(type="subscribe", session_id="ses_acme")
    assert (await watcher.recv())["type"] == "subscribed"
    await live.publish_frame(globex_session, "out", '{"type": "SECRET"}')
    await live.publish_frame(acme_session, "out", '{"type": "MINE"}')
    assert (await watcher.recv())["text"] == '{"type": "MINE"}'
    await watcher.close()


async def test_a_socket_watches_one_session_at_a_time(watch, root, acme_session, globex_session):
    watcher = await watch(root)
    await watcher.send(type="subscribe", session_id="ses_acme")
    await watcher.recv()
    await watcher.send(type="subscribe", session_id="ses_globex")
    await watcher.recv()
    await live.publish_frame(acme_session, "out", '{"type": "OLD"}')
    await live.publish_frame(globex_session, "out", '{"type": "NEW"}')
    assert (await watcher.recv())["text"] == '{"type": "NEW"}'
    await watcher.send(type="unsubscribe")
    assert (await watcher.recv())["type"] == "unsubscribed"
    await watcher.close()


@pytest.mark.parametrize("text, error", [
    ("not json", "send a json object as text"),
    ("[1, 2]", "send a json object as text"),
    ('{"type": "watch.event"}', "unknown message type"),
    ('{"type": "subscribe"}', "subscribe needs a session_id"),
])
async def test_a_malformed_message_gets_an_error_and_the_socket_stays_open(
    watch, olivia, acme_session, text, error
):
    watcher = await watch(olivia)
    await watcher.ws.send_to(text_data=text)
    assert await watcher.recv() == {"type": "error", "message": error}
    await watcher.send(type="list")
    assert (await watcher.recv())["type"] == "sessions"
    await watcher.close()


# --- with a real page on the AITP socket -------------------------------------------


async def open_page(raw_key: str) -> Page:
    from channels.testing import WebsocketCommunicator

    from owllayer_site.asgi import application

    communicator = WebsocketCommunicator(application, "/owllayer", headers=[(b"origin", ORIGIN.encode())])
    connected, _ = await communicator.connect(timeout=CONSUMER_PATIENCE)
    assert connected
    page = Page(communicator)
    ack = await page.handshake(raw_key)
    assert ack["type"] == "HANDSHAKE_ACK", ack
    return page


@pytest.fixture
def acme_key(acme):
    key, raw = tenancy.key_create(tenant=acme, name="web", allowed_origins=[ORIGIN])
    return raw


async def test_an_operator_sees_a_page_open_navigate_and_its_answer_stream_in(
    watch, olivia, acme_key
):
    watcher = await watch(olivia)
    page = await open_page(acme_key)
    opened = await watcher.recv_until(is_type("session"))
    session_id = opened["session"]["id"]
    assert opened["session"]["live"] is True and opened["session"]["tenant"] == "acme"

    await page.context(url="/products/owl", title="The owl")
    moved = await watcher.recv_until(
        lambda m: m["type"] == "session" and m["session"]["url"] == "/products/owl"
    )
    assert moved["session"]["title"] == "The owl"

    await watcher.send(type="subscribe", session_id=session_id)
    await watcher.recv_until(is_type("subscribed"))
    said = await page.send("USER_INPUT", {"modality": "text", "content": "hello"})
    frames = []
    while True:
        message = await watcher.recv_until(is_type("frame"))
        frame = json.loads(message["text"])
        frames.append((message["direction"], frame))
        if frame["type"] == "AGENT_RESPONSE" and frame["payload"]["done"]:
            break
    assert frames[0] == ("in", said)
    assert said["payload"] == {"modality": "text", "content": "hello"}
    deltas = "".join(f["payload"]["chunk"] for d, f in frames
                     if f["type"] == "AGENT_RESPONSE" and not f["payload"]["done"])
    final = frames[-1][1]["payload"]["chunk"]
    assert final and deltas == final
    await page.close()
    await watcher.close()


async def test_ending_a_session_from_the_admin_closes_the_page_with_1008(
    watch, olivia, acme_key
):
    watcher = await watch(olivia)
    page = await open_page(acme_key)
    session_id = (await watcher.recv_until(is_type("session")))["session"]["id"]

    browser = Client()
    await in_db(browser.force_login)(olivia)
    url = reverse("operators:live_session_command", args=[session_id])
    response = await in_db(browser.post)(url, {"command": "end", "message": "Closing for maintenance."})
    assert response.status_code == 302

    event = await page.recv_until("SYSTEM_EVENT", kind="disconnect")
    assert event["payload"]["message"] == "Closing for maintenance."
    assert (await page.recv())["code"] == 1008
    closed = await watcher.recv_until(lambda m: m["type"] == "session" and not m["session"]["live"])
    assert closed["session"]["id"] == session_id
    await watcher.close()
