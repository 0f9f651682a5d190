"""The owner of a connection's turn: the one task that runs it, the
microphone's utterance, and the agent's way back (``send``).

Where the turn is lives in the session machine's ``aitp.turn.TurnMachine``;
``TurnOwner`` steps it on the page's input and on the agent's reports, and
carries out each move (``Do``): start the turn, record its state for the
session row, stop the agent's voice, cancel the task, answer ``interrupted``
or end the turn with its done frame. Every turn, typed or heard, starts in
``_admitted``: the page's input limits and token quota first.

Voice (when HANDSHAKE_ACK offered "audio"): microphone chunks are counted
against the connection's audio budget and gathered in a ``Listening``; the
first chunk of an utterance starts a voice turn, or the next one when a turn
runs. VOICE_INTERRUPT stops the agent's voice at once, cancels the turn and
answers ``interrupted`` once it is over.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from agent.conversation import HANDED_BACK, OPERATOR, OPERATOR_TOOL, TO_OPERATOR, human_block
from agent.conversation import TAKEN_OVER as TOOK_OVER
from agent.loop import Agent, PageSnapshot, TurnOver
from agent.voice import Listening
from aitp import protocol as p
from aitp.limits import ConnectionLimits
from aitp.row_writer import SessionRowWriter
from aitp.session import (
    ApprovalRequestReceived,
    ApprovalResponseReceived,
    AudioChunkReceived,
    SessionMachine,
    ToolResultReceived,
    UserAudioReceived,
    UserTextReceived,
    VoiceInputEnded,
    VoiceInterrupted,
)
from aitp.tools import ToolSurface
from aitp.transcript import OPERATOR_JOINED, OPERATOR_LEFT
from aitp.turn import TAKEN_OVER, Do, Move, TurnEvent
from runtime import metrics
from runtime.config import config
from speech.utterance import AudioBudget

logger = logging.getLogger(__name__)

OPERATOR_READS_TEXT = "operator_reads_text"
OPERATOR_READS_TEXT_MESSAGE = "A person is answering this chat now and reads typed messages only."


class Waiting(Protocol):
    """A wait for an operator the agent asked for (``connection.handoff``)."""

    def stop(self) -> None: ...


class TurnOwner:
    def __init__(self, machine: SessionMachine, *, rate_limits: ConnectionLimits,
                 row_writer: SessionRowWriter, flush: Callable[[], Awaitable[None]],
                 own: Callable[[asyncio.Task, str], asyncio.Task]) -> None:
        self.machine = machine
        self.rate_limits = rate_limits
        self.row_writer = row_writer
        self._flush = flush
        self._own = own
        self.agent: Agent | None = None
        self.tenant_id: int | None = None
        # Whose speech allowance the turn's speech jobs count against (the API key).
        self.owner: int | None = None
        self.task: asyncio.Task | None = None
        # The utterance the microphone is filling (None before the first).
        self.listening: Listening | None = None
        self.audio_budget: AudioBudget | None = None
        # The operator in charge of the chat (operators.handover): None while the agent answers.
        self.operator: str | None = None
        # The writes of an operator's time in charge, one at a time, in order.
        self._human_writes = asyncio.Lock()
        # The agent's way to ask for a person, when the key offers it (connection.handoff).
        self.handoff: Waiting | None = None
        # The page tools the operator in charge is running (``operator_tool``).
        self._operator_calls: set[asyncio.Task] = set()

    def open(self, agent: Agent, *, tenant_id: int, owner: int, audio_budget: AudioBudget | None,
             operator: str | None = None) -> None:
        """The session is open: its agent runs the turns from now on, or
        ``operator`` answers (a continued session an operator is in charge of)."""
        self.agent, self.tenant_id, self.owner, self.audio_budget = agent, tenant_id, owner, audio_budget
        self.operator = operator

    async def handle(self, event: Any) -> None:
        await _HANDLERS[type(event)](self, event)

    async def left(self) -> None:
        """The page is gone: a running turn is cut (its calls end
        'disconnected') and awaited to its end."""
        self._turn(TurnEvent.LEFT)
        if self.handoff is not None:
            self.handoff.stop()
            self.handoff = None
        for call in list(self._operator_calls):
            call.cancel()  # each ends 'disconnected' in its row
        task = self.task
        if task is not None and not task.done():
            with contextlib.suppress(asyncio.CancelledError):
                await task
        # The agent reaches back here (its ``send``), and this owner to the
        # runner (its ``flush``): the links are dropped, so that all they
        # held is freed by reference counting.
        self.agent = None
        self._flush = _nothing

    # --- the page's input ------------------------------------------------------------

    async def _user_input(self, event: UserTextReceived | UserAudioReceived) -> None:
        if isinstance(event, UserTextReceived):
            self._start(self._admitted(event.text))
        else:
            self._start(self._admitted(voice=Listening(audio=event.audio, owner=self.owner)))

    async def _audio_chunk(self, event: AudioChunkReceived) -> None:
        pcm = event.pcm
        if not self.audio_budget.take(len(pcm), asyncio.get_running_loop().time()):
            self.machine.error("audio_too_fast",
                               "Audio is arriving faster than this server accepts; the chunk was dropped.")
            self.rate_limits.audio_refused(self.machine)
            return
        if self.listening is not None and not self.listening.over:
            self.listening.add(pcm)
            return
        self.listening = Listening(config().voice.limits, owner=self.owner)
        self.listening.add(pcm)
        self._turn(TurnEvent.UTTERANCE_STARTED)

    async def _voice_input_ended(self, event: VoiceInputEnded) -> None:
        if self.listening is not None:
            self.listening.end(event.reason)

    async def _voice_interrupted(self, event: VoiceInterrupted) -> None:
        self._turn(TurnEvent.BARGE_IN, reason=event.reason)

    async def _tool_result(self, event: ToolResultReceived) -> None:
        self._reply(await self.agent.on_tool_result(event.result))

    async def _approval_request(self, event: ApprovalRequestReceived) -> None:
        self._reply(await self.agent.on_approval_request(event.request))

    async def _approval_response(self, event: ApprovalResponseReceived) -> None:
        self._reply(await self.agent.on_approval_response(event.response))

    def _reply(self, reply: p.Message | None) -> None:
        if reply is not None:
            self.machine.send(reply)

    # --- the turn ------------------------------------------------------------------

    def _start(self, turn: Coroutine[Any, Any, None]) -> None:
        self.task = self._own(asyncio.create_task(turn), "turn")

    async def _admitted(self, text: str = "", *, voice: Listening | None = None, live: bool = False) -> None:
        """Every turn starts here, typed or heard: the page's input limits and
        token quota first; a refused one gets its error, then done. While
        an operator is in charge, no turn runs: the words are the operator's."""
        if self.operator is not None:
            await self._to_operator(text, voice=voice, live=live)
            return
        try:
            allowed = await self.rate_limits.allow_user_input(self.machine, tenant_id=self.tenant_id)
        except asyncio.CancelledError:
            self._turn(TurnEvent.DONE)  # cut before it ran: over all the same
            raise
        if allowed:
            await self.agent.run_turn(text, voice=voice)
            return
        metrics.turn_ended("refused")
        if live:
            self.machine.send(p.voice_state("turn_complete"))
        self._turn(TurnEvent.REFUSED, done=p.agent_response("", True))
        await self._flush()

    def _turn(self, event: TurnEvent, *, reason: str = "", done: p.Message | None = None) -> None:
        """Step the turn machine and carry out its move."""
        move = self.machine.turn.step(event, reason=reason)
        for do in move.do:
            _CARRY_OUT[do](self, move, reason, done)

    def _record(self, move: Move, reason: str, done: p.Message | None) -> None:
        self.row_writer.state_changed(move.stored)

    def _ask_voice_input(self, move: Move, reason: str, done: p.Message | None) -> None:
        self.machine.send(p.voice_state("waiting_for_input"))

    def _stop_voice(self, move: Move, reason: str, done: p.Message | None) -> None:
        self.agent.interrupt()

    def _cancel(self, move: Move, reason: str, done: p.Message | None) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel(self.machine.turn.cut)

    def _say_interrupted(self, move: Move, reason: str, done: p.Message | None) -> None:
        self.machine.send(p.voice_state("interrupted", reason=reason or "barge_in"))

    def _end(self, move: Move, reason: str, done: p.Message | None) -> None:
        """The one place a turn ends, run or refused. The page may send its
        next message as soon as it reads the done frame (protocol.md §5): the
        turn is over before the frame is queued."""
        if move.interrupted is not None:
            # Answered now that the cut turn is over: the page's next message is a new turn.
            self.machine.send(p.voice_state("interrupted", reason=move.interrupted))
        if done is None and self.machine.turn.cut == TAKEN_OVER:
            done = p.agent_response("", True)  # cut before it said anything: the page still waits
        if done is not None:
            self.machine.send(done)

    def _run_utterance(self, move: Move, reason: str, done: p.Message | None) -> None:
        self._start(self._admitted(voice=self.listening, live=True))

    # --- an operator in charge of the chat ---------------------------------------

    async def take_over(self, operator: str) -> None:
        """``operator`` answers from now on: a running turn is cut (its
        calls end cancelled, the page gets its done with what it was shown)
        and over before the page user is told who answers."""
        if self.operator == operator:
            return
        self.operator = operator
        if self.handoff is not None:
            self.handoff.stop()  # the person asked for is here
        self._turn(TurnEvent.TAKEN_OVER)
        task = self.task
        if task is not None and not task.done():
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.human(human_block(TOOK_OVER, operator=operator))
        self.machine.send(p.agent_response(OPERATOR_JOINED.format(operator=operator), True))
        await self._flush()

    async def operator_says(self, operator: str, text: str) -> None:
        """The operator's words, to the page as the agent's: a whole answer, done."""
        if self.operator is None:
            return  # handed back meanwhile: the agent answers
        await self.human(human_block(OPERATOR, text, operator=operator))
        self.machine.send(p.agent_response(text, True, operator=operator))
        await self._flush()

    async def hand_back(self, operator: str, note: str) -> None:
        """The agent answers the next message, told what was said meanwhile and ``note``."""
        if self.operator is None:
            return
        self.operator = None
        await self.human(human_block(HANDED_BACK, note, operator=operator))
        self.machine.send(p.agent_response(OPERATOR_LEFT.format(operator=operator), True))
        await self._flush()

    def operator_tool(self, operator: str, call_id: str, name: str, args: dict) -> None:
        """Run a page tool for the operator in charge (``Agent.operator_call``),
        beside the conversation: the operator goes on writing meanwhile. The
        model is told of it at the hand back, when it ended before then."""
        if self.operator is None:
            return
        task = self._own(asyncio.create_task(self._operator_tool(operator, call_id, name, args)), "operator tool")
        self._operator_calls.add(task)
        task.add_done_callback(self._operator_calls.discard)

    async def _operator_tool(self, operator: str, call_id: str, name: str, args: dict) -> None:
        outcome = await self.agent.operator_call(call_id, name, args)
        told = f"{name} {json.dumps(args, ensure_ascii=False)[:500]}: {outcome.content_for_model()[:1000]}"
        await self.human(human_block(OPERATOR_TOOL, told, operator=operator), while_in_charge=True)

    async def _to_operator(self, text: str, *, voice: Listening | None, live: bool) -> None:
        """The page user's message while an operator is in charge: typed
        words are stored for the operator (the watchers see the frame), and
        the page's turn closes at once, so no page waits on a person."""
        try:
            if voice is None:
                await self.human(human_block(TO_OPERATOR, text))
            else:
                self.machine.error(OPERATOR_READS_TEXT, OPERATOR_READS_TEXT_MESSAGE)
        except asyncio.CancelledError:
            self._turn(TurnEvent.DONE)  # the page left meanwhile
            raise
        if live:
            self.machine.send(p.voice_state("turn_complete"))
        self._turn(TurnEvent.REFUSED, done=p.agent_response("", True))
        await self._flush()

    async def human(self, block: dict, *, while_in_charge: bool = False) -> None:
        """Store a block of the operator's time in charge, in order (with
        ``while_in_charge``, only if the chat is not handed back by then: the
        agent's turns write from then on). A write that fails is logged; the
        page and the operator go on (the operator's own words are in their
        recorded action as well)."""
        async with self._human_writes:
            if while_in_charge and self.operator is None:
                return
            try:
                await self.agent.human_said(block)
            except Exception:
                logger.exception("session %s: a message of the operator's time in charge was not stored",
                                 self.machine.session_id)

    # --- the agent's way back (agent.parts.TurnIO) --------------------------

    async def send(self, item: p.Message | TurnEvent | TurnOver) -> None:
        if isinstance(item, p.Message):
            self.machine.send(item)
        elif isinstance(item, TurnOver):
            self._turn(TurnEvent.DONE, done=item.done)
        else:
            self._turn(item)
        await self._flush()

    def surface(self) -> ToolSurface:
        return self.machine.surface

    def page(self) -> PageSnapshot:
        machine = self.machine
        return PageSnapshot(machine.url, machine.title, machine.context)


