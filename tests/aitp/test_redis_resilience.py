"""Redis is infrastructure, not a single point of death.

Pages and operator watch sockets on a daphne process with a Redis channel
layer stay open while they sit idle for longer than the layer's blocking read
and the Redis socket timeout, and while Redis goes away and comes back empty;
what Redis carried (group memberships) is restored, so operator feeds and
approvals decided after the restart reach their sessions again.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import websockets
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model

from aitp import tenancy
from aitp.close_codes import FINAL_CODES
from aitp.models import ConversationMessage, ToolCall
from aitp_client import AitpClient, final_text
from approvals.models import Approval
from demo.models import DemoOrder
from demo.order_tools import demo_tools_install
from tenants.models import TenantMembership
from tests.aitp.conftest import ADD_TO_CART
from tests.support.daphne import free_port
from tests.support.people import admin_sign_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

REDIS_SERVER = "/usr/bin/redis-server"
PAGE_ORIGIN = "http://shop.example"
# channels-redis waits 5 s per blocking read and the Redis socket timeout is
# 15 s (the settings' defaults): more than 20 s idle spans four blocking reads
# and outlasts the socket timeout; before the fix every socket died at ~5 s.
IDLE_SECONDS = 21
# Generous bounds for one turn, a log line, Redis starting: they only turn a
# hang into a failure with a message, they are not what is measured.
TURN_TIMEOUT = 30.0
EVENT_TIMEOUT = 30.0
# Codes the deployed client treats as final (protocol.md §10): no
# infrastructure fault may send them.
FINAL_CLOSE_CODES = FINAL_CODES

UNREACHABLE_LINE = "channel layer: Redis is unreachable"
BACK_LINE = "channel layer: Redis is back"


# --- a Redis server of the test's own ------------------------------------------

class OwnRedis:
    """A redis-server on a free 127.0.0.1 port, keeping nothing on disk, that
    the test can kill and start again on the same port."""

    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.directory = directory
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", str(self.directory)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + EVENT_TIMEOUT
        while not self.answers():
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server not answering on {self.port}")
            time.sleep(0.05)

    def answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as conn:
                conn.sendall(b"PING\r\n")
                return conn.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """As a crash: no shutdown, nothing saved."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(EVENT_TIMEOUT)


@pytest.fixture
def own_redis(tmp_path):
    if not os.path.exists(REDIS_SERVER):
        if os.environ.get("CI") == "true":
            pytest.fail(f"{REDIS_SERVER} is missing in CI")
        pytest.skip(f"needs {REDIS_SERVER} (Debian's redis-server package)")
    server = OwnRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.kill()


# --- the shop, its operator and its pages ---------------------------------------

@pytest.fixture
def shop(db):
    tenant = tenancy.tenant_create(slug="shop", name="Shop")
    demo_tools_install(tenant=tenant, policy="operator")
    _, raw = tenancy.key_create(
        tenant=tenant, name="web", allowed_origins=[PAGE_ORIGIN], max_sessions=60
    )
    operator = get_user_model().objects.create_user("olga", password="pw-olga-123", is_staff=True)
    TenantMembership.objects.create(tenant=tenant, user=operator, role="owner")
    return tenant, raw


def layer_env(redis_url: str | None = None) -> dict:
    """The daphne environment for a Redis channel layer of this test's own."""
    env = {"OWLLAYER_CHANNEL_PREFIX": f"owl-redis-test-{os.getpid()}-{time.monotonic_ns()}"}
    if redis_url is not None:
        env["REDIS_URL"] = redis_url
    return env


async def open_page(server, raw: str) -> AitpClient:
    page = AitpClient(server.ws_url(), api_key=raw, origin=PAGE_ORIGIN)
    await page.connect()
    await page.context_update("/product", "Headphones", [ADD_TO_CART], {"price": 149.99})
    await page.recv_until(
        lambda f: f["type"] == "SYSTEM_EVENT" and f["payload"]["kind"] == "tools_effective")
    return page


async def run_page_tool_turn(page: AitpClient, quantity: int) -> list[dict]:
    """One whole turn: USER_INPUT -> TOOL_CALL -> TOOL_RESULT -> answer -> done."""
    return await page.say(
        f'/tool add_to_cart {{"quantity": {quantity}}}',
        on_tool_call=lambda name, args: {"added": args["quantity"], "cartTotal": 149.99 * args["quantity"]},
        timeout=TURN_TIMEOUT,
    )


