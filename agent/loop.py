"""The agent turn's model loop: stream Claude's answer, hand its tool calls
to the piece that runs them, keep the conversation.

One ``Agent`` per connection. ``run_turn()`` runs as its own task, owned by
the connection's runner (``connection.runner``), and is cancellable at any
await: whatever happens, every ``tool_use`` the model emitted gets exactly
one ``tool_result`` in the conversation and one final status in the
``ToolCall`` table. The agent talks back through ``TurnIO.send`` alone:
frames for the page, where the turn is (``aitp.turn.TurnEvent``), and last
of all ``TurnOver``. A cancelled turn's calls end with the status its task
was cancelled with (cancelled, or disconnected when the page left).

The rest of the turn, by concern: ``agent.page_tools`` (TOOL_CALL out,
TOOL_RESULT in), ``agent.server_tools`` (run on the server, after
approval), ``agent.approvals`` (a person decides), ``agent.text``
(text frames, history window), ``agent.request`` (what the model is
asked), ``agent.parts`` (what they share),
``agent.voice`` (a voice turn's listening and speaking: the same turn,
with the user's words transcribed first and the answer spoken as it streams).
Inbound answers arrive through the ``on_*`` methods, called from the
connection's inbox; they resolve futures the turn awaits, never
await the turn themselves.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from agent.approvals import Approvals
from agent.conversation import Conversation
from agent.page_tools import PageTools
from agent.parts import (
    AgentConfig,
    AgentIO,
    ApprovalLimits,
    PageSnapshot,
    TurnClock,
    TurnIO,
    TurnOver,
    TurnParts,
)
from agent.request import ToolParams, as_recorded, ask_model, build_request
from agent.server_tools import ServerTools
from agent.store import AgentStore
from agent.text import TextStreamer, bounded_history
from agent.voice import Listening, Speaker, audio_usage
from aitp import protocol as p
from aitp.ledger import (
    CANCELLED,
    CANCELLED_MESSAGE,
    DISCONNECTED,
    ERROR,
    INVALID_ARGS,
    LEFT_MESSAGE,
    OPERATOR_CALL,
    UNAVAILABLE,
    Ledger,
    Outcome,
    PendingCall,
    new_call_id,
)
from aitp.llm import LlmBackend, LlmError, LlmRequest, Usage
from aitp.ports import ServerTool
from aitp.pricing import cost_micros, price_of
from aitp.quota import QuotaExceeded, TokenQuota
from aitp.turn import TAKEN_OVER, TurnEvent
from runtime import metrics, model_access, tracing

__all__ = ["Agent", "AgentConfig", "AgentIO", "PageSnapshot", "TextStreamer", "TurnIO", "TurnOver",
           "bounded_history"]

logger = logging.getLogger(__name__)

INTERNAL_ERROR_MESSAGE = "Something went wrong on the server."


def _traced_turn(run_turn: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """A turn is a trace of its own (``runtime.tracing``), its root span
    ``turn``: the model's requests, the tool calls, the approvals and the
    store's writes under it."""

    @functools.wraps(run_turn)
    async def traced(agent: Agent, *args, **kwargs) -> None:
        with tracing.trace("turn", session_id=agent.session_id, turn=agent.turn + 1):
            await run_turn(agent, *args, **kwargs)

    return traced


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
        self.parts = parts = TurnParts(session_id=session_id, tenant_id=tenant_id, config=config,
                                       io=io, store=store, ledger=self.ledger, limits=limits)
        self.approvals = Approvals(parts)
        self.page_tools = PageTools(parts, self.approvals)
        self.server_tools = ServerTools(parts, self.approvals, server_tools)
        self.conversation = Conversation()
        self.turn = 0
        # The model-ready tool list, built once per tool surface.
        self._tool_params = ToolParams()
        # The running voice turn's voice.
        self._speaker: Speaker | None = None

    def interrupt(self) -> None:
        """VOICE_INTERRUPT: the agent's voice stops now, before the turn's
        task is cancelled; the turn stores what the user heard."""
        if self._speaker is not None:
            self._speaker.stop()

    # --- the turn ------------------------------------------------------------

    @_traced_turn
    async def run_turn(self, text: str = "", *, voice: Listening | None = None) -> None:
        """One turn: ``text`` typed, or ``voice`` heard (transcribed, then the
        same turn, with the answer spoken as well as written). It ends, last
        of all and whatever happened, with ``TurnOver``."""
        self.turn += 1
        self.parts.clock = TurnClock()
        run = _Run(TextStreamer(self.io.send, self.config.stream_interval), self.parts.clock)
        log = _SessionLog(logger, self.session_id)
        done: p.Message | None = None
        try:
            await self.io.send(TurnEvent.STARTED)
            if voice is not None:
                text, _ = await voice.hear(self.io.send)
                if not text:
                    await self.io.send(p.voice_state("turn_complete"))
                    done = p.agent_response("", True)
                    run.outcome = "answered"
                    return
                run.speaker = self._speaker = Speaker(self.io.send, owner=voice.owner)
            rounds = await self._answer(text, run)
            model_access.turn_answered()
            done = p.agent_response("".join(run.full_text), True)
            run.outcome = "answered"
            log.info("turn %s done: %s rounds", self.turn, rounds)
        except asyncio.CancelledError as cut:
            # A barge-in, or the page gone (closed, ended by an operator, the
            # server stopping): the answer is stored as far as the user got it,
            # even when the turn is cut again meanwhile (a barge-in, then the
            # page leaving).
            await _to_the_end(self._store_said(run, interrupted=_cut_status(cut) == CANCELLED))
            if cut.args and cut.args[0] == TAKEN_OVER:
                # The page still waits for the turn's done: it closes the
                # answer as far as the page was shown it.
                done = p.agent_response(_shown(run), True)
            raise
        except (LlmError, QuotaExceeded) as exc:
            log.warning("turn %s failed: %s (%s)", self.turn, exc.code, exc.status)
            run.outcome = "refused"  # the tenant's token quota
            if isinstance(exc, LlmError):
                run.outcome = "failed"
                metrics.llm_error(exc.code)
                model_access.turn_failed(exc.code, exc.detail)
            self.conversation.record_failure(exc.code, exc.message)
            done = await _failed(self.io, run, exc.code, exc.message)
        except Exception:
            # Our bug, not the peer's: log it, end the turn for the page.
            log.exception("turn %s crashed", self.turn)
            run.outcome = "failed"
            self.conversation.record_failure("internal_error", INTERNAL_ERROR_MESSAGE)
            done = await _failed(self.io, run, "internal_error", INTERNAL_ERROR_MESSAGE)
        finally:
            cut_again = False
            try:
                # Written to its end whatever cuts the turn meanwhile: the
                # outcomes of the calls that finished in this turn are in it.
                cut_again = await _to_the_end(self._wind_up(run, voice))
            finally:
                run.measured()
                # Last of all, whatever the bookkeeping raised: the page may
                # send its next message the moment it reads the done frame,
                # and the turn must be over by then.
                await self.io.send(TurnOver(done))
            if cut_again:
                raise asyncio.CancelledError()

    async def _answer(self, text: str, run: _Run) -> int:
        """The model's rounds until it answers without tools; how many had tools."""
        self._append("user", [{"type": "text", "text": text}, *self._page_blocks()])
        rounds = 0
        while True:
            force_answer = rounds >= self.config.max_tool_rounds
            request = self._build_request(force_answer=force_answer)
            asked = time.monotonic()
            with tracing.span("model", model=request.model) as traced:
                completion = await ask_model(self.backend, self.quota, request, run.usage, run.streamer,
                                             run.full_text, run.speaker)
                traced.set(input_tokens=completion.usage.input_tokens,
                           output_tokens=completion.usage.output_tokens)
            run.clock.model += time.monotonic() - asked
            content, refused = as_recorded(completion.content, max_depth=self.config.max_json_depth,
                                           session_id=self.session_id)
            tool_uses = [b for b in content if b.get("type") == "tool_use"]
            if not tool_uses:
                if run.speaker is not None:
                    # Stored once it was all said: a barge-in stores what was.
                    await run.streamer.close()
                    await self.io.send(TurnEvent.SPEAKING)
                    await run.speaker.finish()
                # An empty answer is not stored: the API refuses an empty
                # message in the next request.
                if content:
                    self._append("assistant", content)
                break
            rounds += 1
            await run.streamer.close()
            skip = (Outcome(CANCELLED, error="Tool round limit reached; answer without tools.")
                    if force_answer else None)
            # The round's text is stored with its tool calls, heard or not.
            run.round_start = len("".join(run.full_text))
            await self._run_tools(content, tool_uses, skip=skip, refused=refused)
            if force_answer:
                break
            await self.io.send(TurnEvent.ANSWERING)
        await run.streamer.close()
        if run.speaker is not None:
            await run.speaker.finish()
            await self.io.send(p.voice_state("turn_complete"))
        return rounds

    async def _wind_up(self, run: _Run, voice: Listening | None) -> None:
        """The turn's bookkeeping, run even while its task is being cancelled."""
        self._speaker = None
        if run.speaker is not None:
            await run.speaker.aclose()
        await run.streamer.discard()
        counted = await self.quota.take_counted() if self.quota is not None else None
        audio = audio_usage(voice, run.speaker)
        if audio is not None:
            metrics.voice("heard", audio["audio_heard_ms"] / 1000)
            metrics.voice("spoken", audio["audio_spoken_ms"] / 1000)
        await self._checkpoint(usage=run.usage, audio=audio, counted=counted,
                               figures=run.figures(self.turn, self.config))

    async def _store_said(self, run: _Run, *, interrupted: bool) -> None:
        """After a barge-in or the page's leaving: the answer as far as the user
        got it (spoken: as far as its audio went out; typed: as far as its
        text did), stored as the assistant's message (the part not stored
        with a tool round)."""
        said = _shown(run)[run.round_start:].strip()
        if said and self.conversation.awaits_answer():
            self._append("assistant", [{"type": "text", "text": said}], interrupted=interrupted)

    def _page_blocks(self) -> list[dict]:
        return self.conversation.page_blocks(self.io.page())

    def _build_request(self, *, force_answer: bool) -> LlmRequest:
        return build_request(config=self.config, system_prompt=self.system_prompt, history=self.conversation.history,
                             tools=self._tool_params(self.io.surface()), force_answer=force_answer)

    def _append(self, role: str, content: list[dict], *, interrupted: bool = False) -> None:
        self.conversation.append(role, content, speaker=self._speaker, interrupted=interrupted)

    async def _checkpoint(self, *, calls: list[PendingCall] = (), usage: Usage | None = None,
                          audio: dict[str, int] | None = None, counted: Usage | None = None,
                          figures: dict | None = None) -> None:
        """Write what the turn produced since the last checkpoint. Messages stay
        buffered until the write returns, so a checkpoint cut short by a
        cancellation is simply written again (it is idempotent)."""
        messages = list(self.conversation.unsaved)
        await self.store.checkpoint(
            turn=self.turn, messages=messages, calls=calls, usage=usage, turns=1 if usage else 0,
            audio=audio, counted=counted, figures=figures,
        )
        self.conversation.written(messages)

    async def _append_results(self, tool_uses: list[dict], outcomes: list[Outcome]) -> None:
        blocks = [o.tool_result_block(b["id"]) for b, o in zip(tool_uses, outcomes, strict=True)]
        self._append("user", [*blocks, *self._page_blocks()])

    async def human_said(self, block: dict) -> None:
        """A block of the time an operator is in charge of the chat
        (``agent.conversation.human_block``): stored now, and part of what
        the model is sent once the chat is handed back."""
        self._append("user", [block])
        await self._checkpoint()

    async def operator_call(self, call_id: str, name: str, args: dict) -> Outcome:
        """A page tool the operator in charge of the chat runs from the admin
        (``PageTools.run_for_operator``), in the session's ledger: its row is
        written first, marked as the operator's, and ends with its outcome
        whatever happens (the page leaving cuts it)."""
        call = PendingCall(call_id=call_id, tool_use_id=OPERATOR_CALL + call_id, name=name, args=args,
                           spec=self.io.surface().get(name))
        await self._checkpoint(calls=[call])
        outcome = Outcome(DISCONNECTED, error=LEFT_MESSAGE)
        try:
            outcome = await self.page_tools.run_for_operator(call)
        finally:
            call.finish(outcome)
            await self.store.finish_call(call, outcome)
            await asyncio.shield(self._checkpoint())
        return outcome

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
            self._append("assistant", content)
            await self._checkpoint(calls=calls)
            for index, call in enumerate(calls):
                call.began = time.monotonic()
                with tracing.span("tool_call", tool=call.name, origin=_origin(call)) as traced:
                    outcomes[index] = (skip or (refused[index] if refused else None)
                                       or await self._run_one(call))
                    traced.set(status=outcomes[index].status)
                call.finish(outcomes[index])
                _measured(self.parts.clock, call, outcomes[index])
                await self.store.finish_call(call, outcomes[index])
        except BaseException as exc:
            # Cancelled (disconnect, barge-in) or a bug: the calls not yet
            # answered still each get their one result, so the conversation
            # stays valid for the next turn -- written to the end even when
            # a second cancel comes meanwhile (a barge-in, then the page
            # leaving).
            if isinstance(exc, asyncio.CancelledError):
                status = _cut_status(exc)
                error = _cancel_message(status)
            else:
                status, error = ERROR, "The server failed while running this tool."
            cut_again = await _to_the_end(
                self._settle_cut_round(calls, tool_uses, outcomes, status, error))
            if cut_again and not isinstance(exc, asyncio.CancelledError):
                raise asyncio.CancelledError() from exc
            raise
        await self._append_results(tool_uses, outcomes)  # type: ignore[arg-type]

    async def _settle_cut_round(self, calls: list[PendingCall], tool_uses: list[dict],
                                outcomes: list[Outcome | None], status: str, error: str) -> None:
        """The end of a tool round cut short: rows, results and the conversation written now."""
        await self._checkpoint(calls=calls)  # idempotent: it may or may not have landed
        await _settle_cut_calls(self.parts, calls, outcomes, status, error)
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

