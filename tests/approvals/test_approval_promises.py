"""What an approval promises, each pinned by its own test.

- A risky server tool runs only on an explicit "approved". An approval that
  expired, was cancelled, was closed because the page went away, or was
  denied never runs it, by whichever road the decision reaches the turn.
- The audit chain's hash covers who acted: changing the actor (or the kind
  of actor, or the channel) of a stored event breaks verification there.

The turn is a real Agent with the real AgentStore and approvals services on
the test database; only the page (AgentIO) is a stand-in that records frames.
"""
from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from datetime import timezone as dt_timezone

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, transaction

from agent.loop import Agent, AgentConfig, PageSnapshot, TurnOver
from agent.store import AgentStore
from aitp.ledger import CANCELLED_MESSAGE, DECLINED_MESSAGE, LEFT_MESSAGE, SERVER_EXPIRED_MESSAGE
from aitp.models import ToolCall
from aitp.tools import Risk, ToolSpec, ToolSurface, canonical_json
from aitp.turn import Do, TurnEvent, TurnMachine
from approvals import services as approvals
from approvals.audit import VerifyResult, append_event, compute_hash, verify_chain
from approvals.models import Approval, AuditChainHead, AuditEvent
from approvals.server_tools import ServerToolDef
from llm.offline import OfflineBackend
from tests.aitp.test_agent import written_behind  # noqa: F401  (a fixture)
from tests.approvals.conftest import make_session

pytestmark = [pytest.mark.django_db(transaction=True)]

# Far longer than any of these turns: a decision always arrives first, and
# nothing here waits for a deadline.
APPROVAL_TIMEOUT = 120.0
# How long a test waits for the turn to reach a state (an event, not a delay).
PATIENCE = 60.0

CANCEL_ORDER = ToolSpec(
    name="cancel_order",
    description="Cancel an order",
    parameters={"type": "OBJECT", "properties": {"number": {"type": "STRING"}},
                "required": ["number"]},
    risk=Risk.HIGH,
    origin="server",
)
COMMAND = '/tool cancel_order {"number": "A1003"}'


class Page:
    """The connection's side of the turn: records frames and states."""

    def __init__(self, surface: ToolSurface) -> None:
        self._surface = surface
        self.frames = []
        self.sent_at: list[float] = []  # the event loop's clock, one per frame
        self.states = []
        self.turn = TurnMachine()
        self.waiting_approval = asyncio.Event()

    async def send(self, item) -> None:
        """A frame; or where the turn is, recorded as the connection records
        it (a typed turn in the real machine); or its end, with its done frame."""
        if isinstance(item, TurnOver):
            move, item = self.turn.step(TurnEvent.DONE), item.done
            self.states.append(move.stored)
            if item is None:
                return
        elif isinstance(item, TurnEvent):
            if not self.turn.busy:  # each turn typed
                self.turn.step(TurnEvent.TYPED)
            move = self.turn.step(item)
            if Do.RECORD in move.do:
                self.states.append(move.stored)
                if move.stored == "waiting_approval":
                    self.waiting_approval.set()
            return
        self.frames.append(item)
        self.sent_at.append(asyncio.get_running_loop().time())

    def surface(self) -> ToolSurface:
        return self._surface

    def page(self) -> PageSnapshot:
        return PageSnapshot(url="/orders/A1003", title="Order A1003", context={})

    def frame_types(self) -> list[str]:
        return [getattr(m.type, "value", m.type) for m in self.frames]


class Runs:
    """The server tool's handler: records what it was asked and the call's
    row while it runs; fails with ``fail`` when given."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.calls: list[dict] = []
        self.contexts: list[dict] = []
        self.row_status: list[str] = []
        self.page_state: list[str] = []
        self.page: Page | None = None
        self.fail = fail

    async def __call__(self, args: dict, *, session_id: str, tenant_id: int, call_id: str):
        self.calls.append(args)
        self.contexts.append({"session_id": session_id, "tenant_id": tenant_id, "call_id": call_id})
        self.page_state.append(self.page.states[-1] if self.page else None)
        self.row_status.append(await row_status_becomes(call_id, "running"))
        if self.fail is not None:
            raise self.fail
        return {"cancelled": args["number"]}


async def row_status_becomes(call_id: str, status: str) -> str | None:
    """The call row's status once it is ``status`` (it is written behind the
    turn), or whatever it still is after PATIENCE."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + PATIENCE
    while True:
        current = await ToolCall.objects.filter(call_id=call_id).values_list(
            "status", flat=True).afirst()
        if current == status or loop.time() > give_up:
            return current
        await asyncio.sleep(0.05)