def assert_open(pages: list[AitpClient]) -> None:
    closed = [(page.session_id, page.close_code) for page in pages if page.close_code is not None]
    assert closed == [], f"pages closed: {closed}"


async def sign_in(http: httpx.AsyncClient) -> None:
    await admin_sign_in(http, "olga", "pw-olga-123")


def open_watch(server, http: httpx.AsyncClient):
    cookie = "; ".join(f"{name}={value}" for name, value in http.cookies.items())
    return websockets.connect(
        f"ws://127.0.0.1:{server.port}/ws/operators/",
        additional_headers={"Cookie": cookie}, proxy=None,
    )


async def next_message(watch, predicate, timeout: float = EVENT_TIMEOUT) -> dict:
    async with asyncio.timeout(timeout):
        while True:
            message = json.loads(await watch.recv())
            if predicate(message):
                return message


async def wait_for_log(server, text: str, timeout: float = EVENT_TIMEOUT) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while text not in server.logs():
        assert server.running, server.logs()
        assert asyncio.get_running_loop().time() < deadline, (
            f"no {text!r} in the server's log within {timeout}s:\n{server.logs()[-3000:]}")
        await asyncio.sleep(0.1)


async def close_all(pages: list[AitpClient], server) -> None:
    await asyncio.gather(*(page.close() for page in pages), return_exceptions=True)
    # Shown by pytest only when the test fails.
    print(server.logs()[-20000:])


# --- held open ----------------------------------------------------------------------

@pytest.mark.redis
async def test_idle_pages_and_a_watch_socket_on_redis_stay_open_and_then_run_turns(
    daphne_factory, shop
):
    _, raw = shop
    server = daphne_factory(layer_env())
    pages: list[AitpClient] = []
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        await sign_in(http)
        async with open_watch(server, http) as watch:
            try:
                pages = list(await asyncio.gather(*(open_page(server, raw) for _ in range(10))))
                await asyncio.sleep(IDLE_SECONDS)
                assert_open(pages)
                assert watch.close_code is None

                turns = await asyncio.gather(
                    *(run_page_tool_turn(page, n + 1) for n, page in enumerate(pages)))
                for n, frames in enumerate(turns):
                    assert f"{149.99 * (n + 1)}" in final_text(frames)
                assert_open(pages)
                # The watch socket still hears of the sessions' changes.
                changed = await next_message(
                    watch, lambda m: m["type"] == "session"
                    and m["session"]["id"] == pages[0].session_id and m["session"]["turns"] >= 1)
                assert changed["session"]["live"]
            finally:
                await close_all(pages, server)
    assert "Redis is unreachable" not in server.logs()


# --- Redis restarts under open sessions --------------------------------------------------

