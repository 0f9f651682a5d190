"""The agent turn: stream Claude's answer, dispatch its tool calls, keep the ledger.

One ``Agent`` per connection. ``run_turn()`` runs as its own task, owned by
the consumer, and is cancellable at any await: whatever happens, every
``tool_use`` the model emitted gets exactly one ``tool_result`` in the
conversation and one final status in the ``ToolCall`` table.

Inbound answers (TOOL_RESULT, APPROVAL_*) arrive through ``on_*`` methods
called from the consumer's receive handler; they resolve futures the turn
awaits, never await the turn themselves.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol

from aitp import protocol as p
from aitp.agent_store import AgentStore
from aitp.ledger import (
    CANCELLED,
    DECLINED_MESSAGE,
    DENIED,
    ERROR,
    EXPIRED,
    INVALID_ARGS,
    SUCCESS,
    TIMEOUT,
    UNAVAILABLE,
    Ledger,
    Outcome,
    PendingCall,
    new_call_id,
    wait_until_deadline,
)
from aitp.llm.base import LlmBackend, LlmError, LlmRequest, MessageComplete, TextDelta, Usage
from aitp.tools import Risk, ToolSurface, canonical_json, validate_arguments

logger = logging.getLogger(__name__)

TOOL_GUIDANCE = """\
You act inside the user's web page through tools that the page declares.
- Tools of risk none or low: call them directly when they serve the user's request; do not ask for confirmation.
- Tools of risk high or critical: call them directly as well. The page itself asks the user to approve the action before it runs. Never ask the user to confirm in the chat or by voice instead, and never say the action happened until its tool result says so.
- If a tool result is an error, or the user declined, say so plainly and do not retry the same call unasked.
- The page the user is on is described in [page] blocks; after a tool navigates, a new [page] block shows the new page and its tools."""

# How often a turn waiting on a human re-reads the approval row, in case a
# channel-layer notification was lost.
DECISION_RECHECK_SECONDS = 3.0

RISK_NOTES = {
    Risk.HIGH: " (risk: high; the user approves it in the page before it runs)",
    Risk.CRITICAL: " (risk: critical; the user approves it in the page before it runs)",
}


# Declared, never callable (tool_choice none), when the page has no tools but
# the history holds tool blocks.
NO_TOOLS_PLACEHOLDER = {
    "name": "no_tools_on_this_page",
    "description": "The page offers no tools right now. This tool cannot be called.",
    "input_schema": {"type": "object", "properties": {}},
}


@dataclass(frozen=True)
class AgentConfig:
    model: str
    max_tokens: int = 1024
    tool_timeout: float = 10.0
    approval_timeout: float = 120.0
    max_tool_rounds: int = 8
    history_messages: int = 40
    stream_interval: float = 0.04


@dataclass(frozen=True)
class PageSnapshot:
    url: str
    title: str
    context: dict

    def describe(self) -> str:
        context = json.dumps(self.context, ensure_ascii=False, sort_keys=True)
        return f"[page]\nurl: {self.url}\ntitle: {self.title}\ncontext: {context}"


class AgentIO(Protocol):
    """What the turn needs from the connection that owns it."""

    async def send_message(self, message: p.Message) -> None: ...
    def surface(self) -> ToolSurface: ...
    def page(self) -> PageSnapshot: ...
    async def set_state(self, state: str) -> None: ...


class ApprovalLimits(Protocol):
    async def check_approval_request(self, call_id: str) -> p.Message | None: ...


class ServerToolRunner(Protocol):
    async def run(self, args: dict, *, session_id: str, tenant_id: int, call_id: str) -> Any: ...


class TextStreamer:
    """Coalesces text deltas into at most one AGENT_RESPONSE frame per interval.

    The first delta goes out at once (time to first token matters); later ones
    wait for the interval. ``close()`` flushes what is left.
    """

    def __init__(self, send: Callable[[p.Message], Awaitable[None]], interval: float) -> None:
        self._send = send
        self._interval = interval
        self._buffer: list[str] = []
        self._last_sent = float("-inf")
        self._timer: asyncio.Task | None = None
        self._sending = False

    def push(self, text: str) -> None:
        if not text:
            return
        self._buffer.append(text)
        if self._timer is None or self._timer.done():
            self._timer = asyncio.create_task(self._flush_later())

    async def _flush_later(self) -> None:
        loop = asyncio.get_running_loop()
        delay = self._last_sent + self._interval - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        await self._flush()

    async def _flush(self) -> None:
        if not self._buffer:
            return
        text = "".join(self._buffer)
        self._buffer.clear()
        self._last_sent = asyncio.get_running_loop().time()
        self._sending = True
        try:
            await self._send(p.agent_response(text, False))
        finally:
            self._sending = False

    async def close(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None and not timer.done():
            if self._sending:
                await timer  # a frame is on its way: let it finish, in order
            else:
                timer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await timer
        await self._flush()

    async def discard(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await timer
        self._buffer.clear()


def bounded_history(history: list[dict], limit: int) -> list[dict]:
    """The last ``limit`` messages, starting at a user message that carries no
    tool_result, so a tool_use is never separated from its tool_result."""
    if len(history) <= limit:
        return history
    start = len(history) - limit
    while start < len(history):
        message = history[start]
        if message["role"] == "user" and not any(
            block.get("type") == "tool_result" for block in message["content"]
        ):
            return history[start:]
        start += 1
    # No clean cut inside the window: fall back to the last user text message.
    for index in range(len(history) - 1, -1, -1):
        message = history[index]
        if message["role"] == "user" and not any(
            block.get("type") == "tool_result" for block in message["content"]
        ):
            return history[index:]
    return history


class Agent:
    def __init__(
        self,
        *,
        session_id: str,
        tenant_id: int,
        system_prompt: str,
        backend: LlmBackend,
        config: AgentConfig,
        io: AgentIO,
        store: AgentStore,
        server_tools: dict[str, ServerToolRunner] | None = None,
        limits: ApprovalLimits | None = None,
    ) -> None:
        self.session_id = session_id
        self.tenant_id = tenant_id
        self.system_prompt = system_prompt
        self.backend = backend
        self.config = config
        self.io = io
        self.store = store
        self.server_tools = server_tools or {}
        self.limits = limits
        self.ledger = Ledger()
        self.history: list[dict] = []
        self.turn = 0
        self._seq = 0
        self._unsaved: list[dict] = []
        self._last_page: PageSnapshot | None = None
        # What pending calls become when the turn task is cancelled.
        self.cancel_status = CANCELLED

    # --- the turn ------------------------------------------------------------

    async def run_turn(self, text: str) -> None:
        self.turn += 1
        usage = Usage()
        streamer = TextStreamer(self.io.send_message, self.config.stream_interval)
        full_text: list[str] = []
        log = _SessionLog(logger, self.session_id)
        done: p.Message | None = None
        try:
            await self.io.set_state("answering")
            await self._append("user", [{"type": "text", "text": text}, *self._page_blocks()])
            rounds = 0
            while True:
                force_answer = rounds >= self.config.max_tool_rounds
                request = self._build_request(force_answer=force_answer)
                completion = await self._stream(request, streamer, full_text)
                _add_usage(usage, completion.usage)
                tool_uses = [b for b in completion.content if b.get("type") == "tool_use"]
                if not tool_uses:
                    # An empty answer is not stored: the API refuses an empty
                    # message in the next request.
                    if completion.content:
                        await self._append("assistant", completion.content)
                    break
                rounds += 1
                await streamer.close()
                skip = (Outcome(CANCELLED, error="Tool round limit reached; answer without tools.")
                        if force_answer else None)
                await self._run_tools(completion.content, tool_uses, skip=skip)
                if force_answer:
                    break
                await self.io.set_state("answering")
            await streamer.close()
            done = p.agent_response("".join(full_text), True)
            log.info("turn %s done: %s rounds", self.turn, rounds)
        except LlmError as exc:
            log.warning("turn %s failed: %s (%s)", self.turn, exc.code, exc.status)
            await streamer.discard()
            await self.io.send_message(p.error_event(exc.code, exc.message))
            done = p.agent_response("", True)
        except Exception:
            # Our bug, not the peer's: log it, end the turn for the page.
            log.exception("turn %s crashed", self.turn)
            await streamer.discard()
            await self.io.send_message(p.error_event("internal_error", "Something went wrong on the server."))
            done = p.agent_response("", True)
        finally:
            await streamer.discard()
            # Bookkeeping runs even while the task is being cancelled.
            await self._checkpoint(usage=usage)
            await self.io.set_state("idle")
            # Last of all: the page may send its next message the moment it
            # reads the done frame, and the turn must be over by then.
            if done is not None:
                await self.io.send_message(done)

    def _page_blocks(self) -> list[dict]:
        page = self.io.page()
        if page == self._last_page:
            return []
        self._last_page = page
        return [{"type": "text", "text": page.describe()}]

    def _system_blocks(self) -> list[dict]:
        prompt = (self.system_prompt or "").strip()
        text = f"{prompt}\n\n{TOOL_GUIDANCE}" if prompt else TOOL_GUIDANCE
        return [{"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}]

    def _tool_params(self, surface: ToolSurface) -> list[dict]:
        tools = surface.anthropic_tools()
        by_name = {spec.name: spec for spec in surface.effective}
        for tool in tools:
            note = RISK_NOTES.get(by_name[tool["name"]].risk) if tool["name"] in by_name else None
            if note:
                tool["description"] = (tool.get("description") or "") + note
        return tools

    def _build_request(self, *, force_answer: bool) -> LlmRequest:
        messages = [dict(m) for m in bounded_history(self.history, self.config.history_messages)]
        # One cache breakpoint at the end of the conversation so the next round
        # (and the next turn) reads everything before it from the cache.
        last = messages[-1]
        content = [dict(block) for block in last["content"]]
        content[-1]["cache_control"] = {"type": "ephemeral"}
        messages[-1] = {"role": last["role"], "content": content}
        tools = self._tool_params(self.io.surface())
        tool_choice = {"type": "none"} if (force_answer and tools) else None
        if not tools and _has_tool_blocks(messages):
            # The API refuses tool_use/tool_result blocks in a request that
            # defines no tools, and a navigation can leave the page with none.
            tools = [dict(NO_TOOLS_PLACEHOLDER)]
            tool_choice = {"type": "none"}
        return LlmRequest(
            model=self.config.model,
            system=self._system_blocks(),
            messages=messages,
            tools=tools,
            max_tokens=self.config.max_tokens,
            tool_choice=tool_choice,
        )

    async def _stream(
        self, request: LlmRequest, streamer: TextStreamer, full_text: list[str]
    ) -> MessageComplete:
        separator_due = bool(full_text)
        async with contextlib.aclosing(self.backend.stream(request)) as events:
            async for event in events:
                if isinstance(event, TextDelta):
                    if separator_due and event.text:
                        full_text.append("\n\n")
                        streamer.push("\n\n")
                        separator_due = False
                    full_text.append(event.text)
                    streamer.push(event.text)
                elif isinstance(event, MessageComplete):
                    return event
        raise LlmError("stream_interrupted", "The answer was cut off. Please try again.")

    async def _append(self, role: str, content: list[dict]) -> None:
        # Consecutive user messages (a turn that failed after its tool results)
        # are merged so the conversation keeps alternating.
        if role == "user" and self.history and self.history[-1]["role"] == "user":
            self.history[-1] = {"role": "user", "content": [*self.history[-1]["content"], *content]}
        else:
            self.history.append({"role": role, "content": content})
        self._seq += 1
        # Written at the turn's next checkpoint, with the calls about to run
        # or with the turn's usage: one database round trip instead of one
        # per message.
        self._unsaved.append({"seq": self._seq, "role": role, "content": content})

    async def _checkpoint(self, *, calls: list[PendingCall] = (), usage: Usage | None = None) -> None:
        """Write what the turn produced since the last checkpoint. Messages stay
        buffered until the write returns, so a checkpoint cut short by a
        cancellation is simply written again (it is idempotent)."""
        messages = list(self._unsaved)
        await self.store.checkpoint(
            turn=self.turn, messages=messages, calls=calls, usage=usage, turns=1 if usage else 0
        )
        del self._unsaved[: len(messages)]

    async def _append_results(self, tool_uses: list[dict], outcomes: list[Outcome]) -> None:
        blocks = [o.tool_result_block(b["id"]) for b, o in zip(tool_uses, outcomes)]
        await self._append("user", [*blocks, *self._page_blocks()])

    # --- tools -----------------------------------------------------------------

    async def _run_tools(
        self, content: list[dict], tool_uses: list[dict], *, skip: Outcome | None = None
    ) -> None:
        """Store the assistant message, then give each of its tool_uses exactly
        one result: the outcome of running it, or ``skip``."""
        calls = [
            PendingCall(
                call_id=new_call_id(),
                tool_use_id=block["id"],
                name=block["name"],
                args=block.get("input") if isinstance(block.get("input"), dict) else {},
                spec=None,
            )
            for block in tool_uses
        ]
        surface = self.io.surface()
        for call in calls:
            # Recorded with the tool as it is now; re-read before each dispatch.
            call.spec = surface.get(call.name)
        outcomes: list[Outcome | None] = [None] * len(calls)
        try:
            # Inside the try: a cancel can land on this very write, and the
            # tool_uses it stores must still get their results.
            await self._append("assistant", content)
            await self._checkpoint(calls=calls)
            for index, call in enumerate(calls):
                outcomes[index] = skip or await self._run_one(call)
                await self.store.finish_call(call, outcomes[index])
        except BaseException as exc:
            # Cancelled (disconnect, barge-in) or a bug: the calls not yet
            # answered still each get their one result, so the conversation
            # stays valid for the next turn.
            if isinstance(exc, asyncio.CancelledError):
                status, error = self.cancel_status, _cancel_message(self.cancel_status)
            else:
                status, error = ERROR, "The server failed while running this tool."
            # Idempotent: the checkpoint may or may not have landed.
            await self._checkpoint(calls=calls)
            for index, call in enumerate(calls):
                if outcomes[index] is None:
                    outcomes[index] = Outcome(status, error=error)
                    call.resolve(outcomes[index])
                    await self.store.finish_call(call, outcomes[index])
                    if call.approval_id is not None:
                        await self.store.approval_close(call.approval_id, status)
            await self._append_results(tool_uses, outcomes)  # type: ignore[arg-type]
            raise
        await self._append_results(tool_uses, outcomes)  # type: ignore[arg-type]

    async def _run_one(self, call: PendingCall) -> Outcome:
        # Re-read the surface now: an earlier tool may have navigated the page.
        spec = call.spec = self.io.surface().get(call.name)
        if spec is None:
            return Outcome(UNAVAILABLE, error=f"The tool {call.name} is not available on this page.")
        problems = validate_arguments(spec.input_schema, call.args)
        if problems:
            return Outcome(
                INVALID_ARGS, error="Invalid arguments: " + "; ".join(problems[:10])
            )
        if spec.origin == "server":
            return await self._run_server_tool(call)
        return await self._run_client_tool(call)

    async def _run_client_tool(self, call: PendingCall) -> Outcome:
        loop = asyncio.get_running_loop()
        call.deadline = loop.time() + self.config.tool_timeout
        self.ledger.add(call)
        try:
            await self.io.send_message(p.tool_call(call.call_id, call.name, call.args))
            # Shielded: the frame is out, so the row must say so even if the
            # turn is cancelled this very moment (the page left).
            await asyncio.shield(self.store.mark_call(call, "sent", sent=True))
            await self.io.set_state("waiting_tool")
            outcome = await wait_until_deadline(call, call.future)
            if outcome is not None:
                return outcome
            if call.approval_id is not None:
                await self.store.approval_expire(call.approval_id)
                outcome = Outcome(EXPIRED, error="The user did not decide in time; the action was not approved.")
                await self.io.send_message(
                    p.error_event("approval_expired", "The approval request expired.", callId=call.call_id)
                )
            else:
                outcome = Outcome(
                    TIMEOUT,
                    error=f"The page did not answer within {self.config.tool_timeout:g} seconds.",
                )
                await self.io.send_message(
                    p.error_event("tool_timeout", f"The tool {call.name} did not answer in time.",
                                  callId=call.call_id)
                )
            call.resolve(outcome)
            return outcome
        finally:
            self.ledger.remove(call.call_id)

    async def _run_server_tool(self, call: PendingCall) -> Outcome:
        runner = self.server_tools.get(call.name)
        if runner is None:
            return Outcome(UNAVAILABLE, error=f"The tool {call.name} is not available.")
        assert call.spec is not None
        loop = asyncio.get_running_loop()
        if call.spec.risk.needs_approval:
            call.deadline = loop.time() + self.config.approval_timeout
            self.ledger.add(call)
            try:
                message = f"Allow {call.name} with {canonical_json(call.args)[:300]}?"
                approval = await self.store.approval_request_server(
                    call, runner, timeout=self.config.approval_timeout, message=message
                )
                call.approval_id = approval.id
                await self.io.set_state("waiting_approval")
                if approval.needs_user:
                    await self.io.send_message(p.system_event("approval_required", message=message,
                                                      data={"callId": call.call_id}))
                    await self.io.send_message(
                        p.approval_request(call.call_id, call.name, call.spec.risk.value, call.args, message)
                    )
                if approval.needs_operator:
                    await self.io.send_message(p.system_event(
                        "waiting", message="Waiting for an operator to approve this action.",
                        data={"callId": call.call_id, "reason": "operator_approval"},
                    ))
                decision = await self._await_decision(call)
                if decision is None:
                    await self.store.approval_expire(call.approval_id)
                    await self.io.send_message(
                        p.error_event("approval_expired", "The approval request expired.",
                                      callId=call.call_id)
                    )
                    return Outcome(EXPIRED, error="Nobody approved the action in time; it did not run.")
                if decision != "approved":
                    return Outcome(DENIED, error=DECLINED_MESSAGE)
            finally:
                self.ledger.remove(call.call_id)
        await self.store.mark_call(call, "running")
        await self.io.set_state("answering")
        try:
            result = await runner.run(
                call.args, session_id=self.session_id, tenant_id=self.tenant_id, call_id=call.call_id
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a tool's own failure becomes the model's error result
            logger.info("session %s: server tool %s failed: %s", self.session_id, call.name, exc)
            if call.approval_id is not None:
                await self.store.approval_executed(call.approval_id, ok=False, error=str(exc))
            return Outcome(ERROR, error=str(exc) or "The tool failed.")
        if call.approval_id is not None:
            await self.store.approval_executed(call.approval_id, ok=True)
        return Outcome(SUCCESS, result=result)

    async def _await_decision(self, call: PendingCall) -> str | None:
        """The human decision on a server tool, or None past the deadline.

        Decisions arrive as notifications (the page's answer, or an operator's
        over the channel layer); the row is also re-read every few seconds so
        a lost notification delays the turn instead of expiring it."""
        loop = asyncio.get_running_loop()
        while not call.decision.done():
            remaining = call.deadline - loop.time()
            if remaining <= 0:
                return None
            await asyncio.wait({call.decision}, timeout=min(remaining, DECISION_RECHECK_SECONDS))
            if not call.decision.done():
                await self._apply_approval_row(call)
        return call.decision.result()

    # --- answers from the page and from operators ------------------------------

    async def on_tool_result(self, payload: p.ToolResult) -> p.Message | None:
        """Returns an error event to send back, or None when accepted."""
        call = self.ledger.get(payload.callId)
        if call is None or call.origin == "server":
            return _unknown_call(payload.callId)
        if payload.status == "pending_approval":
            return await self._approval_opened(call, call.name, call.args, message="")
        if call.approval_id is not None:
            return p.error_event(
                "approval_pending",
                "This call is waiting for the user's decision; answer with APPROVAL_RESPONSE.",
                callId=payload.callId,
            )
        if call.risk.needs_approval:
            return await self._approval_skipped(call, "tool_result")
        if payload.status == "success":
            call.resolve(Outcome(SUCCESS, result=payload.result))
        else:
            call.resolve(Outcome(ERROR, error=payload.error or "The tool failed in the page."))
        return None

    async def on_approval_request(self, payload: p.ApprovalRequest) -> p.Message | None:
        call = self.ledger.get(payload.callId)
        if call is None or call.origin == "server":
            return _unknown_call(payload.callId)
        if self.limits is not None:
            refused = await self.limits.check_approval_request(call.call_id)
            if refused is not None:
                return refused
        if call.approval_id is not None and (payload.toolName, payload.args) == (call.name, call.args):
            # Asked already: a repeat changes nothing, and writes no audit row.
            return None
        return await self._approval_opened(call, payload.toolName, payload.args, payload.message)

    async def _approval_opened(
        self, call: PendingCall, tool_name: str, args: dict, message: str
    ) -> p.Message | None:
        from approvals.services import ApprovalError

        try:
            approval = await self.store.approval_request_client(
                call, tool_name=tool_name, args=args, message=message,
                timeout=self.config.approval_timeout,
            )
        except ApprovalError as exc:
            if exc.code == "approval_mismatch":
                # The page wants approval for something other than what the
                # model asked: refuse, and tell the model the call did not happen.
                call.resolve(Outcome(
                    ERROR, error="The page asked approval for different arguments; the call was refused."
                ))
            return p.error_event(exc.code, exc.message, callId=call.call_id)
        call.approval_id = approval.id
        call.extend(asyncio.get_running_loop().time() + self.config.approval_timeout)
        await self.io.set_state("waiting_approval")
        return None

    async def on_approval_response(self, payload: p.ApprovalResponse) -> p.Message | None:
        from approvals.services import ApprovalError

        call = self.ledger.get(payload.callId)
        if call is None:
            return _unknown_call(payload.callId)
        if call.approval_id is not None:
            try:
                approval = await self.store.approval_decide_user(
                    call.approval_id, approved=payload.approved, error=payload.error
                )
            except ApprovalError as exc:
                if call.origin == "server":
                    await self._apply_approval_row(call)
                return p.error_event(exc.code, exc.message, callId=call.call_id)
        elif call.origin == "server":
            return _unknown_call(payload.callId)
        elif call.risk.needs_approval:
            return await self._approval_skipped(call, "approval_response_without_request")
        else:
            approval = None
        if call.origin == "server":
            if approval is not None and approval.status == "pending":
                # Approved by the user; an operator still has to decide.
                return None
            await self._apply_approval_row(call)
            return None
        # An interface tool: the response replaces the TOOL_RESULT. A refusal
        # is never a success, whatever else the frame carries.
        if not payload.approved:
            call.resolve(Outcome(DENIED, error=DECLINED_MESSAGE))
            return None
        if payload.error:
            call.resolve(Outcome(ERROR, error=payload.error))
        else:
            call.resolve(Outcome(SUCCESS, result=payload.result))
        if call.approval_id is not None:
            await self.store.approval_executed(
                call.approval_id, ok=not payload.error, error=payload.error or ""
            )
        return None

    async def _approval_skipped(self, call: PendingCall, reason: str) -> p.Message:
        """A high or critical page call answered with no APPROVAL_REQUEST
        before it: the answer does not count. The call ends as refused, the
        model is told the action was not approved, and the violation is
        audited for the operators' review queue."""
        from approvals.services import ApprovalError

        try:
            approval = await self.store.approval_violation(call, reason=reason)
        except ApprovalError as exc:
            return p.error_event(exc.code, exc.message, callId=call.call_id)
        call.approval_id = approval.id
        call.resolve(Outcome(DENIED, error=NOT_APPROVED_MESSAGE))
        return p.error_event(
            "approval_required",
            f"The tool {call.name} needs the user's approval first (APPROVAL_REQUEST); "
            "the answer was refused.",
            callId=call.call_id,
        )

    async def on_approval_decided(self, approval_id: int) -> None:
        """An operator decided (maybe on another process): re-read the row."""
        call = self.ledger.by_approval(approval_id)
        if call is not None:
            await self._apply_approval_row(call)

    async def _apply_approval_row(self, call: PendingCall) -> None:
        status = await self.store.approval_status(call.approval_id)
        if status == "approved":
            call.decide("approved")
        elif status in ("denied", "expired", "cancelled", "disconnected"):
            call.decide(status)