class Turn:
    def __init__(self, session, policy: str, *, command: str = COMMAND,
                 approval_timeout: float = APPROVAL_TIMEOUT, runs: Runs | None = None,
                 tool_on_server: bool = True) -> None:
        self.runs = runs or Runs()
        self.command = command
        tool = ServerToolDef(spec=CANCEL_ORDER, policy=policy, runner=self.runs)
        self.page = Page(ToolSurface.build([CANCEL_ORDER], []))
        self.runs.page = self.page
        self.agent = Agent(
            session_id=session.id, tenant_id=session.tenant_id, system_prompt="You help.",
            backend=OfflineBackend(),
            config=AgentConfig(model="offline", approval_timeout=approval_timeout,
                               stream_interval=0.001),
            io=self.page,
            store=AgentStore(session_id=session.id, tenant_id=session.tenant_id),
            server_tools={"cancel_order": tool} if tool_on_server else {},
        )
        self.task: asyncio.Task | None = None

    async def start(self) -> Approval:
        """Run the turn up to the point where it waits for a human."""
        self.task = asyncio.create_task(self.agent.run_turn(self.command))
        waiting = asyncio.create_task(self.page.waiting_approval.wait())
        await asyncio.wait({waiting, self.task}, timeout=PATIENCE,
                           return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        assert self.page.waiting_approval.is_set(), "the turn never asked for approval"
        assert self.runs.calls == [], "the tool ran before anyone decided"
        return await Approval.objects.select_related("tool_call").aget(tool_name="cancel_order")

    async def finish(self) -> ToolCall:
        """Run the turn to its end (all of it, when start() was not called)."""
        if self.task is None:
            self.task = asyncio.create_task(self.agent.run_turn(self.command))
        await asyncio.wait_for(self.task, PATIENCE)
        return await ToolCall.objects.aget(name="cancel_order")

    def tool_result(self) -> dict:
        results = [b for m in self.agent.conversation.history for b in m["content"]
                   if b.get("type") == "tool_result"]
        assert len(results) == 1, self.agent.conversation.history
        return results[0]

    def approval_frames(self) -> list[tuple[str, dict]]:
        """What the page was told about approving: the approval request, and
        the system events that announce, wait for or end one."""
        told = []
        for message in self.page.frames:
            kind = getattr(message.type, "value", message.type)
            payload = message.payload.model_dump(exclude_none=True)
            if kind == "APPROVAL_REQUEST" or payload.get("kind") in (
                    "approval_required", "waiting", "error"):
                told.append((kind, payload))
        return told


@pytest.fixture
def session(acme):
    return make_session(acme, "ses_promises")


def decide_user(approval: Approval, approved: bool) -> None:
    approvals.approval_decide_user(approval_id=approval.pk, session_id=approval.session_id,
                                   approved=approved)


ENDINGS = {
    "expired": lambda a: approvals.approval_expire(approval_id=a.pk),
    "cancelled": lambda a: approvals.approval_close(approval_id=a.pk, status="cancelled"),
    "disconnected": lambda a: approvals.approval_close(approval_id=a.pk, status="disconnected"),
    "denied": lambda a: decide_user(a, approved=False),
}


async def test_a_server_tool_runs_on_an_explicit_approval(session):
    turn = Turn(session, policy="user")
    approval = await turn.start()
    await sync_to_async(decide_user)(approval, approved=True)
    await turn.agent.on_approval_decided(approval.pk)
    call = await turn.finish()
    assert turn.runs.calls == [{"number": "A1003"}]
    assert call.status == "success"
    assert "is_error" not in turn.tool_result()
    actions = [a async for a in AuditEvent.objects.filter(approval_id=approval.pk)
               .values_list("action", flat=True)]
    assert actions == ["requested", "approved", "executed"]


# What the model is told of a call whose approval ended each way.
TOLD = {
    "expired": SERVER_EXPIRED_MESSAGE,
    "cancelled": CANCELLED_MESSAGE,
    "disconnected": LEFT_MESSAGE,
    "denied": DECLINED_MESSAGE,
}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
async def test_a_server_tool_never_runs_unless_explicitly_approved(session, ending):
    turn = Turn(session, policy="user")
    approval = await turn.start()
    await sync_to_async(ENDINGS[ending])(approval)
    # The notice a decision sends to the process holding the session.
    await turn.agent.on_approval_decided(approval.pk)
    call = await turn.finish()
    assert turn.runs.calls == []
    # The call ended as its approval did, in the transaction of its event.
    assert (call.status, call.error) == (ending, TOLD[ending])
    assert turn.tool_result()["is_error"] is True
    assert turn.tool_result()["content"] == TOLD[ending]
    assert (await Approval.objects.aget(pk=approval.pk)).status == ending
    last = await AuditEvent.objects.filter(approval_id=approval.pk).order_by("seq").alast()
    assert (last.action, last.data["call"]) == (ending, ending)


@pytest.mark.parametrize("ending", ["expired", "cancelled", "disconnected", "denied"])
async def test_a_server_tool_never_runs_on_a_decision_other_than_approved(session, ending):
    # However the decision reaches the waiting turn (here: straight onto the
    # pending call, as a re-read of the row would put it).
    turn = Turn(session, policy="user")
    await turn.start()
    [call] = turn.agent.ledger.open_calls()
    call.decide(ending)
    stored = await turn.finish()
    assert turn.runs.calls == []
    assert stored.status == ending
    assert turn.tool_result()["is_error"] is True
    assert turn.tool_result()["content"] == TOLD[ending]


async def test_a_server_tool_never_runs_on_a_user_approval_when_an_operator_denies(session, olivia):
    turn = Turn(session, policy="user_and_operator")
    approval = await turn.start()
    await sync_to_async(decide_user)(approval, approved=True)
    await turn.agent.on_approval_decided(approval.pk)
    assert turn.runs.calls == []  # still waiting for the operator
    assert not turn.task.done()
    await sync_to_async(approvals.approval_decide_operator)(
        approval_id=approval.pk, user=olivia, approved=False)
    await turn.agent.on_approval_decided(approval.pk)
    await turn.finish()
    assert turn.runs.calls == []


async def test_an_operators_refusal_is_told_as_the_operators_not_the_users(session, olivia):
    turn = Turn(session, policy="operator")
    approval = await turn.start()
    await sync_to_async(approvals.approval_decide_operator)(
        approval_id=approval.pk, user=olivia, approved=False)
    await turn.agent.on_approval_decided(approval.pk)
    call = await turn.finish()
    assert turn.tool_result()["content"] == "An operator declined this action."
    assert (call.status, call.error) == ("denied", "An operator declined this action.")


async def test_the_users_own_refusal_is_told_as_the_users(session):
    turn = Turn(session, policy="user")
    approval = await turn.start()
    await sync_to_async(decide_user)(approval, approved=False)
    await turn.agent.on_approval_decided(approval.pk)
    call = await turn.finish()
    assert turn.tool_result()["content"] == "The user declined this action."
    assert (call.status, call.error) == ("denied", "The user declined this action.")


async def test_a_server_tool_runs_once_both_parties_approve(session, olivia):
    turn = Turn(session, policy="user_and_operator")
    approval = await turn.start()
    await sync_to_async(decide_user)(approval, approved=True)
    await sync_to_async(approvals.approval_decide_operator)(
        approval_id=approval.pk, user=olivia, approved=True)
    await turn.agent.on_approval_decided(approval.pk)
    await turn.finish()
    assert turn.runs.calls == [{"number": "A1003"}]


# --- what the turn tells the page, the model and the record ------------------------


def asked(args: dict) -> str:
    return f"Allow cancel_order with {canonical_json(args)}?"


async def test_a_server_tool_asks_the_page_user_with_the_call_and_its_arguments(session):
    turn = Turn(session, policy="user")
    approval = await turn.start()
    call_id = approval.tool_call.call_id

    assert turn.approval_frames() == [
        ("SYSTEM_EVENT", {"kind": "approval_required", "message": asked({"number": "A1003"}),
                          "data": {"callId": call_id}}),
        ("APPROVAL_REQUEST", {"callId": call_id, "toolName": "cancel_order", "risk": "high",
                              "args": {"number": "A1003"}, "message": asked({"number": "A1003"})}),
    ]
    assert approval.message == asked({"number": "A1003"})
    # The approval lasts as long as the turn waits for it.
    assert approval.deadline - approval.created_at == timedelta(seconds=APPROVAL_TIMEOUT)
    await sync_to_async(decide_user)(approval, approved=False)
    await turn.agent.on_approval_decided(approval.pk)
    await turn.finish()


async def test_the_question_quotes_at_most_300_characters_of_the_arguments(session):
    number = "A" * 400
    turn = Turn(session, policy="user", command=f'/tool cancel_order {{"number": "{number}"}}')
    approval = await turn.start()

    expected = f"Allow cancel_order with {canonical_json({'number': number})[:300]}?"
    assert approval.message == expected
    assert turn.approval_frames()[1][1]["message"] == expected
    await sync_to_async(decide_user)(approval, approved=False)
    await turn.agent.on_approval_decided(approval.pk)
    await turn.finish()


async def test_a_server_tool_under_operator_policy_tells_the_page_it_waits_for_an_operator(
        session, olivia):
    turn = Turn(session, policy="operator")
    approval = await turn.start()

    assert turn.approval_frames() == [
        ("SYSTEM_EVENT", {"kind": "waiting",
                          "message": "Waiting for an operator to approve this action.",
                          "data": {"callId": approval.tool_call.call_id,
                                   "reason": "operator_approval"}}),
    ]
    await sync_to_async(approvals.approval_decide_operator)(
        approval_id=approval.pk, user=olivia, approved=True)
    await turn.agent.on_approval_decided(approval.pk)
    await turn.finish()
    assert turn.runs.calls == [{"number": "A1003"}]


async def test_an_approved_server_tool_runs_for_its_session_with_its_row_marked_running(session):
    turn = Turn(session, policy="user")
    approval = await turn.start()
    await sync_to_async(decide_user)(approval, approved=True)
    await turn.agent.on_approval_decided(approval.pk)
    call = await turn.finish()

    assert turn.runs.contexts == [{"session_id": session.id, "tenant_id": session.tenant_id,
                                   "call_id": call.call_id}]
    assert turn.runs.row_status == ["running"]
    assert turn.runs.page_state == ["answering"]
    assert turn.tool_result()["content"] == '{"cancelled":"A1003"}'
    assert turn.agent.ledger.open_calls() == []


async def test_a_decision_whose_notice_was_lost_is_found_by_rereading_the_approval(session):
    turn = Turn(session, policy="user")
    approval = await turn.start()

    # Decided, but the process holding the turn is never told.
    await sync_to_async(decide_user)(approval, approved=True)
    await turn.finish()

    assert turn.runs.calls == [{"number": "A1003"}]


async def test_an_approval_nobody_decides_is_waited_for_until_its_deadline_then_expires(session):
    # Longer than the turn's 3 s between re-reads of the approval row, so
    # that the wait is cut in pieces, the last one shorter than a second.
    turn = Turn(session, policy="user", approval_timeout=3.5)
    await turn.start()
    [waiting] = turn.agent.ledger.open_calls()
    deadline = waiting.deadline

    call = await turn.finish()

    # The page hears of the expiry no sooner than the deadline.
    [told_at] = [at for at, m in zip(turn.page.sent_at, turn.page.frames, strict=True)
                 if (m.payload.model_dump().get("data") or {}).get("code") == "approval_expired"]
    assert told_at >= deadline
    assert turn.runs.calls == []
    assert turn.approval_frames()[-1] == (
        "SYSTEM_EVENT", {"kind": "error", "message": "The approval request expired.",
                         "data": {"code": "approval_expired", "callId": call.call_id}})
    assert turn.tool_result() == {
        "type": "tool_result", "tool_use_id": turn.tool_result()["tool_use_id"],
        "content": "Nobody approved the action in time; it did not run.", "is_error": True}
    assert call.status == "expired"
    approval = await Approval.objects.aget(tool_call__call_id=call.call_id)
    assert approval.status == "expired"


async def test_a_failing_server_tool_is_audited_as_failed_and_the_model_is_told_why(session,
                                                                                   caplog):
    turn = Turn(session, policy="user", runs=Runs(fail=RuntimeError("card declined")))
    approval = await turn.start()
    await sync_to_async(decide_user)(approval, approved=True)
    await turn.agent.on_approval_decided(approval.pk)
    call = await turn.finish()

    assert turn.tool_result()["content"] == "card declined"
    assert turn.tool_result()["is_error"] is True
    assert call.status == "error"
    events = [(e.action, e.data) async for e in
              AuditEvent.objects.filter(approval_id=approval.pk).order_by("seq")]
    assert events[-1] == ("failed", {"error": "card declined", "call": "error"})
    assert [action for action, _ in events] == ["requested", "approved", "failed"]
    assert (f"session {session.id}: server tool cancel_order failed: card declined"
            in [r.getMessage() for r in caplog.records if r.name == "agent.loop"])


async def test_a_server_tool_failing_without_words_tells_the_model_it_failed(session):
    turn = Turn(session, policy="user", runs=Runs(fail=RuntimeError()))
    approval = await turn.start()
    await sync_to_async(decide_user)(approval, approved=True)
    await turn.agent.on_approval_decided(approval.pk)
    await turn.finish()

    assert turn.tool_result()["content"] == "The tool failed."


async def test_a_server_tool_this_server_cannot_run_is_unavailable_and_never_asked_for(session):
    turn = Turn(session, policy="user", tool_on_server=False)

    call = await turn.finish()

    assert turn.tool_result()["content"] == "The tool cancel_order is not available."
    assert turn.tool_result()["is_error"] is True
    assert call.status == "unavailable"
    assert not await Approval.objects.aexists()
    assert turn.approval_frames() == []


# --- the audit chain covers who acted --------------------------------------------------


def append(tenant, **fields) -> AuditEvent:
    values = {"action": "approved", "actor_kind": "operator", "actor": "olivia",
              "channel": "admin", **fields}
    with transaction.atomic():
        return append_event(tenant_id=tenant.pk, **values)


def rewrite(event: AuditEvent, column: str, value: str) -> None:
    # Straight to the table: the ORM refuses to change an audit event.
    table = AuditEvent._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET {column} = %s WHERE seq = %s", [value, event.seq])


@pytest.mark.parametrize("column,value", [
    ("actor", "mallory"),
    ("actor_kind", "system"),
    ("channel", "console"),
])
def test_changing_who_acted_on_a_stored_event_breaks_the_chain_there(acme, column, value):
    append(acme, action="requested", actor_kind="page", actor="ses_a", channel="page")
    decided = append(acme)
    append(acme, action="executed", actor_kind="system", actor="system", channel="system")
    assert verify_chain().ok

    rewrite(decided, column, value)

    result = verify_chain()
    assert not result.ok
    assert result.first_bad_seq == decided.seq
    assert result.problem == "hash mismatch (row altered)"


@pytest.mark.parametrize("field", ["actor", "actor_kind", "channel"])
def test_the_audit_hash_depends_on_who_acted(field):
    fields = {"seq": 1, "tenant_id": 1, "approval_id": 2, "session_id": "ses", "call_id": "tc",
              "action": "approved", "actor_kind": "operator", "actor": "olivia", "channel": "admin",
              "args_hash": "h", "data": {}, "created_at": datetime(2026, 1, 1, tzinfo=UTC),
              "prev_hash": "0" * 64}
    other = {"actor": "mallory", "actor_kind": "page", "channel": "console"}[field]
    assert compute_hash(**fields) != compute_hash(**{**fields, field: other})


def test_the_actor_of_a_decision_is_the_operator_who_made_it(session, olivia):
    call = ToolCall.objects.create(
        session=session, call_id="tc_actor", tool_use_id="toolu_actor", name="cancel_order",
        arguments={"number": "A1"}, risk="high", origin="server", status=ToolCall.Status.PENDING,
    )
    approval = approvals.approval_request_server(
        tool_call=call, tool=ServerToolDef(spec=CANCEL_ORDER, policy="operator", runner=Runs()),
        args={"number": "A1"}, session_id=session.id, timeout=APPROVAL_TIMEOUT,
    )
    approvals.approval_decide_operator(approval_id=approval.pk, user=olivia, approved=True,
                                       channel="console")
    decided = AuditEvent.objects.get(approval_id=approval.pk, action="approved")
    assert (decided.actor_kind, decided.actor, decided.channel) == ("operator", "olivia", "console")
    assert verify_chain().ok


# --- verification names the first broken link, and says what broke ---------------------


def chain_of_three(tenant) -> list[AuditEvent]:
    return [append(tenant, action=action)
            for action in ("requested", "approved", "executed")]


def table_sql(sql: str, params=()) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql.format(table=AuditEvent._meta.db_table), params)