async def _settle_cut_calls(parts: TurnParts, calls: list[PendingCall],
                            outcomes: list[Outcome | None], status: str, error: str) -> None:
    """Each call of a round cut short keeps the outcome it had (finished, or
    answered as the cut landed); the others end with ``status``; every
    call's end is kept for the turn's next checkpoint."""
    for index, call in enumerate(calls):
        if outcomes[index] is not None:
            continue  # finished before the cut: its real outcome stands
        if call.future.done():
            # Answered (the page's result, the server tool's run) when the
            # cut landed, before the turn read it: the answer stands, in
            # the row and for the model.
            outcomes[index] = call.future.result()
            _measured(parts.clock, call, outcomes[index])
            await parts.store.finish_call(call, outcomes[index])
            continue
        outcomes[index] = Outcome(status, error=error)
        call.resolve(outcomes[index])
        _measured(parts.clock, call, outcomes[index])
        if call.approval_id is not None:
            # The call's end with its approval's event, in one transaction.
            try:
                await parts.store.approval_close(call, status, outcomes[index])
            except Exception:
                logger.exception("session %s: the end of call %s could not be written with "
                                 "its approval", parts.session_id, call.call_id)
        await parts.store.finish_call(call, outcomes[index])


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


async def _failed(io: TurnIO, run: _Run, code: str, message: str) -> p.Message:
    """The turn failed: the page gets the error, then an empty done."""
    run.error_code = code
    await run.streamer.discard()
    await io.send(p.error_event(code, message))
    if run.speaker is not None:
        await run.speaker.aclose()
        await io.send(p.voice_state("turn_complete"))
    return p.agent_response("", True)


