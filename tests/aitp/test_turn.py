"""The turn machine: every move of the table, written out by hand, and the
moves it refuses, by whose fault. Pure: no Django, no event loop."""
from __future__ import annotations

import itertools

import pytest

from aitp.turn import (
    CANCELLED,
    DISCONNECTED,
    TAKEN_OVER,
    TRANSITIONS,
    Do,
    Move,
    PageMistake,
    ServerMistake,
    TurnEvent,
    TurnMachine,
    TurnPhase,
)
from aitp.turn_state import TurnState

P = TurnPhase
E = TurnEvent
WRITING = [P.ANSWERING, P.WAITING_TOOL, P.WAITING_APPROVAL, P.SPEAKING]
BUSY = [P.LISTENING, *WRITING, P.CUT]

# (phase, event) -> (phase after, what to do), for a typed turn with nothing waiting.
EXPECTED = {
    (P.IDLE, E.TYPED): (P.ANSWERING, (Do.ADMIT,)),
    (P.IDLE, E.AUDIO_MESSAGE): (P.LISTENING, (Do.ADMIT,)),
    (P.IDLE, E.UTTERANCE_STARTED): (P.LISTENING, (Do.RUN_UTTERANCE,)),
    **{(phase, E.UTTERANCE_STARTED): (phase, ()) for phase in BUSY},
    (P.ANSWERING, E.REFUSED): (P.IDLE, (Do.END,)),
    (P.LISTENING, E.REFUSED): (P.IDLE, (Do.END,)),
    (P.LISTENING, E.STARTED): (P.LISTENING, (Do.RECORD,)),
    (P.ANSWERING, E.STARTED): (P.ANSWERING, (Do.RECORD,)),
    (P.LISTENING, E.HEARD): (P.ANSWERING, ()),
    **{(phase, E.ANSWERING): (P.ANSWERING, (Do.RECORD,)) for phase in WRITING},
    **{(phase, E.TOOL_DISPATCHED): (P.WAITING_TOOL, (Do.RECORD,)) for phase in WRITING},
    **{(phase, E.APPROVAL_ASKED): (P.WAITING_APPROVAL, (Do.RECORD,)) for phase in WRITING},
    (P.ANSWERING, E.SPEAKING): (P.SPEAKING, ()),
    (P.IDLE, E.BARGE_IN): (P.IDLE, (Do.SAY_INTERRUPTED,)),
    (P.LISTENING, E.BARGE_IN): (P.LISTENING, (Do.SAY_INTERRUPTED,)),
    **{(phase, E.BARGE_IN): (P.CUT, (Do.STOP_VOICE, Do.CANCEL)) for phase in [*WRITING, P.CUT]},
    (P.IDLE, E.LEFT): (P.IDLE, ()),
    **{(phase, E.LEFT): (P.CUT, (Do.CANCEL,)) for phase in BUSY},
    (P.IDLE, E.TAKEN_OVER): (P.IDLE, ()),
    (P.CUT, E.TAKEN_OVER): (P.CUT, ()),
    **{(phase, E.TAKEN_OVER): (P.CUT, (Do.STOP_VOICE, Do.CANCEL)) for phase in [P.LISTENING, *WRITING]},
    **{(phase, E.DONE): (P.IDLE, (Do.RECORD, Do.END)) for phase in BUSY},
}
# A cut turn finishes what it was doing: its reports are taken, and change nothing.
REPORTS = [E.STARTED, E.HEARD, E.ANSWERING, E.TOOL_DISPATCHED, E.APPROVAL_ASKED, E.SPEAKING]


def at(phase: TurnPhase) -> TurnMachine:
    return TurnMachine(phase=phase)


@pytest.mark.parametrize(("phase", "event"), sorted(EXPECTED, key=lambda k: (k[0].value, k[1].value)))
def test_every_allowed_move_leads_where_the_table_says_and_says_what_to_do(phase, event):
    machine = at(phase)
    move = machine.step(event)
    assert (move.phase, move.do) == EXPECTED[phase, event]
    assert machine.phase is move.phase