def test_an_intact_chain_reports_every_event_checked(acme):
    chain_of_three(acme)
    assert verify_chain() == VerifyResult(True, 3, None, "")


def test_an_empty_chain_without_its_head_row_verifies_as_empty(db):
    AuditChainHead.objects.all().delete()
    assert verify_chain() == VerifyResult(True, 0, None, "")


def test_an_altered_row_is_reported_as_altered_after_the_events_before_it(acme):
    chain_of_three(acme)
    table_sql("UPDATE {table} SET action = 'denied' WHERE seq = 2")
    assert verify_chain() == VerifyResult(False, 1, 2, "hash mismatch (row altered)")


def test_a_removed_row_is_reported_as_missing_by_its_number(acme):
    chain_of_three(acme)
    table_sql("DELETE FROM {table} WHERE seq = 2")
    assert verify_chain() == VerifyResult(False, 1, 3, "event #2 is missing")


def test_a_row_numbered_before_the_chain_start_is_reported_as_out_of_sequence(acme):
    chain_of_three(acme)
    table_sql("UPDATE {table} SET seq = 0 WHERE seq = 1")
    assert verify_chain() == VerifyResult(
        False, 0, 0, "duplicate or reordered sequence number 0")


def test_a_first_event_that_does_not_start_the_chain_is_reported(acme):
    chain_of_three(acme)
    table_sql("UPDATE {table} SET prev_hash = %s WHERE seq = 1", ["f" * 64])
    assert verify_chain() == VerifyResult(False, 0, 1, "first event does not start the chain")


