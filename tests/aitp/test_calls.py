"""A tool call's state machine (aitp.calls): every event in every state, pure."""
from __future__ import annotations

import itertools

import pytest

from aitp import calls
from aitp.calls import CallEvent as E
from aitp.calls import CallStatus as S
from aitp.calls import PageMistake, Party, ServerMistake

OPEN = {S.PENDING, S.SENT, S.AWAITING_APPROVAL, S.RUNNING}
FINAL = set(S) - OPEN

# Written out here, not read from the module: this is what a call may do.
EXPECTED = {
    (S.PENDING, E.DISPATCHED): S.SENT,
    (S.PENDING, E.APPROVAL_REQUESTED): S.AWAITING_APPROVAL,
    (S.SENT, E.APPROVAL_REQUESTED): S.AWAITING_APPROVAL,
    (S.AWAITING_APPROVAL, E.APPROVAL_REQUESTED): S.AWAITING_APPROVAL,
    (S.AWAITING_APPROVAL, E.APPROVED): S.RUNNING,
    (S.PENDING, E.STARTED): S.RUNNING,
    (S.SENT, E.SUCCEEDED): S.SUCCESS,
    (S.AWAITING_APPROVAL, E.SUCCEEDED): S.SUCCESS,
    (S.RUNNING, E.SUCCEEDED): S.SUCCESS,
    (S.PENDING, E.ARGUMENTS_REFUSED): S.INVALID_ARGS,
    (S.PENDING, E.NOT_AVAILABLE): S.UNAVAILABLE,
    (S.SENT, E.TIMED_OUT): S.TIMEOUT,
    (S.SENT, E.DENIED): S.DENIED,
    (S.AWAITING_APPROVAL, E.DENIED): S.DENIED,
    (S.SENT, E.EXPIRED): S.EXPIRED,
    (S.AWAITING_APPROVAL, E.EXPIRED): S.EXPIRED,
    **{(state, E.FAILED): S.ERROR for state in OPEN},
    **{(state, E.CANCELLED): S.CANCELLED for state in OPEN},
    **{(state, E.DISCONNECTED): S.DISCONNECTED for state in OPEN},
}
REFUSED = [pair for pair in itertools.product(S, E) if pair not in EXPECTED]


@pytest.mark.parametrize(("state", "event"), sorted(EXPECTED, key=str))
def test_an_allowed_event_moves_the_call_to_its_state(state, event):
    assert calls.step(state, event) is EXPECTED[(state, event)]
    assert calls.allowed(state, event)


@pytest.mark.parametrize(("state", "event"), sorted(REFUSED, key=str))
def test_an_event_the_table_refuses_is_the_servers_mistake_when_the_server_makes_it(state, event):
    with pytest.raises(ServerMistake) as caught:
        calls.step(state, event, by=Party.SERVER)
    assert (caught.value.state, caught.value.event) == (state, event)
    assert not calls.allowed(state, event)


@pytest.mark.parametrize(("state", "event"), sorted(REFUSED, key=str))
@pytest.mark.parametrize("by", [Party.PAGE, Party.PERSON])
def test_an_event_the_table_refuses_is_the_peers_mistake_when_a_page_or_person_makes_it(
        state, event, by):
    with pytest.raises(PageMistake) as caught:
        calls.step(state, event, by=by)
    assert caught.value.code == "unknown_call"


@pytest.mark.parametrize("state", sorted(FINAL))
def test_a_final_state_never_changes_again(state):
    assert all(not calls.allowed(state, event) for event in E)
    assert state.is_final


def test_the_final_statuses_are_the_ledgers_and_each_is_reached_by_one_event():
    assert calls.FINAL == FINAL
    assert {calls.step(next(s for s in OPEN if calls.allowed(s, e)), e)
            for status, e in calls.ENDED_BY.items()} == FINAL
    assert all(EXPECTED[(s, calls.ENDED_BY[status])] is status
               for (s, _), status in EXPECTED.items() if status in FINAL)


def test_the_sources_of_a_state_are_the_states_some_event_leaves_for_it():
    assert calls.sources(S.SENT) == {S.PENDING}
    assert calls.sources(S.RUNNING) == {S.PENDING, S.AWAITING_APPROVAL}
    assert calls.sources(S.CANCELLED) == OPEN
    assert calls.sources(S.PENDING) == frozenset()


def test_every_approval_decision_ends_the_wait_of_a_call_awaiting_approval():
    assert {status: calls.step(S.AWAITING_APPROVAL, event)
            for status, event in calls.APPROVAL_DECISIONS.items()} == {
        "approved": S.RUNNING, "denied": S.DENIED, "expired": S.EXPIRED,
        "cancelled": S.CANCELLED, "disconnected": S.DISCONNECTED,
    }


def test_the_ledger_table_offers_every_status_with_a_label():
    from aitp.models import ToolCall

    assert ToolCall.Status.choices == [(s.value, s.label) for s in S]
    assert {str(s) for s in ToolCall.FINAL_STATUSES} == {s.value for s in FINAL}


def test_a_turns_states_are_the_session_rows_states_and_nothing_else():
    from aitp.models import Session
    from aitp.turn_state import TurnState

    assert {state.value for state in TurnState} == set(Session.State.values) - {Session.State.ENDED}


def test_a_refused_event_says_which_event_in_which_state_and_who_made_it():
    with pytest.raises(PageMistake) as caught:
        calls.step(S.SUCCESS, E.SUCCEEDED, by=Party.PAGE)

    assert str(caught.value) == "succeeded is not allowed in state success (by page)"