REFUSED = [(phase, event) for phase, event in itertools.product(TurnPhase, TurnEvent)
           if (phase, event) not in EXPECTED and not (phase is P.CUT and event in REPORTS)]


@pytest.mark.parametrize(("phase", "event"), REFUSED)
def test_every_other_move_is_refused_as_the_fault_of_whoever_made_it(phase, event):
    machine = at(phase)
    fault = PageMistake if event in (E.TYPED, E.AUDIO_MESSAGE) else ServerMistake
    with pytest.raises(fault):
        machine.step(event)
    assert machine.phase is phase


def test_the_table_holds_exactly_the_moves_written_out_here():
    table = {(phase, event) for event, rules in TRANSITIONS.items() for phase in rules}
    assert table == set(EXPECTED)


@pytest.mark.parametrize("event", REPORTS)
def test_a_cut_turn_reports_what_it_finishes_and_stays_cut(event):
    machine = at(P.CUT)
    assert machine.step(event) == Move(P.CUT, (), TurnState.ANSWERING)


def test_a_second_typed_input_while_a_turn_runs_is_the_pages_mistake_with_its_code():
    machine = TurnMachine()
    machine.step(E.TYPED)
    with pytest.raises(PageMistake) as refused:
        machine.step(E.TYPED)
    assert refused.value.code == "turn_in_progress"


@pytest.mark.parametrize(("phase", "stored"), [
    (P.IDLE, TurnState.IDLE), (P.LISTENING, TurnState.ANSWERING), (P.ANSWERING, TurnState.ANSWERING),
    (P.WAITING_TOOL, TurnState.WAITING_TOOL), (P.WAITING_APPROVAL, TurnState.WAITING_APPROVAL),
    (P.SPEAKING, TurnState.ANSWERING), (P.CUT, TurnState.ANSWERING),
])
def test_the_row_shows_each_phase_as_its_stored_state(phase, stored):
    assert phase.stored is stored


def test_a_typed_turn_records_each_state_the_agent_reports_and_ends_idle():
    machine = TurnMachine()
    assert machine.step(E.TYPED).do == (Do.ADMIT,)
    stored = [machine.step(event).stored for event in
              (E.STARTED, E.TOOL_DISPATCHED, E.ANSWERING, E.APPROVAL_ASKED, E.ANSWERING)]
    assert stored == ["answering", "waiting_tool", "answering", "waiting_approval", "answering"]
    done = machine.step(E.DONE)
    assert (done.phase, done.do, done.stored, done.interrupted) == (P.IDLE, (Do.RECORD, Do.END), "idle", None)
    assert not machine.busy


def test_a_voice_turn_waiting_for_approval_asks_the_user_by_voice_and_a_typed_one_does_not():
    voice = TurnMachine()
    voice.step(E.AUDIO_MESSAGE)
    voice.step(E.HEARD)
    assert voice.step(E.APPROVAL_ASKED).do == (Do.RECORD, Do.ASK_VOICE_INPUT)
    typed = TurnMachine()
    typed.step(E.TYPED)
    assert typed.step(E.APPROVAL_ASKED).do == (Do.RECORD,)


def test_an_utterance_opened_during_a_turn_starts_the_next_one_when_it_is_done():
    machine = TurnMachine()
    machine.step(E.TYPED)
    assert machine.step(E.UTTERANCE_STARTED).do == ()
    assert machine.waiting
    done = machine.step(E.DONE)
    assert (done.phase, done.do, done.stored) == (P.LISTENING, (Do.RECORD, Do.END, Do.RUN_UTTERANCE), "idle")
    assert machine.voice and not machine.waiting


def test_an_utterance_waiting_behind_a_refused_input_starts_after_its_done():
    machine = TurnMachine()
    machine.step(E.TYPED)
    machine.step(E.UTTERANCE_STARTED)
    assert machine.step(E.REFUSED).do == (Do.END, Do.RUN_UTTERANCE)
    assert machine.phase is P.LISTENING