def test_a_broken_link_names_the_event_it_should_follow(acme):
    chain_of_three(acme)
    table_sql("UPDATE {table} SET prev_hash = %s WHERE seq = 3", ["f" * 64])
    assert verify_chain() == VerifyResult(
        False, 2, 3, "does not link to event #2 (removed or reordered)")


def test_a_removed_last_event_is_reported_with_what_the_head_records(acme):
    chain_of_three(acme)
    table_sql("DELETE FROM {table} WHERE seq = 3")
    assert verify_chain() == VerifyResult(
        False, 2, 3, "event #3 is missing (chain head records 3 events)")


def test_a_head_that_disagrees_with_the_last_event_is_reported(acme):
    chain_of_three(acme)
    AuditChainHead.objects.filter(pk=AuditChainHead.SINGLETON_PK).update(last_hash="e" * 64)
    assert verify_chain() == VerifyResult(
        False, 3, 3, "chain head does not match the last event")


def test_events_without_a_head_row_are_reported(acme):
    chain_of_three(acme)
    AuditChainHead.objects.all().delete()
    assert verify_chain() == VerifyResult(False, 0, None, "chain head row is missing")


def test_an_event_beyond_the_head_is_reported_by_its_number(acme):
    chain_of_three(acme)
    AuditChainHead.objects.filter(pk=AuditChainHead.SINGLETON_PK).update(
        last_seq=2, last_hash=AuditEvent.objects.get(seq=2).hash)
    assert verify_chain() == VerifyResult(False, 2, 3, "event lies beyond the chain head")


