"""An operator who loses access to a tenant stops receiving its sessions at
once, over a real watch socket on a real daphne process.

Olga (staff, owner of Acme) watches a live Acme page's frames. The change is
made over HTTP, as people make it: by Oscar, Acme's other owner, in the
console (remove Olga, make her a viewer), or by Root, a superuser, in the
admin (Olga's staff or active flag off, her account deleted; Sam's
superuser flag off). With Redis, the change is made on a second process.
Each process re-checks its watchers only every 600 s here, so only the
notice of the change can end the watch in time.
"""
from __future__ import annotations

import asyncio
import json
import os
import re

import httpx
import pytest
import websockets
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.test import override_settings

from aitp import tenancy
from aitp_client import AitpClient
from tenants.models import TenantMembership
from tests.operators.conftest import CONSUMER_PATIENCE
from tests.support.people import admin_sign_in

pytestmark = [pytest.mark.django_db(transaction=True)]

PAGE_ORIGIN = "http://shop.example"
PASSWORD = "pw-long-enough-123"
# A re-check so rare that it cannot end a watch during a test.
NO_RECHECK = 600
# Upper bound for a message the server sends "now".
SOON = 15.0


@pytest.fixture
def people(db):
    tenant = tenancy.tenant_create(slug="acme", name="Acme Store")
    _, raw = tenancy.key_create(tenant=tenant, name="web", allowed_origins=[PAGE_ORIGIN])
    users = get_user_model().objects
    olga = users.create_user("olga", password=PASSWORD, is_staff=True)
    oscar = users.create_user("oscar", password=PASSWORD)
    sam = users.create_user("sam", password=PASSWORD, is_staff=True, is_superuser=True)
    users.create_superuser("root", password=PASSWORD)
    for owner in (olga, oscar):
        TenantMembership.objects.create(tenant=tenant, user=owner, role="owner")
    return {"raw_key": raw, "olga": olga, "sam": sam,
            "olga_membership": TenantMembership.objects.get(user=olga).pk}


@pytest.fixture
def servers(daphne_factory):
    """The process holding the page and the watch socket, and the one where
    the change is made: another one when Redis joins them, else the same."""
    holding = daphne_factory(OWLLAYER_HEARTBEAT_INTERVAL=NO_RECHECK)
    changing = daphne_factory(OWLLAYER_HEARTBEAT_INTERVAL=NO_RECHECK) if os.environ.get("REDIS_URL") else holding
    return holding, changing


