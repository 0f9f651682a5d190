"""Where a connection's turn is, as one state machine, sans I/O.

A connection has at most one turn at a time: typed (USER_INPUT text), heard
whole (USER_INPUT audio) or heard live (the microphone's utterance). Its
phases, the events that move it and ``TRANSITIONS`` below are the one table
of what may happen in which phase::

    idle --typed--> answering <--> waiting_tool / waiting_approval
      |                 |  ^                 |
      +--audio/utterance--> listening --heard-+      answering --speaking--> speaking
      |                 |
      |   barge-in / page left: cut (the task is cancelled) --done--> idle
      +<------------------------------ done / refused --------------------+

Each move returns what the connection does about it (``Do``): start the
turn, record its state for the session row, stop the agent's voice, cancel
the turn's task, send the page ``interrupted`` or the turn's done frame. A
microphone utterance that opens while a turn runs waits, and starts the
next turn the moment this one is done; a barge-in over a running answer is
answered once the cut turn is over, so that the page's next message is a
new turn.

When an event is not allowed, who is at fault decides the error, as in
``aitp.calls``: the page starting a turn while one runs gets
``PageMistake`` (an error frame with its code, the connection goes on); the
server making a move the table refuses is ``ServerMistake`` -- our bug.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from aitp.turn_state import TurnState


class TurnPhase(enum.Enum):
    IDLE = "idle"
    LISTENING = "listening"  # a voice turn waits for its utterance to end
    ANSWERING = "answering"  # the model writes (a typed turn starts here)
    WAITING_TOOL = "waiting_tool"  # a TOOL_CALL is out on the page
    WAITING_APPROVAL = "waiting_approval"  # a person decides
    SPEAKING = "speaking"  # the answer is written; its voice still goes out
    CUT = "cut"  # cancelled (barge-in, page gone): the task is ending

    @property
    def stored(self) -> TurnState:
        """What the session row and its watchers see."""
        return _STORED[self]


_STORED = {
    TurnPhase.IDLE: TurnState.IDLE,
    TurnPhase.LISTENING: TurnState.ANSWERING,
    TurnPhase.ANSWERING: TurnState.ANSWERING,
    TurnPhase.WAITING_TOOL: TurnState.WAITING_TOOL,
    TurnPhase.WAITING_APPROVAL: TurnState.WAITING_APPROVAL,
    TurnPhase.SPEAKING: TurnState.ANSWERING,
    TurnPhase.CUT: TurnState.ANSWERING,
}


class Party(enum.Enum):
    PAGE = "page"
    SERVER = "server"


class TurnEvent(enum.Enum):
    # From the page, through the connection.
    TYPED = "typed"  # USER_INPUT text, checked
    AUDIO_MESSAGE = "audio_message"  # USER_INPUT audio, checked
    UTTERANCE_STARTED = "utterance_started"  # the microphone opened a new utterance
    BARGE_IN = "barge_in"  # VOICE_INTERRUPT
    LEFT = "left"  # the page is gone (closed, ended, the server stopping)
    TAKEN_OVER = "taken_over"  # an operator takes the chat over (operators.handover)
    REFUSED = "refused"  # the input limits refused the turn before it ran
    # From the turn itself (the agent's reports, through its ``send``).
    STARTED = "started"
    HEARD = "heard"  # the utterance the turn listened to is over
    ANSWERING = "answering"  # the model writes again (after a tool, an approval)
    TOOL_DISPATCHED = "tool_dispatched"
    APPROVAL_ASKED = "approval_asked"
    SPEAKING = "speaking"  # the answer is written; the voice finishes saying it
    DONE = "done"  # the turn is over, whatever happened to it


class Do(enum.Enum):
    ADMIT = "admit"  # check the input limits, then run the turn
    RUN_UTTERANCE = "run_utterance"  # run a turn on the microphone's utterance (limits checked in it)
    RECORD = "record"  # the row's state is now ``phase.stored``
    ASK_VOICE_INPUT = "ask_voice_input"  # a voice turn waits for the user: waiting_for_input
    STOP_VOICE = "stop_voice"  # the agent's voice stops now, before the cancel lands
    CANCEL = "cancel"  # the turn's task is cancelled; its calls end with ``cut``
    SAY_INTERRUPTED = "say_interrupted"  # VOICE_STATE_EVENT interrupted, now
    END = "end"  # the turn's done frame, after ``interrupted`` if one waits


P = TurnPhase
E = TurnEvent
_RUNNING = frozenset({P.LISTENING, P.ANSWERING, P.WAITING_TOOL, P.WAITING_APPROVAL, P.SPEAKING})
_WRITING = frozenset({P.ANSWERING, P.WAITING_TOOL, P.WAITING_APPROVAL, P.SPEAKING})
_BUSY = _RUNNING | {P.CUT}
_ANY = _BUSY | {P.IDLE}

# What pending calls become when the turn is cut (their ``CallStatus``).
CANCELLED = "cancelled"
DISCONNECTED = "disconnected"
# A turn cut by an operator taking the chat over: its calls end cancelled,
# and the page is sent what it was shown of the answer, with done.
TAKEN_OVER = "taken_over"

Rule = tuple[TurnPhase | None, tuple[Do, ...]]  # None: the phase stays

# event -> {phase it may happen in: (the phase it leads to, what to do)}. The one table.
TRANSITIONS: dict[TurnEvent, dict[TurnPhase, Rule]] = {
    E.TYPED: {P.IDLE: (P.ANSWERING, (Do.ADMIT,))},
    E.AUDIO_MESSAGE: {P.IDLE: (P.LISTENING, (Do.ADMIT,))},
    # Busy: the utterance waits for this turn's end (``waiting``).
    E.UTTERANCE_STARTED: {P.IDLE: (P.LISTENING, (Do.RUN_UTTERANCE,)),
                          **dict.fromkeys(_BUSY, (None, ()))},
    E.REFUSED: {P.ANSWERING: (P.IDLE, (Do.END,)), P.LISTENING: (P.IDLE, (Do.END,))},
    E.STARTED: {P.LISTENING: (None, (Do.RECORD,)), P.ANSWERING: (None, (Do.RECORD,))},
    E.HEARD: {P.LISTENING: (P.ANSWERING, ())},
    E.ANSWERING: dict.fromkeys(_WRITING, (P.ANSWERING, (Do.RECORD,))),
    E.TOOL_DISPATCHED: dict.fromkeys(_WRITING, (P.WAITING_TOOL, (Do.RECORD,))),
    E.APPROVAL_ASKED: dict.fromkeys(_WRITING, (P.WAITING_APPROVAL, (Do.RECORD,))),
    E.SPEAKING: {P.ANSWERING: (P.SPEAKING, ())},
    # Still listening, the user only spoke on: answered now, the turn goes on.
    E.BARGE_IN: {P.IDLE: (None, (Do.SAY_INTERRUPTED,)),
                 P.LISTENING: (None, (Do.SAY_INTERRUPTED,)),
                 **dict.fromkeys(_WRITING | {P.CUT}, (P.CUT, (Do.STOP_VOICE, Do.CANCEL)))},
    E.LEFT: {P.IDLE: (None, ()), **dict.fromkeys(_BUSY, (P.CUT, (Do.CANCEL,)))},
    E.TAKEN_OVER: {P.IDLE: (None, ()), P.CUT: (None, ()),
                   **dict.fromkeys(_RUNNING, (P.CUT, (Do.STOP_VOICE, Do.CANCEL)))},
    E.DONE: dict.fromkeys(_BUSY, (P.IDLE, (Do.RECORD, Do.END))),
}

# Events the page causes (through its frames); the rest are the server's.
BY_PAGE = frozenset({E.TYPED, E.AUDIO_MESSAGE})
# A cut turn still finishes what it was doing: its reports change nothing.
_REPORTS = frozenset({E.STARTED, E.HEARD, E.ANSWERING, E.TOOL_DISPATCHED, E.APPROVAL_ASKED,
                      E.SPEAKING})


class TurnError(Exception):
    """An event the table does not allow in the turn's phase."""

    def __init__(self, phase: TurnPhase, event: TurnEvent, by: Party) -> None:
        self.phase, self.event, self.by = phase, event, by
        super().__init__(f"{event.value} is not allowed while {phase.value} (by {by.value})")