def _shown(run: _Run) -> str:
    """The answer as far as the user got it: spoken, as far as its audio
    went out; typed, as far as its text did."""
    text = "".join(run.full_text)
    return run.speaker.spoken_text(text) if run.speaker is not None else text[:run.streamer.sent_chars]


def _cut_status(cut: asyncio.CancelledError) -> str:
    """What the calls of a cut turn end with: the connection cancels the
    turn's task with it (``aitp.turn.TurnMachine.cut``)."""
    return DISCONNECTED if cut.args and cut.args[0] == DISCONNECTED else CANCELLED


@dataclass
class _Run:
    """What one turn has produced so far."""

    streamer: TextStreamer
    clock: TurnClock
    usage: Usage = field(default_factory=Usage)
    full_text: list[str] = field(default_factory=list)
    speaker: Speaker | None = None
    # Where the text of the round not yet stored starts in the full text.
    round_start: int = 0
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    # How it ended: answered, failed, refused (the token quota), or cut; and
    # the code it failed with.
    outcome: str = "cut"
    error_code: str = ""
    # The turn's trace (runtime.tracing): "" with traces off.
    trace_id: str = field(default_factory=tracing.current_trace_id)

    def figures(self, number: int, config: AgentConfig) -> dict:
        """The turn's record (``TurnRecord``): its times, tokens and cost."""
        clock, first_text = self.clock, self.streamer.first_text_at
        price = price_of(config.prices, config.model)
        return {
            "number": number, "started_at": self.started_at, "outcome": self.outcome,
            "error_code": self.error_code,
            "first_text_ms": None if first_text is None else _ms(first_text - clock.started),
            "model_ms": _ms(clock.model), "approval_ms": _ms(clock.approval),
            "tools_ms": _ms(max(0.0, clock.tools - clock.approval)),
            "cost_micros": None if price is None else cost_micros(price, self.usage),
            "model": config.model[:128], "trace_id": self.trace_id,
        }

    def measured(self) -> None:
        tracing.annotate(outcome=self.outcome)
        first_text, started = self.streamer.first_text_at, self.clock.started
        metrics.turn_ended(self.outcome, time.monotonic() - started,
                           None if first_text is None else first_text - started)
        metrics.llm_used(input_tokens=self.usage.input_tokens, output_tokens=self.usage.output_tokens,
                         cache_read_tokens=self.usage.cache_read_tokens,
                         cache_write_tokens=self.usage.cache_write_tokens)


def _measured(clock: TurnClock, call: PendingCall, outcome: Outcome) -> None:
    took = time.monotonic() - call.began
    clock.tools += took
    metrics.tool_call("server" if call.origin == "server" else "page", outcome.status, took)


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))


def _origin(call: PendingCall) -> str:
    return "server" if call.origin == "server" else "page"


def _cancel_message(status: str) -> str:
    return LEFT_MESSAGE if status == "disconnected" else CANCELLED_MESSAGE


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