# --- the hash of history never changes, and covers every field --------------------------


GOLDEN_FIELDS = {
    "seq": 7, "tenant_id": 3, "approval_id": 11, "session_id": "ses_golden", "call_id": "tc_golden",
    "action": "approved", "actor_kind": "operator", "actor": "olivia", "channel": "console",
    "args_hash": "a" * 64, "data": {"note": "café", "party": "operator", "n": 1.5},
    "created_at": datetime(2026, 3, 1, 12, 30, 45, 123456, tzinfo=dt_timezone(timedelta(hours=2))),
    "prev_hash": "b" * 64,
}
# Computed once when the chain format was fixed: a stored chain stays
# verifiable only while the same fields hash to the same value.
GOLDEN_HASH = "667c9a59a142df6213f9045b457655029c68ab51865dbfc9c07bb3c7144895a7"


def test_the_hash_of_a_stored_event_never_changes_across_releases():
    assert compute_hash(**GOLDEN_FIELDS) == GOLDEN_HASH


def test_the_hash_does_not_depend_on_the_process_time_zone(monkeypatch):
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        assert compute_hash(**GOLDEN_FIELDS) == GOLDEN_HASH
    finally:
        monkeypatch.undo()
        time.tzset()


def test_the_hash_does_not_depend_on_the_order_of_the_data_keys():
    # PostgreSQL's jsonb hands keys back in its own order.
    data = GOLDEN_FIELDS["data"]
    reordered = {key: data[key] for key in reversed(list(data))}
    assert list(reordered) != list(data)
    assert compute_hash(**{**GOLDEN_FIELDS, "data": reordered}) == GOLDEN_HASH


