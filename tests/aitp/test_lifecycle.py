"""Stops, crashes and restarts: what a page sees and what the record keeps.

A daphne process stopped with SIGTERM tells every page to reconnect
(SYSTEM_EVENT disconnect, close 1001) and leaves nothing open or half
written; one killed with SIGKILL is recognised as gone by the next process
that starts (or by any running process), whatever the age of its rows, so
its keys' session caps are free at once.
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import weakref
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from aitp import processes, store, tenancy
from aitp.models import ServerProcess, Session, ToolCall
from aitp_client import AitpClient, AitpRefused
from approvals import services as approvals
from approvals.models import Approval, AuditEvent
from approvals.services import ApprovalError
from tests.aitp.conftest import ADD_TO_CART
from tests.support.people import make_session, make_tool_call, make_user

ORIGIN = "http://page.example"
PAY = {
    "name": "pay",
    "description": "Pay with the saved card",
    "parameters": {
        "type": "OBJECT",
        "properties": {"amount": {"type": "NUMBER", "description": "How much"}},
        "required": ["amount"],
    },
    "risk": "critical",
}
# Nothing in these tests waits on a tool or an approval timing out.
LONG_TIMEOUT = 600
# The server's drain time in the SIGTERM tests, and how long past it the
# test waits for the process to exit: generous, a slow machine still passes.
DRAIN = 20.0
EXIT_MARGIN = 30.0
# Upper bound for a frame or a row the server writes "now".
SOON = 15.0
POLL_INTERVAL = 0.05


# --- helpers ----------------------------------------------------------------------------


@pytest.fixture
def shop(db):
    tenant = tenancy.tenant_create(slug="lifecycle", name="Lifecycle")
    key, raw = tenancy.key_create(tenant=tenant, name="web", allowed_origins=[ORIGIN],
                                  max_sessions=3)
    return key, raw


def page_for(server, raw_key: str) -> AitpClient:
    return AitpClient(server.ws_url(), api_key=raw_key, origin=ORIGIN)


async def eventually(predicate, *, timeout: float = SOON, what: str = "condition") -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        if await database_sync_to_async(predicate)():
            return
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(POLL_INTERVAL)


async def logged(server, line: str, *, timeout: float) -> None:
    """Until the server's log holds ``line``: a process writes its log line
    after the change it reports is committed, so a test that saw the change
    may still be ahead of the line."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while line not in server.logs():
        if loop.time() > deadline:
            raise AssertionError(f"{line!r} not in the server's log after {timeout}s:\n{server.logs()}")
        await asyncio.sleep(POLL_INTERVAL)


async def start_tool_call(page: AitpClient) -> dict:
    """A turn waiting on the page's add_to_cart call (never answered)."""
    await page.context_update("/product", "Headphones", [ADD_TO_CART], {"price": 149.99})
    await page.recv_until(lambda f: f["type"] == "SYSTEM_EVENT"
                          and f["payload"]["kind"] == "tools_effective")
    await page.user_input('/tool add_to_cart {"quantity": 2}')
    return await page.recv_until("TOOL_CALL", timeout=SOON)


async def start_approval(page: AitpClient) -> dict:
    """A turn waiting on the page's user to approve a critical payment."""
    await page.context_update("/checkout", "Checkout", [PAY], {"total": 42})
    await page.recv_until(lambda f: f["type"] == "SYSTEM_EVENT"
                          and f["payload"]["kind"] == "tools_effective")
    await page.user_input('/tool pay {"amount": 42}')
    call = await page.recv_until("TOOL_CALL", timeout=SOON)
    payload = call["payload"]
    await page.send("APPROVAL_REQUEST", {
        "callId": payload["callId"], "toolName": payload["name"], "risk": "critical",
        "args": payload["args"], "message": "Pay 42 USD with the saved card?",
    })
    await eventually(
        lambda: Approval.objects.filter(tool_call__call_id=payload["callId"],
                                        status=Approval.Status.PENDING).exists(),
        what="the pending approval",
    )
    return call