async def test_a_redis_restart_keeps_sessions_open_and_an_approval_decided_after_it_resumes_its_turn(
    daphne_factory, shop, own_redis
):
    tenant, raw = shop
    server = daphne_factory(layer_env(own_redis.url))
    pages: list[AitpClient] = []
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        await sign_in(http)
        async with open_watch(server, http) as watch:
            try:
                pages = list(await asyncio.gather(*(open_page(server, raw) for _ in range(3))))
                waiting_page = pages[0]
                await waiting_page.user_input('/tool cancel_order {"number": "A1003"}')
                waiting = await waiting_page.recv_until(
                    lambda f: f["type"] == "SYSTEM_EVENT" and f["payload"]["kind"] == "waiting",
                    timeout=TURN_TIMEOUT)
                assert "operator" in waiting["payload"]["message"]

                own_redis.kill()
                await wait_for_log(server, UNREACHABLE_LINE)
                # Redis away: the pages stay, and a turn still runs.
                frames = await run_page_tool_turn(pages[1], 1)
                assert "149.99" in final_text(frames)
                assert_open(pages)

                own_redis.start()
                await wait_for_log(server, BACK_LINE)
                logs = server.logs()
                assert logs.count(UNREACHABLE_LINE) == 1, logs
                assert logs.count(BACK_LINE) == 1, logs

                # The operator's feed came back with the groups: a session
                # opened now shows up on the watch socket.
                late = await open_page(server, raw)
                pages.append(late)
                await next_message(
                    watch, lambda m: m["type"] == "session" and m["session"]["id"] == late.session_id)

                # Decided after the restart, the approval resumes its turn.
                approval = await Approval.objects.aget(tool_call__name="cancel_order")
                answer = await http.post(
                    f"/admin/live/{waiting_page.session_id}/approvals/{approval.id}/decide/",
                    data={"decision": "approve", "note": "customer asked",
                          "csrfmiddlewaretoken": http.cookies["csrftoken"]},
                )
                assert answer.status_code == 302, answer.text[:500]
                done = await waiting_page.recv_until(
                    lambda f: f["type"] == "AGENT_RESPONSE" and f["payload"]["done"],
                    timeout=TURN_TIMEOUT)
                assert "cancel_order" in done["payload"]["chunk"]
                order = await DemoOrder.objects.aget(tenant=tenant, number="A1003")
                assert order.status == "cancelled"

                # Every session, old and new, still runs turns.
                turns = await asyncio.gather(
                    *(run_page_tool_turn(page, 2) for page in pages))
                assert all("299.98" in final_text(frames) for frames in turns)
                assert_open(pages)
                assert watch.close_code is None
            finally:
                await close_all(pages, server)
    codes = await database_sync_to_async(list)(
        ToolCall.objects.filter(session__tenant=tenant).values_list("status", flat=True))
    assert codes and set(codes) <= {"success"}


# --- 50 sessions on PostgreSQL + Redis ------------------------------------------------

SOAK_SESSIONS = 50
SOAK_TURNS = 2


def stored_conversation(session_id: str) -> tuple[list[str], list[str], int]:
    """(the user's typed texts, the assistant's texts, tool_use blocks) as stored."""
    typed, answers, tool_uses = [], [], 0
    for message in ConversationMessage.objects.filter(session_id=session_id).order_by("seq"):
        for block in message.content:
            if block.get("type") == "text" and message.role == "user":
                if not block["text"].startswith("[page]"):
                    typed.append(block["text"])
            elif block.get("type") == "text":
                answers.append(block["text"])
            elif block.get("type") == "tool_use":
                tool_uses += 1
    return typed, answers, tool_uses


@pytest.mark.redis
async def test_fifty_sessions_held_open_then_running_turns_keep_a_true_record(daphne_factory, shop):
    tenant, raw = shop
    server = daphne_factory(layer_env())
    pages: list[AitpClient] = []
    # Opens in small batches: what is under test is holding and using them.
    opening = asyncio.Semaphore(10)

    async def opened() -> AitpClient:
        async with opening:
            return await open_page(server, raw)

    try:
        pages = list(await asyncio.gather(*(opened() for _ in range(SOAK_SESSIONS))))
        await asyncio.sleep(IDLE_SECONDS)
        assert_open(pages)

        async def turns(page: AitpClient) -> list[list[dict]]:
            return [await run_page_tool_turn(page, n + 1) for n in range(SOAK_TURNS)]

        seen = dict(zip(
            (page.session_id for page in pages),
            await asyncio.gather(*(turns(page) for page in pages)),
            strict=True,
        ))
        assert_open(pages)
    finally:
        await close_all(pages, server)
    assert all(page.close_code not in FINAL_CLOSE_CODES for page in pages)

    calls = await database_sync_to_async(list)(
        ToolCall.objects.filter(session__tenant=tenant).values_list("session_id", "call_id", "status"))
    sent = {
        frame["payload"]["callId"]
        for frames_of_turns in seen.values() for frames in frames_of_turns
        for frame in frames if frame["type"] == "TOOL_CALL"
    }
    assert len(sent) == SOAK_SESSIONS * SOAK_TURNS
    assert {call_id for _, call_id, _ in calls} == sent
    assert all(status in ToolCall.FINAL_STATUSES for _, _, status in calls)
    assert {status for _, _, status in calls} == {"success"}

    for session_id, frames_of_turns in seen.items():
        typed, answers, tool_uses = await database_sync_to_async(stored_conversation)(session_id)
        assert typed == [f'/tool add_to_cart {{"quantity": {n + 1}}}' for n in range(SOAK_TURNS)]
        assert answers == [final_text(frames) for frames in frames_of_turns]
        assert tool_uses == SOAK_TURNS