async def console_sign_in(http: httpx.AsyncClient, username: str) -> None:
    form = await http.get("/console/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)
    answer = await http.post("/console/login/", data={
        "username": username, "password": PASSWORD, "csrfmiddlewaretoken": token, "next": "/console/"})
    assert answer.status_code == 302, answer.text[:500]


async def post_form(http: httpx.AsyncClient, path: str, data: dict) -> httpx.Response:
    answer = await http.post(path, data={**data, "csrfmiddlewaretoken": http.cookies["csrftoken"]})
    assert answer.status_code == 302, answer.text[:1000]
    return answer


def user_form(user, **flags: bool) -> dict:
    """The admin's change form of an account as it stands, with flags changed."""
    values = {"is_active": user.is_active, "is_staff": user.is_staff,
              "is_superuser": user.is_superuser, **flags}
    form = {
        "username": user.username, "first_name": "", "last_name": "", "email": user.email,
        "date_joined_0": user.date_joined.strftime("%Y-%m-%d"),
        "date_joined_1": user.date_joined.strftime("%H:%M:%S"),
        "last_login_0": "", "last_login_1": "", "_save": "Save",
    }
    form.update({name: "on" for name, on in values.items() if on})
    return form


# --- the ways of losing access ---------------------------------------------------------


async def remove_from_tenant(server, people):
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        await console_sign_in(http, "oscar")
        await post_form(http, f"/console/t/acme/members/{people['olga_membership']}/remove/", {})


async def make_viewer(server, people):
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        await console_sign_in(http, "oscar")
        await post_form(http, f"/console/t/acme/members/{people['olga_membership']}/role/",
                        {"role": "viewer"})


async def change_account(server, user, **flags):
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        await admin_sign_in(http, "root", PASSWORD)
        await post_form(http, f"/admin/auth/user/{user.pk}/change/", user_form(user, **flags))


async def remove_staff_flag(server, people):
    await change_account(server, people["olga"], is_staff=False)


async def deactivate(server, people):
    await change_account(server, people["olga"], is_active=False)


async def remove_superuser_flag(server, people):
    await change_account(server, people["sam"], is_superuser=False)


async def delete_account(server, people):
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        await admin_sign_in(http, "root", PASSWORD)
        await post_form(http, f"/admin/auth/user/{people['olga'].pk}/delete/", {"post": "yes"})


# --- watching ----------------------------------------------------------------------------


class Watch:
    """The watch socket, keeping every message it received."""

    def __init__(self, socket):
        self.socket = socket
        self.seen: list[dict] = []

    async def until(self, predicate) -> dict:
        while True:
            message = json.loads(await asyncio.wait_for(self.socket.recv(), SOON))
            self.seen.append(message)
            if predicate(message):
                return message

    async def closed(self) -> int:
        with pytest.raises(websockets.ConnectionClosed):
            await self.until(lambda message: False)
        return self.socket.close_code

    def frames(self) -> list[dict]:
        return [message for message in self.seen if message["type"] == "frame"]


async def watching(server, username: str, session_id: str, http: httpx.AsyncClient):
    await admin_sign_in(http, username, PASSWORD)
    cookie = "; ".join(f"{name}={value}" for name, value in http.cookies.items())
    socket = await websockets.connect(f"ws://127.0.0.1:{server.port}/ws/operators/",
                                      additional_headers={"Cookie": cookie}, proxy=None)
    watch = Watch(socket)
    await socket.send(json.dumps({"type": "subscribe", "session_id": session_id}))
    await watch.until(lambda m: m["type"] == "subscribed")
    return watch


def is_last_frame_of_a_turn(message: dict) -> bool:
    if message["type"] != "frame":
        return False
    frame = json.loads(message["text"])
    return frame["type"] == "AGENT_RESPONSE" and frame["payload"]["done"]


async def a_turn(page: AitpClient) -> None:
    await page.user_input("hello")
    await page.recv_until(lambda f: f["type"] == "AGENT_RESPONSE" and f["payload"]["done"])


@pytest.mark.parametrize("lose_access, watcher", [
    (remove_from_tenant, "olga"),
    (remove_superuser_flag, "sam"),
], ids=["membership removed", "superuser flag removed"])
async def test_an_operator_who_can_no_longer_see_a_tenant_stops_getting_its_frames_at_once(
    servers, people, lose_access, watcher
):
    holding, changing = servers
    async with httpx.AsyncClient(base_url=holding.http_url) as http, \
            AitpClient(holding.ws_url(), api_key=people["raw_key"], origin=PAGE_ORIGIN) as page:
        watch = await watching(holding, watcher, page.session_id, http)
        await a_turn(page)
        await watch.until(is_last_frame_of_a_turn)
        watch.seen.clear()

        await lose_access(changing, people)

        # At once, with nothing else happening: the subscription is dropped
        # and the list is sent again, without the tenant's sessions.
        listed = await watch.until(lambda m: m["type"] == "sessions")
        assert {"type": "error", "message": "no such session"} in watch.seen
        assert listed["sessions"] == []
        await a_turn(page)
        await watch.socket.send(json.dumps({"type": "list"}))
        await watch.until(lambda m: m["type"] == "sessions")
        assert watch.frames() == []
        await watch.socket.close()


@pytest.mark.parametrize("lose_access", [remove_staff_flag, deactivate, delete_account],
                         ids=["staff flag removed", "account deactivated", "account deleted"])
async def test_an_operator_who_may_no_longer_watch_is_closed_at_once(servers, people, lose_access):
    holding, changing = servers
    async with httpx.AsyncClient(base_url=holding.http_url) as http, \
            AitpClient(holding.ws_url(), api_key=people["raw_key"], origin=PAGE_ORIGIN) as page:
        watch = await watching(holding, "olga", page.session_id, http)

        await lose_access(changing, people)

        assert await watch.closed() == 4403
        assert watch.frames() == []
        await a_turn(page)  # the page is not disturbed


async def test_an_operator_made_a_viewer_keeps_watching_and_is_sent_the_list_again(servers, people):
    """A viewer sees everything (and changes nothing): the watch goes on,
    checked again at once."""
    holding, changing = servers
    async with httpx.AsyncClient(base_url=holding.http_url) as http, \
            AitpClient(holding.ws_url(), api_key=people["raw_key"], origin=PAGE_ORIGIN) as page:
        watch = await watching(holding, "olga", page.session_id, http)

        await make_viewer(changing, people)

        listed = await watch.until(lambda m: m["type"] == "sessions")
        assert [row["id"] for row in listed["sessions"]] == [page.session_id]
        await page.user_input("still there?")
        frame = await watch.until(lambda m: m["type"] == "frame")
        assert "still there?" in frame["text"]
        await watch.socket.close()


# --- a change that sends no notice --------------------------------------------------------


async def test_a_change_no_notice_announces_is_caught_by_the_sockets_own_recheck(people):
    """A queryset update sends no signal: the socket's re-check, every
    OWLLAYER_HEARTBEAT_INTERVAL, closes it all the same."""
    from channels.testing import WebsocketCommunicator

    from owllayer_site.asgi import application
    from tests.operators.conftest import session_cookie

    with override_settings(OWLLAYER_HEARTBEAT_INTERVAL=0.5):
        communicator = WebsocketCommunicator(application, "/ws/operators/", headers=[
            (b"host", b"testserver"), (b"cookie", await session_cookie(people["olga"]))])
        connected, _ = await communicator.connect(timeout=CONSUMER_PATIENCE)
        assert connected
        await communicator.send_to(text_data=json.dumps({"type": "list"}))
        assert json.loads(await communicator.receive_from(CONSUMER_PATIENCE))["type"] == "sessions"

        await sync_to_async(get_user_model().objects.filter(pk=people["olga"].pk).update)(is_staff=False)

        closed = await communicator.receive_output(CONSUMER_PATIENCE)
        assert (closed["type"], closed.get("code")) == ("websocket.close", 4403)
        await communicator.disconnect(timeout=CONSUMER_PATIENCE)


def test_a_change_of_what_an_account_may_watch_tells_its_sockets_and_a_sign_in_does_not(
    monkeypatch
):
    from aitp import notify

    account = get_user_model().objects.create_user("oscar", password="not-used-here", is_staff=True)
    sent: list[tuple[str, str]] = []
    monkeypatch.setattr(notify, "send", lambda group, event_type, **fields: sent.append(
        (group, event_type)))

    account.is_staff = False
    account.save(update_fields=["is_staff"])
    assert sent == [(f"operators.watcher.{account.pk}", "watch.access")]

    account.save(update_fields=["last_login"])
    assert sent == [(f"operators.watcher.{account.pk}", "watch.access")]


def test_deleting_an_account_tells_its_watch_sockets(monkeypatch):
    from aitp import notify

    account = get_user_model().objects.create_user("oscar", password="not-used-here", is_staff=True)
    group = f"operators.watcher.{account.pk}"
    sent: list[tuple[str, str]] = []
    monkeypatch.setattr(notify, "send", lambda group, event_type, **fields: sent.append(
        (group, event_type)))

    account.delete()

    assert sent == [(group, "watch.access")]