def is_disconnect(frame: dict) -> bool:
    return frame["type"] == "SYSTEM_EVENT" and frame["payload"]["kind"] == "disconnect"


def record_of(key):
    """Open rows, unfinished calls, approvals and their audit trail of a key's sessions."""
    sessions = Session.objects.filter(api_key=key)
    calls = ToolCall.objects.filter(session__api_key=key)
    approval_rows = Approval.objects.filter(session__api_key=key)
    return {
        "open_sessions": sessions.filter(ended_at__isnull=True).count(),
        "unfinished_calls": list(
            calls.exclude(status__in=ToolCall.FINAL_STATUSES).values_list("call_id", "status")
        ),
        "call_statuses": sorted(calls.values_list("status", flat=True)),
        "approvals": list(approval_rows.values_list("status", flat=True)),
        "approval_trails": [
            list(AuditEvent.objects.filter(approval_id=a.pk).order_by("seq")
                 .values_list("action", flat=True))
            for a in approval_rows
        ],
    }


# --- SIGTERM ----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_sigterm_tells_every_page_to_reconnect_and_leaves_nothing_open(daphne_factory, shop):
    key, raw = shop
    server = daphne_factory(
        OWLLAYER_SHUTDOWN_DRAIN=DRAIN, OWLLAYER_TOOL_TIMEOUT=LONG_TIMEOUT,
        OWLLAYER_APPROVAL_TIMEOUT=LONG_TIMEOUT,
    )
    mid_turn, mid_approval, idle = (page_for(server, raw) for _ in range(3))
    for page in (mid_turn, mid_approval, idle):
        await page.connect()
    await start_tool_call(mid_turn)
    await start_approval(mid_approval)

    server.process.send_signal(signal.SIGTERM)

    for page in (mid_turn, mid_approval, idle):
        event = await page.recv_until(is_disconnect, timeout=DRAIN)
        assert event["payload"]["message"]
        code, _reason = await page.wait_closed(timeout=DRAIN)
        assert code == 1001
    exit_code = await asyncio.to_thread(server.process.wait, DRAIN + EXIT_MARGIN)
    assert exit_code == 0, server.logs()

    record = await database_sync_to_async(record_of)(key)
    assert record["open_sessions"] == 0
    assert record["unfinished_calls"] == []
    assert record["call_statuses"] == ["disconnected", "disconnected"]
    assert record["approvals"] == ["disconnected"]
    assert record["approval_trails"] == [["requested", "disconnected"]]
    closes = await database_sync_to_async(
        lambda: sorted(Session.objects.filter(api_key=key).values_list("close_code", flat=True))
    )()
    assert closes == [1001, 1001, 1001]
    process = await ServerProcess.objects.aget(pid=server.process.pid)
    assert process.stopped_at is not None


# --- kill -9 ------------------------------------------------------------------------------


async def fill_key_then_kill(daphne_factory, raw: str, *, keep_running=None):
    """Fill the key's cap on a process (one page mid-turn, one mid-approval,
    one idle), then SIGKILL it. Returns the killed server."""
    doomed = daphne_factory(OWLLAYER_TOOL_TIMEOUT=LONG_TIMEOUT, OWLLAYER_APPROVAL_TIMEOUT=LONG_TIMEOUT)
    pages = [page_for(doomed, raw) for _ in range(3)]
    for page in pages:
        await page.connect()
    await start_tool_call(pages[0])
    await start_approval(pages[1])
    doomed.process.send_signal(signal.SIGKILL)
    await asyncio.to_thread(doomed.process.wait, SOON)
    for page in pages:
        code, _ = await page.wait_closed(timeout=SOON)
        assert code == 1006  # the connection was lost, no close frame
    return doomed