async def _nothing() -> None:
    """The flush of a connection that is over."""


_HANDLERS: dict[type, Callable[[TurnOwner, Any], Awaitable[None]]] = {
    UserTextReceived: TurnOwner._user_input,
    UserAudioReceived: TurnOwner._user_input,
    AudioChunkReceived: TurnOwner._audio_chunk,
    VoiceInputEnded: TurnOwner._voice_input_ended,
    VoiceInterrupted: TurnOwner._voice_interrupted,
    ToolResultReceived: TurnOwner._tool_result,
    ApprovalRequestReceived: TurnOwner._approval_request,
    ApprovalResponseReceived: TurnOwner._approval_response,
}

# How each thing a turn's move asks for is carried out (Do.ADMIT is
# ``_admitted``, which every turn starts with).
_CARRY_OUT: dict[Do, Callable[[TurnOwner, Move, str, p.Message | None], None]] = {
    Do.ADMIT: lambda owner, move, reason, done: None,
    Do.RUN_UTTERANCE: TurnOwner._run_utterance,
    Do.RECORD: TurnOwner._record,
    Do.ASK_VOICE_INPUT: TurnOwner._ask_voice_input,
    Do.STOP_VOICE: TurnOwner._stop_voice,
    Do.CANCEL: TurnOwner._cancel,
    Do.SAY_INTERRUPTED: TurnOwner._say_interrupted,
    Do.END: TurnOwner._end,
}
