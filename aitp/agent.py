"""The agent turn's model loop: stream Claude's answer, hand its tool calls
to the piece that runs them, keep the conversation.

One ``Agent`` per connection. ``run_turn()`` runs as its own task, owned by
the consumer, and is cancellable at any await: whatever happens, every
``tool_use`` the model emitted gets exactly one ``tool_result`` in the
conversation and one final status in the ``ToolCall`` table, and the turn
ends through ``TurnIO.end_turn`` -- the one place a turn ends.

The rest of the turn, by concern: ``aitp.agent_page_tools`` (TOOL_CALL out,
TOOL_RESULT in), ``aitp.agent_server_tools`` (run on the server, after
approval), ``aitp.agent_approvals`` (a person decides), ``aitp.agent_text``
(text frames, history window), ``aitp.agent_parts`` (what they share),
``aitp.agent_voice`` (a voice turn's listening and speaking: the same turn,
with the user's words transcribed first and the answer spoken as it streams).
Inbound answers arrive through the ``on_*`` methods, called from the
consumer's receive handler; they resolve futures the turn awaits, never
await the turn themselves.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable

from aitp import protocol as p
from aitp.agent_approvals import Approvals
from aitp.agent_page_tools import PageTools
from aitp.agent_parts import AgentConfig, AgentIO, ApprovalLimits, PageSnapshot, TurnIO, TurnParts
from aitp.agent_server_tools import ServerTools
from aitp.agent_store import AgentStore
from aitp.agent_text import TextStreamer, bounded_history
from aitp.agent_voice import Listening, Speaker, audio_usage, voice_record
from aitp.ledger import (
    CANCELLED,
    CANCELLED_MESSAGE,
    ERROR,
    INVALID_ARGS,
    LEFT_MESSAGE,
    UNAVAILABLE,
    Ledger,
    Outcome,
    PendingCall,
    checked_arguments,
    new_call_id,
    unusable_arguments,
)
from aitp.llm.base import LlmBackend, LlmError, LlmRequest, MessageComplete, TextDelta, Usage
from aitp.ports import ServerTool
from aitp.quota import QuotaExceeded, TokenQuota
from aitp.tools import Risk, ToolSurface
from aitp.turn_state import TurnState

__all__ = ["Agent", "AgentConfig", "AgentIO", "PageSnapshot", "TextStreamer", "TurnIO",
           "bounded_history"]

logger = logging.getLogger(__name__)

TOOL_GUIDANCE = (
    "You act inside the user's web page through tools that the page declares.\n"
    "- Tools of risk none or low: call them directly when they serve the user's request; do not ask "
    "for confirmation.\n"
    "- Tools of risk high or critical: call them directly as well. The page itself asks the user to "
    "approve the action before it runs. Never ask the user to confirm in the chat or by voice "
    "instead, and never say the action happened until its tool result says so.\n"
    "- If a tool result is an error, or the user declined, say so plainly and do not retry the same "
    "call unasked.\n"
    "- The page the user is on is described in [page] blocks; after a tool navigates, a new [page] "
    "block shows the new page and its tools."
)

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


class Agent:
    def __init__(
        self,
        *,
        session_id: str,
        tenant_id: int,
        system_prompt: str,
        backend: LlmBackend,
        config: AgentConfig,
        io: TurnIO,
        store: AgentStore,
        server_tools: dict[str, ServerTool] | None = None,
        limits: ApprovalLimits | None = None,
        quota: TokenQuota | None = None,
    ) -> None:
        self.session_id = session_id
        self.tenant_id = tenant_id
        self.system_prompt = system_prompt
        self.backend = backend
        self.config = config
        self.io = io
        self.store = store
        # Each model request is reserved against the tenant's token quota.
        self.quota = quota
        self.ledger = Ledger()
        parts = TurnParts(session_id=session_id, tenant_id=tenant_id, config=config, io=io,
                          store=store, ledger=self.ledger, limits=limits)
        self.approvals = Approvals(parts)
        self.page_tools = PageTools(parts, self.approvals)
        self.server_tools = ServerTools(parts, self.approvals, server_tools)
        self.history: list[dict] = []
        self.turn = 0
        self._seq = 0
        self._unsaved: list[dict] = []
        self._last_page: PageSnapshot | None = None
        # The model-ready tool list and the surface it was built from.
        self._tools_for: ToolSurface | None = None
        self._tools: list[dict] = []
        # What pending calls become when the turn task is cancelled.
        self.cancel_status = CANCELLED
        # The running voice turn's voice, and whether a barge-in cut it.
        self._speaker: Speaker | None = None
        self._barged_in = False

    def interrupt(self) -> None:
        """VOICE_INTERRUPT: the agent's voice stops now, before the turn's
        task is cancelled; the turn stores what the user heard."""
        self._barged_in = True
        if self._speaker is not None:
            self._speaker.stop()

    # --- the turn ------------------------------------------------------------

    async def run_turn(self, text: str = "", *, voice: Listening | None = None) -> None:
        """One turn: ``text`` typed, or ``voice`` heard (transcribed, then the
        same turn, with the answer spoken as well as written)."""
        self.turn += 1
        usage = Usage()
        streamer = TextStreamer(self.io.send_message, self.config.stream_interval)
        full_text: list[str] = []
        log = _SessionLog(logger, self.session_id)
        done: p.Message | None = None
        speaker: Speaker | None = None
        self._barged_in = False
        # Where the text of the round not yet stored starts in the full text.
        round_start = 0
        try:
            await self.io.set_state(TurnState.ANSWERING)
            if voice is not None:
                text, _ = await voice.hear(self.io.send_message)
                if not text:
                    await self.io.send_message(p.voice_state("turn_complete"))
                    done = p.agent_response("", True)
                    return
                speaker = self._speaker = Speaker(self.io.send_message, owner=voice.owner)
            await self._append("user", [{"type": "text", "text": text}, *self._page_blocks()])
            rounds = 0
            while True:
                force_answer = rounds >= self.config.max_tool_rounds
                request = self._build_request(force_answer=force_answer)
                completion = await self._request(request, usage, streamer, full_text, speaker)
                content, refused = self._as_recorded(completion.content)
                tool_uses = [b for b in content if b.get("type") == "tool_use"]
                if not tool_uses:
                    if speaker is not None:
                        # Stored once it was all said: a barge-in stores what was.
                        await streamer.close()
                        await speaker.finish()
                    # An empty answer is not stored: the API refuses an empty
                    # message in the next request.
                    if content:
                        await self._append("assistant", content)
                    break
                rounds += 1
                await streamer.close()
                skip = (Outcome(CANCELLED, error="Tool round limit reached; answer without tools.")
                        if force_answer else None)
                # The round's text is stored with its tool calls, heard or not.
                round_start = len("".join(full_text))
                await self._run_tools(content, tool_uses, skip=skip, refused=refused)
                if force_answer:
                    break
                await self.io.set_state(TurnState.ANSWERING)
            await streamer.close()
            if speaker is not None:
                await speaker.finish()
                await self.io.send_message(p.voice_state("turn_complete"))
            done = p.agent_response("".join(full_text), True)
            log.info("turn %s done: %s rounds", self.turn, rounds)
        except asyncio.CancelledError:
            # A barge-in, or the page gone (closed, ended by an operator, the
            # server stopping): the answer is stored as far as the user got it.
            # Spoken: as far as its audio went out; typed: as far as its text did.
            said = "".join(full_text)
            said = speaker.spoken_text(said) if speaker is not None else said[:streamer.sent_chars]
            await self._store_said(said, round_start)
            raise
        except (LlmError, QuotaExceeded) as exc:
            log.warning("turn %s failed: %s (%s)", self.turn, exc.code, exc.status)
            await streamer.discard()
            await self.io.send_message(p.error_event(exc.code, exc.message))
            if speaker is not None:
                await speaker.aclose()
                await self.io.send_message(p.voice_state("turn_complete"))
            done = p.agent_response("", True)
        except Exception:
            # Our bug, not the peer's: log it, end the turn for the page.
            log.exception("turn %s crashed", self.turn)
            await streamer.discard()
            await self.io.send_message(p.error_event("internal_error", "Something went wrong on the server."))
            if speaker is not None:
                await speaker.aclose()
                await self.io.send_message(p.voice_state("turn_complete"))
            done = p.agent_response("", True)
        finally:
            try:
                self._speaker = None
                if speaker is not None:
                    await speaker.aclose()
                await streamer.discard()
                # Bookkeeping runs even while the task is being cancelled.
                counted = await self.quota.take_counted() if self.quota is not None else None
                await self._checkpoint(usage=usage, audio=audio_usage(voice, speaker), counted=counted)
                await self.io.set_state(TurnState.IDLE)
            finally:
                # Last of all, whatever the bookkeeping raised: the page may
                # send its next message the moment it reads the done frame,
                # and the turn must be over by then.
                await self.io.end_turn(done)

    async def _store_said(self, said: str, round_start: int) -> None:
        """After a barge-in or the page's leaving: the answer as far as the user
        got it, stored as the assistant's message (the part not stored with a
        tool round)."""
        said = said[round_start:].strip()
        if said and self.history and self.history[-1]["role"] == "user":
            await self._append("assistant", [{"type": "text", "text": said}])

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
        """The tools as the model gets them, built once per tool surface (a
        fresh list each time; its dicts are shared, and nothing writes to them)."""
        if self._tools_for is not surface:
            tools = surface.anthropic_tools()
            by_name = {spec.name: spec for spec in surface.effective}
            for tool in tools:
                note = RISK_NOTES.get(by_name[tool["name"]].risk) if tool["name"] in by_name else None
                if note:
                    tool["description"] = (tool.get("description") or "") + note
            self._tools_for, self._tools = surface, tools
        return list(self._tools)

    def _build_request(self, *, force_answer: bool) -> LlmRequest:
        # The history's own messages (nothing downstream writes to them); only
        # the last is copied, to carry the cache breakpoint: one at the end of
        # the conversation, so the next round (and the next turn) reads
        # everything before it from the cache.
        messages = list(bounded_history(self.history, self.config.history_messages))
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

    async def _request(
        self, request: LlmRequest, usage: Usage, streamer: TextStreamer, full_text: list[str],
        speaker: Speaker | None = None,
    ) -> MessageComplete:
        """One model request, reserved against the tenant's token quota first
        (no room: ``QuotaExceeded`` ends the turn), its usage added to the
        turn's, then settled: the reservation released, the real tokens
        counted. A request that fails or is cancelled releases it."""
        if self.quota is None:
            completion = await self._stream(request, streamer, full_text, speaker)
            _add_usage(usage, completion.usage)
            return completion
        reservation = await self.quota.reserve(request)
        try:
            completion = await self._stream(request, streamer, full_text, speaker)
        except BaseException:
            await self.quota.release(reservation)
            raise
        _add_usage(usage, completion.usage)
        await self.quota.settle(reservation, completion.usage)
        return completion

    async def _stream(
        self, request: LlmRequest, streamer: TextStreamer, full_text: list[str],
        speaker: Speaker | None = None,
    ) -> MessageComplete:
        separator_due = bool(full_text)
        async with contextlib.aclosing(self.backend.stream(request)) as events:
            async for event in events:
                if isinstance(event, TextDelta):
                    # Sent, spoken and stored alike: what no later layer could
                    # hold (U+0000, a lone surrogate) is U+FFFD (_as_recorded).
                    text = p.storable_text(event.text)
                    if separator_due and text:
                        full_text.append("\n\n")
                        streamer.push("\n\n")
                        if speaker is not None:
                            speaker.feed("\n\n")
                        separator_due = False
                    full_text.append(text)
                    streamer.push(text)
                    if speaker is not None:
                        speaker.feed(text)
                elif isinstance(event, MessageComplete):
                    return event
        raise LlmError("stream_interrupted", "The answer was cut off. Please try again.")

    def _as_recorded(self, content: list[dict]) -> tuple[list[dict], list[Outcome | None]]:
        """The model's message as the record may hold it, and for each of its
        tool_uses the outcome it ends with unrun, if any.

        What the model writes gets the check a page's frame gets
        (``aitp.protocol.find_unstorable``): its text keeps each character
        the layers cannot hold (U+0000, a lone surrogate) as U+FFFD, as the
        page was sent it (``_stream``), and so do a tool_use's id and name;
        a tool_use whose input no later layer
        could hold (the ledger's row, the conversation, a TOOL_CALL frame,
        the next model request) keeps an empty input and ends
        ``invalid_args``, the model told why in general terms."""
        recorded: list[dict] = []
        refused: list[Outcome | None] = []
        for block in content:
            kind = block.get("type")
            if kind == "text":
                text = p.storable_text(block["text"])
                if text is not block["text"]:
                    block = {**block, "text": text}
            elif kind == "tool_use":
                fixed = {key: p.storable_text(block[key]) for key in ("id", "name")
                         if isinstance(block.get(key), str) and p.text_problem(block[key])}
                code = checked_arguments(block.get("input"), max_depth=self.config.max_json_depth)
                if code is not None:
                    logger.warning("session %s: the model's input for %s cannot be used (%s)",
                                   self.session_id, fixed.get("name", block.get("name")), code)
                    fixed["input"] = {}
                refused.append(None if code is None
                               else Outcome(INVALID_ARGS, error=unusable_arguments(code)))
                if fixed:
                    block = {**block, **fixed}
            recorded.append(block)
        return recorded, refused

    async def _append(self, role: str, content: list[dict]) -> None:
        # Consecutive user messages (a turn that failed after its tool results)
        # are merged so the conversation keeps alternating.
        if role == "user" and self.history and self.history[-1]["role"] == "user":
            self.history[-1] = {"role": "user", "content": [*self.history[-1]["content"], *content]}
        else:
            self.history.append({"role": role, "content": content})
        self._seq += 1
        if self._speaker is not None:  # a voice turn: the stored copy says so
            content = voice_record(role, content, self._speaker, interrupted=self._barged_in)
        # Written at the turn's next checkpoint, with the calls about to run
        # or with the turn's usage: one database round trip instead of one
        # per message.
        self._unsaved.append({"seq": self._seq, "role": role, "content": content})

    async def _checkpoint(self, *, calls: list[PendingCall] = (), usage: Usage | None = None,
                          audio: dict[str, int] | None = None, counted: Usage | None = None) -> None:
        """Write what the turn produced since the last checkpoint. Messages stay
        buffered until the write returns, so a checkpoint cut short by a
        cancellation is simply written again (it is idempotent)."""
        messages = list(self._unsaved)
        await self.store.checkpoint(
            turn=self.turn, messages=messages, calls=calls, usage=usage, turns=1 if usage else 0,
            audio=audio, counted=counted,
        )
        del self._unsaved[: len(messages)]

    async def _append_results(self, tool_uses: list[dict], outcomes: list[Outcome]) -> None:
        blocks = [o.tool_result_block(b["id"]) for b, o in zip(tool_uses, outcomes, strict=True)]
        await self._append("user", [*blocks, *self._page_blocks()])

    # --- tools -----------------------------------------------------------------

    async def _run_tools(
        self, content: list[dict], tool_uses: list[dict], *, skip: Outcome | None = None,
        refused: list[Outcome | None] | None = None,
    ) -> None:
        """Store the assistant message, then give each of its tool_uses exactly
        one result: the outcome of running it, or ``skip``, or the one it
        was ``refused`` with (its input could not be used, ``_as_recorded``)."""
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
                outcomes[index] = (skip or (refused[index] if refused else None)
                                   or await self._run_one(call))
                call.finish(outcomes[index])
                await self.store.finish_call(call, outcomes[index])
        except BaseException as exc:
            # Cancelled (disconnect, barge-in) or a bug: the calls not yet
            # answered still each get their one result, so the conversation
            # stays valid for the next turn -- written to the end even when
            # a second cancel comes meanwhile (a barge-in, then the page
            # leaving).
            if isinstance(exc, asyncio.CancelledError):
                status, error = self.cancel_status, _cancel_message(self.cancel_status)
            else:
                status, error = ERROR, "The server failed while running this tool."
            cut_again = await _to_the_end(
                self._settle_cut_calls(calls, tool_uses, outcomes, status, error))
            if cut_again and not isinstance(exc, asyncio.CancelledError):
                raise asyncio.CancelledError() from exc
            raise
        await self._append_results(tool_uses, outcomes)  # type: ignore[arg-type]

    async def _settle_cut_calls(self, calls: list[PendingCall], tool_uses: list[dict],
                                outcomes: list[Outcome | None], status: str, error: str) -> None:
        """The end of a tool round cut short: each call keeps the outcome it
        had (finished, or answered as the cut landed), the others end with
        ``status``; rows, results and the conversation are written now."""
        # Idempotent: the checkpoint may or may not have landed.
        await self._checkpoint(calls=calls)
        for index, call in enumerate(calls):
            if outcomes[index] is not None:
                continue  # finished before the cut: its real outcome stands
            if call.future.done():
                # Answered (the page's result, the server tool's run) when the
                # cut landed, before the turn read it: the answer stands, in
                # the row and for the model.
                outcomes[index] = call.future.result()
                await self.store.finish_call(call, outcomes[index])
                continue
            outcomes[index] = Outcome(status, error=error)
            call.resolve(outcomes[index])
            if call.approval_id is not None:
                # The call's end with its approval's event, in one transaction.
                try:
                    await self.store.approval_close(call, status, outcomes[index])
                except Exception:
                    logger.exception("session %s: the end of call %s could not be written with "
                                     "its approval", self.session_id, call.call_id)
            await self.store.finish_call(call, outcomes[index])
        await self._append_results(tool_uses, outcomes)  # type: ignore[arg-type]
        await self._checkpoint()

    async def _run_one(self, call: PendingCall) -> Outcome:
        # Re-read the surface now: an earlier tool may have navigated the page.
        spec = call.spec = self.io.surface().get(call.name)
        if spec is None:
            return Outcome(UNAVAILABLE, error=f"The tool {call.name} is not available on this page.")
        problems = spec.argument_problems(call.args)
        if problems:
            return Outcome(
                INVALID_ARGS, error="Invalid arguments: " + "; ".join(problems[:10])
            )
        if spec.origin == "server":
            return await self.server_tools.run(call)
        return await self.page_tools.run(call)

    # --- answers from the page and from operators ------------------------------

    async def on_tool_result(self, payload: p.ToolResult) -> p.Message | None:
        """Returns an error event to send back, or None when accepted."""
        return await self.page_tools.on_tool_result(payload)

    async def on_approval_request(self, payload: p.ApprovalRequest) -> p.Message | None:
        return await self.approvals.on_approval_request(payload)

    async def on_approval_response(self, payload: p.ApprovalResponse) -> p.Message | None:
        return await self.approvals.on_approval_response(payload)

    async def on_approval_decided(self, approval_id: int) -> None:
        await self.approvals.on_approval_decided(approval_id)

def _has_tool_blocks(messages: list[dict]) -> bool:
    return any(
        isinstance(block, dict) and block.get("type") in ("tool_use", "tool_result")
        for message in messages
        for block in message["content"]
    )


async def _to_the_end(work: Awaitable[None]) -> bool:
    """Await ``work`` to its end even if this task is cancelled meanwhile
    (the cancel does not stop it); True when a cancel came."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while True:
        try:
            await asyncio.shield(task)
            return cancelled
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True


def _cancel_message(status: str) -> str:
    return LEFT_MESSAGE if status == "disconnected" else CANCELLED_MESSAGE


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