async def assert_killed_sessions_closed_and_audited(key, doomed) -> None:
    record = await database_sync_to_async(record_of)(key)
    dead = await database_sync_to_async(lambda: list(
        Session.objects.filter(api_key=key, process__contains=f":{doomed.process.pid}:")
        .values_list("ended_at", "close_code")
    ))()
    assert len(dead) == 3
    assert all(ended is not None and code == 1006 for ended, code in dead)
    assert record["unfinished_calls"] == []
    assert record["call_statuses"] == ["disconnected", "disconnected"]
    assert record["approvals"] == ["disconnected"]
    assert record["approval_trails"] == [["requested", "disconnected"]]


@pytest.mark.django_db(transaction=True)
async def test_after_kill_9_an_immediate_restart_frees_the_key_cap_at_once(daphne_factory, shop):
    key, raw = shop
    doomed = await fill_key_then_kill(daphne_factory, raw)
    # The rows are fresh: the heartbeat rule alone would keep them counting.
    assert await Session.objects.filter(api_key=key, ended_at__isnull=True).acount() == 3

    restarted = daphne_factory()
    async with page_for(restarted, raw) as page:
        assert page.session_id
    await assert_killed_sessions_closed_and_audited(key, doomed)
    dead_process = await ServerProcess.objects.aget(pid=doomed.process.pid)
    assert dead_process.stopped_at is not None


@pytest.mark.django_db(transaction=True)
async def test_a_running_process_does_not_count_a_killed_process_sessions(daphne_factory, shop):
    key, raw = shop
    survivor = daphne_factory()
    doomed = await fill_key_then_kill(daphne_factory, raw)

    # No restart and no sweep yet: the survivor sees the killer's pid is gone.
    async with page_for(survivor, raw) as page:
        assert page.session_id
    # Its periodic sweep (or the next start) closes the dead rows; run one now.
    result = await database_sync_to_async(processes.sweep)()
    assert result.sessions == 3
    await assert_killed_sessions_closed_and_audited(key, doomed)


@pytest.mark.django_db(transaction=True)
async def test_a_full_key_is_still_refused_while_its_sessions_live(daphne_factory, shop):
    key, raw = shop
    server = daphne_factory()
    pages = [page_for(server, raw) for _ in range(3)]
    for page in pages:
        await page.connect()
    with pytest.raises(AitpRefused) as refused:
        await page_for(server, raw).connect()
    assert refused.value.code == "session_limit"
    for page in pages:
        await page.close()


@pytest.mark.django_db(transaction=True)
async def test_a_running_process_sweeps_the_fresh_rows_a_dead_process_left(
    daphne_factory, shop, reaped_pid
):
    key, _raw = shop
    # A heartbeat so slow that the heartbeat rule cannot close anything here.
    sweep_interval = 1.0
    server = daphne_factory(OWLLAYER_HEARTBEAT_INTERVAL=600, OWLLAYER_SWEEP_INTERVAL=sweep_interval)

    def left_behind():
        dead = process_row(pid=reaped_pid)
        return Session.objects.create(id="ses_left", tenant=key.tenant, api_key=key,
                                      process=dead.id)

    row = await database_sync_to_async(left_behind)()
    await eventually(lambda: Session.objects.filter(pk=row.pk, ended_at__isnull=False).exists(),
                     what="the periodic sweep")
    # The sweep that closed the row logs it next, within the same sweep.
    await logged(server, "server processes gone", timeout=SOON + sweep_interval)


@pytest.mark.django_db(transaction=True)
async def test_a_running_process_refreshes_its_row_every_heartbeat(daphne_factory):
    heartbeat = 1.0
    server = daphne_factory(OWLLAYER_HEARTBEAT_INTERVAL=heartbeat)
    own = await ServerProcess.objects.aget(pid=server.process.pid)
    assert own.stopped_at is None
    await eventually(
        lambda: ServerProcess.objects.filter(pk=own.pk, last_seen_at__gt=own.last_seen_at).exists(),
        timeout=SOON + heartbeat, what="the process heartbeat",
    )