@pytest.mark.parametrize("column,value", [
    ("approval_id", 8),
    ("session_id", "ses_other"),
    ("call_id", "tc_other"),
    ("args_hash", "c" * 64),
    ("action", "denied"),
])
def test_changing_what_a_stored_event_is_about_breaks_the_chain_there(acme, column, value):
    append(acme, action="requested")
    about = append(acme, approval_id=7, session_id="ses_a", call_id="tc_a", args_hash="d" * 64)
    append(acme, action="executed")
    rewrite(about, column, value)
    assert verify_chain() == VerifyResult(False, 1, 2, "hash mismatch (row altered)")


def test_an_appended_event_stores_exactly_what_it_was_given(acme):
    event = append(acme, approval_id=7, session_id="ses_a", call_id="tc_a",
                   args_hash="d" * 64, data={"note": "ok"})
    stored = AuditEvent.objects.get(seq=event.seq)
    assert (stored.tenant_id, stored.approval_id, stored.session_id, stored.call_id) == (
        acme.pk, 7, "ses_a", "tc_a")
    assert (stored.action, stored.actor_kind, stored.actor, stored.channel) == (
        "approved", "operator", "olivia", "admin")
    assert (stored.args_hash, stored.data) == ("d" * 64, {"note": "ok"})


def test_an_event_without_an_actor_or_ids_stores_them_empty(acme):
    with transaction.atomic():
        event = append_event(tenant_id=acme.pk, action="expired", actor_kind="system",
                             channel="system", session_id=None, call_id=None, args_hash=None)
    stored = AuditEvent.objects.get(seq=event.seq)
    assert (stored.actor, stored.session_id, stored.call_id, stored.args_hash) == ("", "", "", "")
    assert stored.approval_id is None and stored.data == {}
    assert verify_chain().ok