def _has_tool_blocks(messages: list[dict]) -> bool:
    return any(
        isinstance(block, dict) and block.get("type") in ("tool_use", "tool_result")
        for message in messages
        for block in message["content"]
    )


NOT_APPROVED_MESSAGE = (
    "The action was not approved: the page answered without asking the user's approval, "
    "so the result was refused."
)


def _unknown_call(call_id: str) -> p.Message:
    return p.error_event("unknown_call", "No pending tool call has this id.", callId=call_id)


def _cancel_message(status: str) -> str:
    if status == "disconnected":
        return "The user left the page before the tool answered."
    return "The turn was cancelled before the tool answered."


def _add_usage(total: Usage, more: Usage) -> None:
    total.input_tokens += more.input_tokens
    total.output_tokens += more.output_tokens
    total.cache_read_tokens += more.cache_read_tokens
    total.cache_write_tokens += more.cache_write_tokens


class _SessionLog:
    def __init__(self, log: logging.Logger, session_id: str) -> None:
        self._log = log
        self._prefix = f"session {session_id}: "

    def info(self, msg: str, *args) -> None:
        self._log.info(self._prefix + msg, *args)

    def warning(self, msg: str, *args) -> None:
        self._log.warning(self._prefix + msg, *args)

    def exception(self, msg: str, *args) -> None:
        self._log.exception(self._prefix + msg, *args)