# --- the liveness rules -----------------------------------------------------------------


def process_row(**fields) -> ServerProcess:
    now = timezone.now()
    values = {"id": f"test:{fields.get('pid', 1)}:{os.urandom(3).hex()}", "hostname": processes.hostname(),
              "pid": os.getpid(), "started_at": now, "last_seen_at": now, **fields}
    return ServerProcess.objects.create(**values)


@pytest.fixture
def reaped_pid() -> int:
    """The pid of a process that ran and was reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.fixture
def running_child():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield child
    child.kill()
    child.wait()


@pytest.mark.django_db
def test_a_process_on_this_host_whose_pid_runs_is_alive():
    row = process_row(started_at=timezone.now() + timedelta(seconds=1))
    assert not processes.is_gone(row, now=timezone.now())


@pytest.mark.django_db
def test_a_process_marked_stopped_is_gone():
    row = process_row(stopped_at=timezone.now())
    assert processes.is_gone(row, now=timezone.now())


@pytest.mark.django_db
def test_a_process_on_this_host_whose_pid_is_not_running_is_gone(reaped_pid):
    row = process_row(pid=reaped_pid)
    assert processes.is_gone(row, now=timezone.now())


@pytest.mark.django_db
def test_a_process_killed_but_not_yet_reaped_is_gone():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        row = process_row(pid=child.pid, started_at=timezone.now() + timedelta(seconds=1))
        child.kill()
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # dead, still a zombie
        assert processes.is_gone(row, now=timezone.now())
    finally:
        child.wait()


@pytest.mark.django_db
def test_a_pid_reused_by_a_process_started_after_registration_is_gone(running_child):
    row = process_row(pid=running_child.pid, started_at=timezone.now() - timedelta(hours=1))
    assert processes.is_gone(row, now=timezone.now())


@pytest.mark.django_db
def test_a_process_elsewhere_is_alive_while_it_refreshes_its_row_and_gone_after(settings):
    settings.OWLLAYER_HEARTBEAT_INTERVAL = 10
    now = timezone.now()
    fresh = process_row(hostname="other-host", pid=1, last_seen_at=now - timedelta(seconds=29))
    silent = process_row(hostname="other-host", pid=2, last_seen_at=now - timedelta(seconds=31))
    assert not processes.is_gone(fresh, now=now)
    assert processes.is_gone(silent, now=now)


@pytest.mark.django_db
def test_the_sweep_closes_a_gone_process_rows_whatever_their_age_and_keeps_the_rest(
    reaped_pid, settings
):
    settings.OWLLAYER_HEARTBEAT_INTERVAL = 60
    tenant = tenancy.tenant_create(slug="sweep", name="Sweep")
    gone = process_row(pid=reaped_pid)
    alive = process_row(started_at=timezone.now() + timedelta(seconds=1))
    now = timezone.now()
    dead_session = make_session(tenant, process=gone.id, last_seen_at=now)
    live_session = make_session(tenant, process=alive.id, last_seen_at=now)
    sent = make_tool_call(dead_session, name="add_to_cart", arguments={}, risk="low",
                          origin="client", status=ToolCall.Status.SENT)
    waiting = make_tool_call(dead_session, name="pay", arguments={"amount": 1}, risk="critical",
                             origin="client", status=ToolCall.Status.SENT)
    approval = approvals.approval_request_client(
        tool_call=waiting, tool_name="pay", args={"amount": 1}, risk="critical", message="",
        session_id=dead_session.id, timeout=600,
    )
    live_call = make_tool_call(live_session, name="add_to_cart", arguments={}, risk="low",
                               origin="client", status=ToolCall.Status.SENT)

    result = processes.sweep()

    assert (result.processes, result.sessions, result.approvals) == (1, 1, 1)
    dead_session.refresh_from_db()
    live_session.refresh_from_db()
    assert dead_session.ended_at is not None and dead_session.close_code == 1006
    assert live_session.ended_at is None
    for call in (sent, waiting):
        call.refresh_from_db()
        assert call.status == ToolCall.Status.DISCONNECTED and call.finished_at is not None
    live_call.refresh_from_db()
    assert live_call.status == ToolCall.Status.SENT
    approval.refresh_from_db()
    assert approval.status == Approval.Status.DISCONNECTED
    assert list(AuditEvent.objects.filter(approval_id=approval.pk).order_by("seq")
                .values_list("action", flat=True)) == ["requested", "disconnected"]
    gone.refresh_from_db()
    alive.refresh_from_db()
    assert gone.stopped_at is not None and alive.stopped_at is None


@pytest.mark.django_db
def test_the_sweep_closes_a_row_left_open_by_a_process_marked_stopped():
    tenant = tenancy.tenant_create(slug="late", name="Late")
    stopped = process_row(stopped_at=timezone.now())
    late_row = make_session(tenant, process=stopped.id, last_seen_at=timezone.now())

    assert processes.sweep().sessions == 1
    late_row.refresh_from_db()
    assert late_row.ended_at is not None


@pytest.mark.django_db
def test_a_handshake_does_not_count_sessions_of_a_gone_process_against_the_cap(reaped_pid):
    tenant = tenancy.tenant_create(slug="cap", name="Cap")
    key, raw = tenancy.key_create(tenant=tenant, name="web", allowed_origins=[ORIGIN],
                                  max_sessions=1)
    gone = process_row(pid=reaped_pid)
    Session.objects.create(id="ses_dead", tenant=tenant, api_key=key, process=gone.id)

    session, refusal = store.current().session_open(raw_key=raw, info=store.HandshakeInfo(
        session_id="ses_new", origin=ORIGIN, user_agent="pytest", viewport="", sdk_version="",
        protocol_version="1.0.0", channel_name="test", process="",
    ))
    assert refusal is None and session.id == "ses_new"

    _, refused = store.current().session_open(raw_key=raw, info=store.HandshakeInfo(
        session_id="ses_third", origin=ORIGIN, user_agent="pytest", viewport="", sdk_version="",
        protocol_version="1.0.0", channel_name="test",
    ))
    assert refused is not None and refused.code == "session_limit"


# --- approvals of ended sessions -------------------------------------------------------------


def pending_payment(tenant, policy_operator: bool = False):
    session = make_session(tenant)
    call = make_tool_call(session, name="pay", arguments={"amount": 5}, risk="critical",
                          origin="client", status=ToolCall.Status.SENT)
    approval = approvals.approval_request_client(
        tool_call=call, tool_name="pay", args={"amount": 5}, risk="critical", message="",
        session_id=session.id, timeout=600,
    )
    if policy_operator:
        Approval.objects.filter(pk=approval.pk).update(needs_operator=True)
    return session, approval


@pytest.mark.django_db
def test_an_operator_cannot_approve_an_approval_whose_session_has_ended():
    tenant = tenancy.tenant_create(slug="ended", name="Ended")
    operator = make_user("olivia", tenant=tenant)
    session, approval = pending_payment(tenant, policy_operator=True)
    store.current().session_close(session_id=session.id, code=1006, reason="server process lost")

    with pytest.raises(ApprovalError) as refused:
        approvals.approval_decide_operator(approval_id=approval.pk, user=operator, approved=True)

    assert refused.value.code == "session_ended"
    approval.refresh_from_db()
    assert approval.status == Approval.Status.DISCONNECTED and approval.operator_decision is None
    assert list(AuditEvent.objects.filter(approval_id=approval.pk).order_by("seq")
                .values_list("action", flat=True)) == ["requested", "disconnected"]


@pytest.mark.django_db
def test_a_page_answer_for_an_ended_session_approves_nothing():
    tenant = tenancy.tenant_create(slug="ended-page", name="Ended page")
    session, approval = pending_payment(tenant)
    store.current().session_close(session_id=session.id, code=1001, reason="server shutting down")

    with pytest.raises(ApprovalError) as refused:
        approvals.approval_decide_user(approval_id=approval.pk, session_id=session.id, approved=True)

    assert refused.value.code == "session_ended"
    approval.refresh_from_db()
    assert approval.status == Approval.Status.DISCONNECTED and approval.user_decision is None


# --- operators ------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_sigterm_closes_operator_watch_sockets_and_a_server_tool_awaiting_an_operator(
    daphne_factory,
):
    import httpx
    import websockets
    from django.contrib.auth import get_user_model

    from demo.models import DemoOrder
    from demo.order_tools import demo_tools_install
    from tenants.models import TenantMembership
    from tests.operators.test_scale_out import sign_in

    def make_shop():
        tenant = tenancy.tenant_create(slug="shop", name="Shop")
        demo_tools_install(tenant=tenant, policy="operator")
        key, raw = tenancy.key_create(tenant=tenant, name="web", allowed_origins=[ORIGIN])
        operator = get_user_model().objects.create_user("olga", password="pw-olga-123", is_staff=True)
        TenantMembership.objects.create(tenant=tenant, user=operator, role="owner")
        return tenant, key, raw

    tenant, key, raw = await database_sync_to_async(make_shop)()
    server = daphne_factory(OWLLAYER_SHUTDOWN_DRAIN=DRAIN, OWLLAYER_APPROVAL_TIMEOUT=LONG_TIMEOUT)
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        await sign_in(http)
        cookie = "; ".join(f"{name}={value}" for name, value in http.cookies.items())
    async with websockets.connect(
        f"ws://127.0.0.1:{server.port}/ws/operators/", additional_headers={"Cookie": cookie},
        proxy=None,
    ) as watch:
        page = page_for(server, raw)
        await page.connect()
        await page.context_update("/orders", "Orders", [], {})
        await page.user_input('/tool cancel_order {"number": "A1003"}')
        await page.recv_until(lambda f: f["type"] == "SYSTEM_EVENT"
                              and f["payload"]["kind"] == "waiting", timeout=SOON)

        server.process.send_signal(signal.SIGTERM)

        await page.recv_until(is_disconnect, timeout=DRAIN)
        assert (await page.wait_closed(timeout=DRAIN))[0] == 1001
        await asyncio.wait_for(watch.wait_closed(), DRAIN)
        assert watch.close_code == 1001
    assert await asyncio.to_thread(server.process.wait, DRAIN + EXIT_MARGIN) == 0

    record = await database_sync_to_async(record_of)(key)
    assert record["open_sessions"] == 0
    assert record["unfinished_calls"] == []
    assert record["approvals"] == ["disconnected"]
    assert record["approval_trails"] == [["requested", "disconnected"]]
    order = await DemoOrder.objects.aget(tenant=tenant, number="A1003")
    assert order.status != "cancelled"


# The drain's own database work (its threads' connections checked before
# the stop is marked) needs the database, though the mark itself is replaced.
@pytest.mark.django_db(transaction=True)
async def test_the_drain_stops_what_was_registered_with_it_once_the_connections_close_then_marks_the_stop(
        monkeypatch):
    # How the speech workers stop with the drain: the serving entry point,
    # which runs them, registers their shutdown; this app never imports them.
    happened = []
    monkeypatch.setattr(processes, "_after_drain", [])
    monkeypatch.setattr(processes, "_connections", weakref.WeakSet())
    monkeypatch.setattr(processes, "_timers", [])
    monkeypatch.setattr(processes, "_draining", False)
    monkeypatch.setattr(processes, "mark_stopped", lambda: happened.append("marked stopped"))

    def stop() -> None:
        happened.append("stopped")

    processes.stop_after_drain(stop)
    processes.stop_after_drain(stop)
    await processes.drain(timeout=1)

    assert happened == ["stopped", "marked stopped"]