# --- the layer itself, in this process ---------------------------------------------------

def own_layer(redis: OwnRedis):
    from owllayer_site.channel_layer import ResilientRedisChannelLayer

    # A 1 s blocking read: the layer looks at Redis every second while idle.
    return ResilientRedisChannelLayer(
        hosts=[{"address": redis.url, "socket_timeout": 5, "socket_connect_timeout": 2}],
        prefix=f"owl-layer-test-{os.getpid()}", blocking_read=1, retry_max=0.5,
    )


async def test_a_channel_that_joins_while_redis_is_away_hears_its_group_once_redis_is_back(own_redis):
    layer = own_layer(own_redis)
    early, late = await layer.new_channel(), await layer.new_channel()
    await layer.group_add("shop", early)
    receiving = asyncio.ensure_future(layer.receive(early))
    try:
        own_redis.kill()
        await layer.group_add("shop", late)  # nothing to join: remembered
        await layer.group_send("shop", {"type": "lost.hint"})  # dropped, not raised
        own_redis.start()
        heard_late = asyncio.ensure_future(layer.receive(late))
        # Once the layer counts Redis as back, both channels are in the group.
        async with asyncio.timeout(EVENT_TIMEOUT):
            while not layer.reachable:
                await asyncio.sleep(0.1)
        assert await layer.connection(0).zscore(layer._group_key("shop"), late)
        assert await layer.connection(0).zscore(layer._group_key("shop"), early)
        await layer.group_send("shop", {"type": "shop.changed"})
        async with asyncio.timeout(EVENT_TIMEOUT):
            assert await receiving == {"type": "shop.changed"}
            assert await heard_late == {"type": "shop.changed"}
    finally:
        receiving.cancel()
        await asyncio.gather(receiving, return_exceptions=True)
        await layer.close_pools()


async def test_groups_come_back_when_redis_restarts_empty_between_two_reads(own_redis):
    layer = own_layer(own_redis)
    channel = await layer.new_channel()
    await layer.group_add("shop", channel)
    receiving = asyncio.ensure_future(layer.receive(channel))
    try:
        # Wait until the layer has left its mark, then restart Redis empty.
        async with asyncio.timeout(EVENT_TIMEOUT):
            while not await layer.connection(0).exists(layer._marker_key()):
                await asyncio.sleep(0.1)
        own_redis.kill()
        own_redis.start()
        async with asyncio.timeout(EVENT_TIMEOUT):
            while not (layer.reachable
                       and await layer.connection(0).zscore(layer._group_key("shop"), channel)):
                await asyncio.sleep(0.1)
        await layer.group_send("shop", {"type": "shop.changed"})
        async with asyncio.timeout(EVENT_TIMEOUT):
            assert await receiving == {"type": "shop.changed"}
    finally:
        receiving.cancel()
        await asyncio.gather(receiving, return_exceptions=True)
        await layer.close_pools()


def test_a_receive_cancelled_while_a_backup_is_cleaned_leaves_the_layer_usable_from_another_loop(
    own_redis, monkeypatch,
):
    # channels-redis cleans each received message's backup copy in a task
    # holding a per-channel lock; the next receive of the process waits on
    # it. Here the cleaning is held until that receive has been cancelled
    # (a page closing), then the layer serves a later event loop.
    from channels_redis.core import RedisChannelLayer

    layer = own_layer(own_redis)
    cleaning_may_go = None
    clean = RedisChannelLayer._clean_receive_backup

    async def held_clean(self, index, channel):
        await cleaning_may_go.wait()
        return await clean(self, index, channel)

    monkeypatch.setattr(RedisChannelLayer, "_clean_receive_backup", held_clean)

    async def a_page_closing_while_a_backup_is_cleaned():
        nonlocal cleaning_may_go
        cleaning_may_go = asyncio.Event()
        first, closing = await layer.new_channel(), await layer.new_channel()
        await layer.send(first, {"type": "first"})
        assert await asyncio.wait_for(layer.receive(first), EVENT_TIMEOUT) == {"type": "first"}
        waiting = asyncio.ensure_future(layer.receive(closing))
        async with asyncio.timeout(EVENT_TIMEOUT):
            while not any(lock._waiters for lock in layer.receive_clean_locks.locks.values()):
                await asyncio.sleep(0.01)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        cleaning_may_go.set()
        await layer.wait_received()
        await layer.close_pools()

    async def two_messages_in_a_row_on_a_later_loop():
        nonlocal cleaning_may_go
        cleaning_may_go = asyncio.Event()
        cleaning_may_go.set()
        channel = await layer.new_channel()
        await layer.send(channel, {"type": "one"})
        await layer.send(channel, {"type": "two"})
        received = [await asyncio.wait_for(layer.receive(channel), EVENT_TIMEOUT) for _ in range(2)]
        await layer.wait_received()
        await layer.close_pools()
        return received

    asyncio.run(a_page_closing_while_a_backup_is_cleaned())
    assert asyncio.run(two_messages_in_a_row_on_a_later_loop()) == [{"type": "one"}, {"type": "two"}]