def test_a_barge_in_over_an_answer_cuts_it_and_is_answered_with_the_done():
    machine = TurnMachine()
    machine.step(E.AUDIO_MESSAGE)
    machine.step(E.HEARD)
    cut = machine.step(E.BARGE_IN, reason="user_spoke")
    assert (cut.phase, cut.do, machine.cut) == (P.CUT, (Do.STOP_VOICE, Do.CANCEL), CANCELLED)
    done = machine.step(E.DONE)
    assert (done.do, done.interrupted) == ((Do.RECORD, Do.END), "user_spoke")
    assert machine.interrupted is None and not machine.voice


def test_a_barge_in_without_a_reason_is_answered_as_barge_in_and_the_last_one_counts():
    machine = TurnMachine()
    machine.step(E.TYPED)
    machine.step(E.BARGE_IN)
    machine.step(E.BARGE_IN, reason="again")
    assert machine.step(E.DONE).interrupted == "again"
    machine.step(E.TYPED)
    machine.step(E.BARGE_IN)
    assert machine.step(E.DONE).interrupted == "barge_in"


def test_a_barge_in_while_the_turn_still_listens_is_answered_now_and_cuts_nothing():
    machine = TurnMachine()
    machine.step(E.UTTERANCE_STARTED)
    assert machine.step(E.BARGE_IN, reason="x").do == (Do.SAY_INTERRUPTED,)
    assert machine.interrupted is None and machine.phase is P.LISTENING


def test_the_page_leaving_cuts_the_turn_as_disconnected_even_after_a_barge_in():
    machine = TurnMachine()
    machine.step(E.TYPED)
    machine.step(E.LEFT)
    assert machine.cut == DISCONNECTED
    other = TurnMachine()
    other.step(E.TYPED)
    other.step(E.BARGE_IN)
    other.step(E.LEFT)
    assert other.cut == DISCONNECTED
    other.step(E.BARGE_IN)
    assert other.cut == DISCONNECTED


def test_a_new_turn_starts_uncut_and_without_an_old_interruption():
    machine = TurnMachine()
    machine.step(E.TYPED)
    machine.step(E.LEFT)
    machine.step(E.DONE)
    machine.step(E.TYPED)
    assert (machine.cut, machine.interrupted, machine.voice) == (CANCELLED, None, False)


def test_the_page_leaving_an_idle_connection_changes_nothing():
    machine = TurnMachine()
    assert machine.step(E.LEFT) == Move(P.IDLE, (), TurnState.IDLE)
    assert machine.cut == CANCELLED


def test_an_utterance_waiting_when_the_page_leaves_starts_no_turn():
    machine = TurnMachine()
    machine.step(E.TYPED)
    machine.step(E.UTTERANCE_STARTED)
    machine.step(E.LEFT)
    done = machine.step(E.DONE)
    assert (done.phase, done.do) == (P.IDLE, (Do.RECORD, Do.END))


def test_an_operator_taking_over_cuts_a_running_turn_as_taken_over_and_nothing_waits_for_the_model():
    machine = at(P.ANSWERING)
    machine.waiting = True

    move = machine.step(E.TAKEN_OVER)

    assert move.do == (Do.STOP_VOICE, Do.CANCEL)
    assert (machine.cut, machine.waiting) == (TAKEN_OVER, False)


def test_an_operator_taking_over_an_idle_or_already_cut_turn_changes_how_it_was_cut_in_neither():
    idle, cut = at(P.IDLE), at(P.CUT)
    cut.cut = DISCONNECTED

    assert idle.step(E.TAKEN_OVER).do == () and idle.cut == CANCELLED
    assert cut.step(E.TAKEN_OVER).do == () and cut.cut == DISCONNECTED


def test_the_next_turn_after_a_takeover_is_cut_as_cancelled_again():
    machine = at(P.ANSWERING)
    machine.step(E.TAKEN_OVER)
    machine.step(E.DONE)

    machine.step(E.TYPED)

    assert machine.cut == CANCELLED
