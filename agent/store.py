"""Where the agent turn writes: the conversation, the ledger, usage, approvals.

Each method is one ``db_call`` into the session store (``aitp.store``) (on the process's database
threads, see ``runtime.db``), so the turn never touches the ORM from the event
loop; the checkpoints (and the progress marks) of turns that meet in time
share one (``runtime.group_write``). Progress marks and final outcomes of tool
calls are written behind the turn: a mark in a task of its own, an outcome
with the turn's next write. Each write first waits for the marks still on
their way, so a call's rows change in the order the turn decided them.

A call that has an approval is the exception: its end (run, expired,
cancelled, disconnected) is written by the approvals app in the transaction
of the approval's event that records it (``approval_*`` below), and is not
written behind again. Calls without one cost no extra round trip.

Inside a turn's trace each call is a span ``store.<method>`` (``runtime.tracing``).
"""
from __future__ import annotations

import asyncio
import logging

from django.utils import timezone

from aitp import ports, store
from aitp.ledger import Outcome, PendingCall
from aitp.llm import Usage
from aitp.ports import ApprovalTicket
from runtime import tracing
from runtime.db import db_call
from runtime.group_write import GroupWrite

logger = logging.getLogger(__name__)

# The checkpoints, and the progress marks, of every turn of this process: those
# asked for while one is on its way go together, in one transaction
# (runtime.group_write).
CHECKPOINTS = GroupWrite(lambda writes: store.current().turn_checkpoints(writes), name="checkpoints")
MARKS = GroupWrite(lambda writes: store.current().tool_call_marks(writes), name="call_marks")