def test_an_actor_name_is_kept_to_its_first_150_characters(acme):
    event = append(acme, actor="o" * 400)
    assert AuditEvent.objects.get(seq=event.seq).actor == "o" * 150
    assert verify_chain().ok


@pytest.mark.parametrize("field,value,named", [
    ("action", "teleported", "unknown audit action 'teleported'"),
    ("actor_kind", "robot", "unknown actor kind 'robot'"),
    ("channel", "fax", "unknown channel 'fax'"),
])
def test_an_event_of_an_unknown_kind_is_refused_by_name(acme, field, value, named):
    with pytest.raises(ValueError, match=named):
        append(acme, **{field: value})
    assert not AuditEvent.objects.exists()


def test_appending_outside_a_transaction_says_why(acme):
    with pytest.raises(RuntimeError, match=r"^the audit chain can only be locked inside a transaction$"):
        append_event(tenant_id=acme.pk, action="requested", actor_kind="system", channel="system")


# --- a turn cut as the tool returns ------------------------------------------------


class RunsThenCut(Runs):
    """The handler returns while the turn is being cut (the user barged in,
    the page left): the cancel lands on the turn's next await."""

    turn: Turn | None = None

    async def __call__(self, args: dict, **context):
        result = await super().__call__(args, **context)
        self.turn.task.cancel()
        return result


async def audit_actions_become(approval_id: int, wanted: list[str]) -> list[str]:
    loop = asyncio.get_running_loop()
    give_up = loop.time() + PATIENCE
    while True:
        actions = [a async for a in AuditEvent.objects.filter(approval_id=approval_id)
                   .order_by("seq").values_list("action", flat=True)]
        if actions == wanted or loop.time() > give_up:
            return actions
        await asyncio.sleep(0.05)


async def test_a_server_tool_that_ran_as_the_turn_was_cut_keeps_its_outcome_and_its_audit(session):
    runs = RunsThenCut()
    turn = Turn(session, policy="user", runs=runs)
    runs.turn = turn
    approval = await turn.start()
    await sync_to_async(decide_user)(approval, approved=True)
    await turn.agent.on_approval_decided(approval.pk)

    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(turn.task, PATIENCE)

    assert runs.calls == [{"number": "A1003"}]
    assert turn.tool_result() == {"type": "tool_result", "tool_use_id": approval.tool_call.tool_use_id,
                                  "content": '{"cancelled":"A1003"}'}
    # The call's end is written with its audit event, in the write the cut
    # turn left running: it lands whole, after the turn's task is over.
    assert await audit_actions_become(approval.pk, ["requested", "approved", "executed"]) == [
        "requested", "approved", "executed"]
    call = await ToolCall.objects.aget(name="cancel_order")
    assert (call.status, call.result) == ("success", {"cancelled": "A1003"})


# --- a decided call's end is written with its audit event ---------------------------


async def the_end(approval: Approval) -> tuple[tuple, tuple, str]:
    """(the call's row: status, error, result, finished), (the approval's last
    event: action, data), the approval's status."""
    call = await ToolCall.objects.aget(pk=approval.tool_call_id)
    event = await AuditEvent.objects.filter(approval_id=approval.pk).order_by("seq").alast()
    status = (await Approval.objects.aget(pk=approval.pk)).status
    return ((call.status, call.error, call.result, call.finished_at is not None),
            (event.action, event.data), status)


async def approved_and_run(turn: Turn) -> Approval:
    approval = await turn.start()
    await sync_to_async(decide_user)(approval, approved=True)
    await turn.agent.on_approval_decided(approval.pk)
    await turn.finish()
    return approval