class PageMistake(TurnError):
    """The page's fault: it started a turn while one runs. Answered with
    ``code``; the connection goes on."""

    code = "turn_in_progress"
    message = "the agent is still answering; wait for it to finish"


class ServerMistake(TurnError):
    """Our fault: the server made a move the table refuses. A bug."""


@dataclass(frozen=True)
class Move:
    phase: TurnPhase
    do: tuple[Do, ...]
    # With ``Do.RECORD``: the state the session row now shows.
    stored: TurnState = TurnState.IDLE
    # With ``Do.END``: the reason of a barge-in answered once the turn is over.
    interrupted: str | None = None


@dataclass
class TurnMachine:
    """One connection's turn. ``step()`` is the only way it changes."""

    phase: TurnPhase = TurnPhase.IDLE
    # The running turn hears the user (and speaks): a voice turn.
    voice: bool = False
    # A microphone utterance no turn has taken yet starts the next one.
    waiting: bool = False
    # What the running turn's pending calls end with if it is cut.
    cut: str = CANCELLED
    # A barge-in's reason, answered when the cut turn is over.
    interrupted: str | None = field(default=None)

    @property
    def busy(self) -> bool:
        return self.phase is not TurnPhase.IDLE

    def allowed(self, event: TurnEvent) -> bool:
        return self.phase in TRANSITIONS[event]

    def step(self, event: TurnEvent, *, reason: str = "") -> Move:
        """Move on ``event``; what the connection does about it comes back.
        Raises ``PageMistake`` or ``ServerMistake`` when the table refuses."""
        rules = TRANSITIONS[event]
        if self.phase not in rules:
            if self.phase is TurnPhase.CUT and event in _REPORTS:
                return Move(self.phase, (), self.phase.stored)
            by = Party.PAGE if event in BY_PAGE else Party.SERVER
            raise (PageMistake if by is Party.PAGE else ServerMistake)(self.phase, event, by)
        target, do = rules[self.phase]
        before, self.phase = self.phase, target or self.phase
        stored, interrupted = self.phase.stored, None
        if self.phase is not before and before is TurnPhase.IDLE:
            self._begin(voice=event is not E.TYPED)
        if event is E.UTTERANCE_STARTED and before is not TurnPhase.IDLE:
            self.waiting = True
        elif event is E.BARGE_IN and Do.CANCEL in do:
            self.interrupted = reason or "barge_in"
        elif event is E.LEFT:
            # Nothing waits for a page that is gone.
            self.cut, self.waiting = (DISCONNECTED if Do.CANCEL in do else self.cut), False
        elif event is E.TAKEN_OVER:
            # The operator answers from now on: no utterance waits for the model.
            self.cut, self.waiting = (TAKEN_OVER if Do.CANCEL in do else self.cut), False
        elif event is E.APPROVAL_ASKED and self.voice:
            do = (*do, Do.ASK_VOICE_INPUT)
        elif event in (E.DONE, E.REFUSED):
            interrupted, self.interrupted, self.voice = self.interrupted, None, False
            if self.waiting:
                # The utterance that waited starts the next turn.
                self.phase = TurnPhase.LISTENING
                self._begin(voice=True)
                do = (*do, Do.RUN_UTTERANCE)
        return Move(self.phase, do, stored, interrupted)

    def _begin(self, *, voice: bool) -> None:
        self.voice, self.waiting, self.cut, self.interrupted = voice, False, CANCELLED, None