class AgentStore:
    def __init__(self, *, session_id: str, tenant_id: int) -> None:
        self.session_id = session_id
        self.tenant_id = tenant_id
        # "sent" / "running" marks being written, oldest first.
        self._marks: list[asyncio.Task] = []
        # Each call's latest mark: its task, and when the call was sent.
        self._mark_of: dict[str, tuple[asyncio.Task, object]] = {}
        # Final outcomes (tool_call_finish arguments) not written yet.
        self._finished: list[dict] = []
        # When each call's row was (or is being) recorded: the same time on
        # every try of a checkpoint, and its outcome needs no read for it.
        self._created: dict[str, object] = {}
        # Calls whose end their approval writes, with its event: a write that
        # failed leaves neither (and nothing is written behind in its place).
        self._ended_by_approval: set[str] = set()

    @tracing.traced("store.checkpoint")
    async def checkpoint(self, *, turn: int, messages: list[dict], calls: list[PendingCall] = (),
                         usage: Usage | None = None, turns: int = 0,
                         audio: dict[str, int] | None = None,
                         counted: Usage | None = None, figures: dict | None = None) -> None:
        """One database write for what the turn produced since the last one,
        outcomes of finished calls included (with the checkpoints of other
        turns that meet it in time). ``audio`` (a voice turn's
        milliseconds heard and spoken, ``agent_voice.audio_usage``) is
        counted with ``usage``; ``counted``: the part of ``usage`` already in
        the tenant's day (settled against its quota, ``aitp.quota``)."""
        await self._marks_written()
        finished = list(self._finished)
        if not (messages or calls or usage is not None or finished or figures):
            return
        await CHECKPOINTS.write(
            session_id=self.session_id,
            tenant_id=self.tenant_id,
            turn=turn,
            finished=finished,
            messages=messages,
            calls=[
                {
                    "call_id": call.call_id,
                    "tool_use_id": call.tool_use_id,
                    "name": call.name,
                    "arguments": call.args,
                    "risk": call.risk.value,
                    "origin": call.origin,
                    "created_at": self._created.setdefault(call.call_id, timezone.now()),
                }
                for call in calls
            ],
            usage=None if usage is None else {
                "turns": turns,
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
                "cache_read_tokens": usage.cache_read_tokens,
                "cache_write_tokens": usage.cache_write_tokens,
                **(audio or {}),
            },
            counted=None if counted is None else {
                "input_tokens": counted.input_tokens, "output_tokens": counted.output_tokens,
            },
            figures=figures,
        )
        self._forget(finished)

    @tracing.traced("store.mark_call")
    async def mark_call(self, call: PendingCall, status: str, *, sent: bool = False) -> None:
        """Start writing a call's progress (an open state) and return: the turn does not wait
        for it (the frame is out, the page is answering). It lands whatever
        happens to the turn, before any later write of this store, and never
        undoes a final status (``SessionStore.tool_call_mark``)."""
        self._marks = [task for task in self._marks if not task.done()]
        task = asyncio.get_running_loop().create_task(MARKS.write(
            call_id=call.call_id, status=status, sent=sent, risk=call.risk.value, origin=call.origin,
        ))
        task.add_done_callback(self._mark_done)
        self._marks.append(task)
        sent_at = timezone.now() if sent else self._mark_of.get(call.call_id, (None, None))[1]
        self._mark_of[call.call_id] = (task, sent_at)

    @tracing.traced("store.finish_call")
    async def finish_call(self, call: PendingCall, outcome: Outcome) -> None:
        """Keep a call's final outcome for the turn's next write (the next
        checkpoint: the turn always writes one before it ends).

        A progress mark that has not reached the database yet is no longer
        needed: it is withdrawn (it is not sent unless its group already left,
        and a mark that lands late never undoes a final status), and
        the outcome carries the time the call was sent. A page that answers
        at once costs one write per call instead of two."""
        mark, sent_at = self._mark_of.pop(call.call_id, (None, None))
        if mark is not None and not mark.done():
            mark.cancel()
        created_at = self._created.pop(call.call_id, None)
        if call.call_id in self._ended_by_approval:
            self._ended_by_approval.discard(call.call_id)
            return
        self._finished.append({
            "call_id": call.call_id, "status": outcome.status, "result": outcome.result,
            "error": outcome.error, "risk": call.risk.value, "origin": call.origin,
            "created_at": created_at, "sent_at": sent_at,
        })

    @tracing.traced("store.flush")
    async def flush(self) -> None:
        """Write what is kept behind now (before a write that reads it)."""
        await self._marks_written()
        finished = list(self._finished)
        if finished:
            await db_call(store.current().tool_calls_finish, finished)
            self._forget(finished)

    def _forget(self, written: list[dict]) -> None:
        # By identity: the turn and a page's frame may flush at the same time.
        done = {id(outcome) for outcome in written}
        self._finished = [outcome for outcome in self._finished if id(outcome) not in done]

    async def _marks_written(self) -> None:
        pending = [task for task in self._marks if not task.done()]
        if pending:
            # asyncio.wait, not gather: a cancelled turn stops waiting here,
            # the marks still land.
            await asyncio.wait(pending)

    def _mark_done(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            logger.error("session %s: tool call mark failed", self.session_id,
                         exc_info=task.exception())

    # --- approvals (the approvals app owns these rows: aitp.ports) --------------

    @tracing.traced("store.approval_request_client")
    async def approval_request_client(self, call: PendingCall, *, tool_name: str, args: dict,
                                      message: str, timeout: float) -> ApprovalTicket:
        await self.flush()
        return await db_call(
            ports.approvals().request_client, call_id=call.call_id, tool_name=tool_name,
            args=args, risk=call.risk.value, message=message, session_id=self.session_id,
            timeout=timeout,
        )

    @tracing.traced("store.approval_request_server")
    async def approval_request_server(self, call: PendingCall, tool, *, timeout: float,
                                      message: str) -> ApprovalTicket:
        await self.flush()
        return await db_call(
            ports.approvals().request_server, call_id=call.call_id, tool=tool, args=call.args,
            session_id=self.session_id, timeout=timeout, message=message,
        )

    @tracing.traced("store.approval_violation")
    async def approval_violation(self, call: PendingCall, *, reason: str) -> ApprovalTicket:
        return await db_call(
            ports.approvals().record_violation, call_id=call.call_id, risk=call.risk.value,
            session_id=self.session_id, reason=reason,
        )

    @tracing.traced("store.approval_decide_user")
    async def approval_decide_user(self, approval_id: int, *, approved: bool,
                                   error: str | None) -> ApprovalTicket:
        await self.flush()
        return await db_call(
            ports.approvals().decide_user, approval_id=approval_id, session_id=self.session_id,
            approved=approved, error=error,
        )

    @tracing.traced("store.approval_decision")
    async def approval_decision(self, approval_id: int) -> tuple[str, str]:
        """(status, who declined) of the approval row; a row gone is cancelled."""
        decision = await db_call(ports.approvals().decision, approval_id)
        return decision if decision is not None else ("cancelled", "")

    @tracing.traced("store.approval_expire")
    async def approval_expire(self, call: PendingCall, outcome: Outcome) -> None:
        """Nobody decided in time: the approval and the call end with ``outcome``."""
        await self._ended_with_approval(call, lambda: db_call(
            ports.approvals().expire, approval_id=call.approval_id, error=outcome.error))

    @tracing.traced("store.approval_close")
    async def approval_close(self, call: PendingCall, status: str, outcome: Outcome) -> None:
        """The approval closes as ``status`` (cancelled, disconnected), the call
        ends with ``outcome``."""
        await self._ended_with_approval(call, lambda: db_call(
            ports.approvals().close, approval_id=call.approval_id, status=status,
            call_status=outcome.status, error=outcome.error))

    @tracing.traced("store.approval_executed")
    async def approval_executed(self, call: PendingCall, outcome: Outcome) -> None:
        """The approved call ran: executed or failed, the call's ``outcome`` with it."""
        await self._ended_with_approval(call, lambda: db_call(
            ports.approvals().record_execution, approval_id=call.approval_id,
            ok=not outcome.is_error, error=outcome.error, result=outcome.result))

    async def _ended_with_approval(self, call: PendingCall, write) -> None:
        """Write a call's end with its approval's event (``write``: True when
        the call's row is final after it). The outcome is not written behind
        as well: not once the write says the row is final, nor when it
        failed (neither was written) or is cut short (it lands whole or not
        at all). Only a row the approval left open (its decision went
        another way) is written behind, as a call without one."""
        await self.flush()
        self._ended_by_approval.add(call.call_id)
        if not await write():
            self._ended_by_approval.discard(call.call_id)