async def test_joining_groups_takes_one_round_trip_that_also_says_whether_a_group_has_members(
        own_redis, monkeypatch):
    from redis.asyncio.client import Pipeline, Redis

    layer = own_layer(own_redis)
    trips: list[str] = []
    single, batch = Redis.execute_command, Pipeline.execute

    async def one_command(self, *args, **options):
        if not isinstance(self, Pipeline):
            trips.append(str(args[0]))
        return await single(self, *args, **options)

    async def one_pipeline(self, *args, **options):
        trips.append("pipeline")
        return await batch(self, *args, **options)

    channel, watcher = await layer.new_channel(), await layer.new_channel()
    await layer.group_add("watchers", watcher)
    try:
        monkeypatch.setattr(Redis, "execute_command", one_command)
        monkeypatch.setattr(Pipeline, "execute", one_pipeline)
        asked = await layer.groups_add(["shop", "key"], channel, ask="watchers")
        joined, trips[:] = list(trips), []
        members = [await layer.group_has_members(group) for group in ("shop", "key")]
        trips.clear()
        await layer.groups_discard(["shop", "key"], channel)
        left = list(trips)
        remaining = [await layer.group_has_members(group) for group in ("shop", "key")]
        assert (joined, asked, members, left, remaining) == (
            ["pipeline"], True, [True, True], ["pipeline"], [False, False])
    finally:
        monkeypatch.undo()
        await layer.close_pools()


async def test_joins_and_leaves_of_connections_that_meet_in_time_share_one_round_trip(
        own_redis, monkeypatch):
    from redis.asyncio.client import Pipeline

    layer = own_layer(own_redis)
    pipelines = 0
    first_on_its_way, first_may_go = asyncio.Event(), asyncio.Event()
    batch = Pipeline.execute

    async def held_pipeline(self, *args, **options):
        nonlocal pipelines
        pipelines += 1
        if pipelines == 1:
            first_on_its_way.set()
            await first_may_go.wait()
        return await batch(self, *args, **options)

    watching, leaving = await layer.new_channel(), await layer.new_channel()
    await layer.group_add("key", leaving)
    await layer.group_add("watch-b", watching)
    try:
        monkeypatch.setattr(Pipeline, "execute", held_pipeline)
        pages = [await layer.new_channel() for _ in range(3)]
        first = asyncio.ensure_future(layer.groups_add(["a", "key"], pages[0], ask="watch-a"))
        await asyncio.wait_for(first_on_its_way.wait(), EVENT_TIMEOUT)
        later = [
            asyncio.ensure_future(layer.groups_add(["b", "key"], pages[1], ask="watch-b")),
            asyncio.ensure_future(layer.groups_add(["c", "key"], pages[2], ask="watch-c")),
            asyncio.ensure_future(layer.groups_discard(["key"], leaving)),
        ]
        await asyncio.sleep(0)
        first_may_go.set()
        asked = await asyncio.wait_for(asyncio.gather(first, *later), EVENT_TIMEOUT)
        assert (pipelines, asked[:3]) == (2, [False, True, False])
        monkeypatch.undo()
        assert [await layer.group_has_members(group) for group in ("a", "b", "c")] == [True] * 3
        members = await layer.connection(0).zrange(layer._group_key("key"), 0, -1)
        assert sorted(member.decode() for member in members) == sorted(pages)
    finally:
        monkeypatch.undo()
        await layer.close_pools()