async def test_an_approved_run_ends_its_call_with_its_executed_event(session, written_behind):
    turn = Turn(session, policy="user")

    approval = await approved_and_run(turn)

    assert await the_end(approval) == (
        ("success", "", {"cancelled": "A1003"}, True), ("executed", {"call": "success"}), "approved")
    assert approval.tool_call.call_id not in written_behind


async def test_an_approved_run_that_failed_ends_its_call_with_its_failed_event(session,
                                                                              written_behind):
    turn = Turn(session, policy="user", runs=Runs(fail=RuntimeError("card declined")))

    approval = await approved_and_run(turn)

    assert await the_end(approval) == (
        ("error", "card declined", None, True),
        ("failed", {"error": "card declined", "call": "error"}), "approved")
    assert approval.tool_call.call_id not in written_behind


async def test_an_expired_approval_ends_its_call_with_its_expired_event(session, written_behind):
    turn = Turn(session, policy="user", approval_timeout=0.5)
    approval = await turn.start()

    await turn.finish()

    assert await the_end(approval) == (
        ("expired", SERVER_EXPIRED_MESSAGE, None, True), ("expired", {"call": "expired"}), "expired")
    assert approval.tool_call.call_id not in written_behind


@pytest.mark.parametrize(("cut", "told"), [("cancelled", CANCELLED_MESSAGE),
                                           ("disconnected", LEFT_MESSAGE)])
async def test_a_turn_cut_while_its_approval_waits_ends_the_call_with_the_approvals_event(
        session, written_behind, cut, told):
    turn = Turn(session, policy="user")
    approval = await turn.start()
    # The turn cancelled (a barge-in, an operator), or the page gone.
    turn.task.cancel(cut)
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(turn.task, PATIENCE)

    assert await the_end(approval) == ((cut, told, None, True), (cut, {"call": cut}), cut)
    assert approval.tool_call.call_id not in written_behind


class RunsUntilCut(Runs):
    """The handler runs until the turn is cut."""

    def __init__(self) -> None:
        super().__init__()
        self.running = asyncio.Event()

    async def __call__(self, args: dict, **context):
        self.running.set()
        await asyncio.Event().wait()


@pytest.mark.parametrize(("cut", "told"), [("cancelled", CANCELLED_MESSAGE),
                                           ("disconnected", LEFT_MESSAGE)])
async def test_an_approved_run_cut_short_ends_its_call_with_an_event_and_the_decision_stands(
        session, written_behind, cut, told):
    runs = RunsUntilCut()
    turn = Turn(session, policy="user", runs=runs)
    approval = await turn.start()
    await sync_to_async(decide_user)(approval, approved=True)
    await turn.agent.on_approval_decided(approval.pk)
    await asyncio.wait_for(runs.running.wait(), PATIENCE)
    turn.task.cancel(cut)
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(turn.task, PATIENCE)

    assert await the_end(approval) == ((cut, told, None, True), (cut, {"call": cut}), "approved")
    assert approval.tool_call.call_id not in written_behind


async def test_the_sweep_ends_a_gone_process_call_with_its_approvals_event(session):
    from aitp import services as aitp_services
    from aitp.models import Session
    from aitp.services import LOST_CALL_ERROR

    turn = Turn(session, policy="user")
    approval = await turn.start()
    await Session.objects.filter(pk=session.pk).aupdate(process="test:gone")

    await sync_to_async(aitp_services.sessions_close_of_processes)(
        process_ids=["test:gone"], code=1006, reason="server process lost")

    assert await the_end(approval) == (
        ("disconnected", LOST_CALL_ERROR, None, True),
        ("disconnected", {"reason": "server process lost", "call": "disconnected"}), "disconnected")
    # Had the process lived on, its turn learns it and ends the call as recorded.
    await turn.agent.on_approval_decided(approval.pk)
    await turn.finish()
    assert turn.runs.calls == []
    assert (await the_end(approval))[0][0] == "disconnected"


async def test_a_run_whose_audit_cannot_be_written_leaves_its_end_unwritten_too(session,
                                                                              monkeypatch):
    turn = Turn(session, policy="user")
    approval = await turn.start()
    await sync_to_async(decide_user)(approval, approved=True)

    def append_event(**fields):
        raise RuntimeError("the audit append failed")

    monkeypatch.setattr("approvals.services.append_event", append_event)
    await turn.agent.on_approval_decided(approval.pk)
    await turn.finish()

    assert turn.runs.calls == [{"number": "A1003"}]
    # The turn ended for the page all the same (an internal error).
    assert turn.page.frame_types()[-1] == "AGENT_RESPONSE"
    assert await the_end(approval) == (
        ("running", "", None, False), ("approved", {"party": "user", "status": "approved",
                                                    "call": "running"}), "approved")
