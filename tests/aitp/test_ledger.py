"""The pieces of the agent turn that need neither a model nor a socket:
the tool-call ledger (aitp/ledger.py), the text streamer and the history window."""
from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.text import TextStreamer, bounded_history
from aitp import protocol as p
from aitp.calls import CallStatus, ServerMistake
from aitp.ledger import (
    DENIED,
    ERROR,
    SUCCESS,
    TIMEOUT,
    Ledger,
    Outcome,
    PendingCall,
    new_call_id,
    wait_until_deadline,
)

# --- call ids and outcomes -----------------------------------------------------


def test_call_ids_are_prefixed_long_and_never_repeat():
    ids = [new_call_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    assert all(i.startswith("tc_") and len(i) >= 20 for i in ids)


def test_a_success_becomes_a_tool_result_without_is_error_carrying_the_json_result():
    block = Outcome(SUCCESS, result={"added": True, "name": "café"}).tool_result_block("toolu_1")
    assert block == {"type": "tool_result", "tool_use_id": "toolu_1",
                     "content": '{"added":true,"name":"café"}'}


def test_a_success_without_data_still_tells_the_model_it_ran():
    block = Outcome(SUCCESS).tool_result_block("toolu_1")
    assert "is_error" not in block
    assert "successfully" in block["content"]


def test_a_falsy_result_is_data_not_absence():
    assert Outcome(SUCCESS, result=0).content_for_model() == "0"
    assert Outcome(SUCCESS, result=[]).content_for_model() == "[]"


def test_every_status_but_success_is_an_error_for_the_model():
    for status in (ERROR, TIMEOUT, DENIED, "invalid_args", "unavailable", "disconnected"):
        block = Outcome(status, error="it failed").tool_result_block("toolu_9")
        assert block["is_error"] is True
        assert block["content"] == "it failed"


def test_an_error_without_a_message_names_its_status():
    assert "timeout" in Outcome(TIMEOUT).content_for_model()


# --- pending calls ---------------------------------------------------------------


def make_call(**fields) -> PendingCall:
    # As the ledger holds a page's call: its TOOL_CALL frame is out.
    defaults = {"call_id": new_call_id(), "tool_use_id": "toolu_1", "name": "add_to_cart",
                "args": {"quantity": 1}, "spec": None, "state": CallStatus.SENT}
    return PendingCall(**{**defaults, **fields})


async def test_a_call_is_resolved_once_and_the_first_outcome_wins():
    call = make_call()
    assert call.resolve(Outcome(SUCCESS, result=1)) is True
    assert call.resolve(Outcome(ERROR, error="late")) is False
    assert call.future.result() == Outcome(SUCCESS, result=1)


async def test_a_call_ends_in_the_state_its_outcome_names():
    call = make_call()
    call.resolve(Outcome(DENIED))
    assert call.state is CallStatus.DENIED


async def test_an_outcome_the_call_table_refuses_is_the_servers_mistake_and_ends_nothing():
    call = make_call(state=CallStatus.PENDING)
    with pytest.raises(ServerMistake):
        call.resolve(Outcome(SUCCESS))
    assert (call.state, call.future.done()) == (CallStatus.PENDING, False)


async def test_a_decision_is_taken_once():
    call = make_call()
    assert call.decide("denied") is True
    assert call.decide("approved") is False
    assert call.decision.result() == "denied"


async def test_a_deadline_only_moves_later():
    call = make_call(deadline=100.0)
    assert call.extend(50.0) is False
    assert call.deadline == 100.0
    assert call.extend(150.0) is True
    assert call.deadline == 150.0


async def test_a_deadline_is_extended_once_in_a_calls_life():
    call = make_call(deadline=100.0)
    assert call.extend(150.0) is True
    assert call.extend(200.0) is False
    assert call.deadline == 150.0


async def test_a_call_without_spec_is_an_interface_call_of_no_risk():
    call = make_call()
    assert call.origin == "client"
    assert call.risk.value == "none"


async def test_waiting_returns_the_outcome_once_resolved():
    loop = asyncio.get_running_loop()
    call = make_call(deadline=loop.time() + 30)
    loop.call_soon(call.resolve, Outcome(SUCCESS, result="ok"))
    assert await wait_until_deadline(call, call.future) == Outcome(SUCCESS, result="ok")


async def test_waiting_gives_up_with_none_once_the_deadline_passed():
    loop = asyncio.get_running_loop()
    call = make_call(deadline=loop.time() + 0.05)
    assert await wait_until_deadline(call, call.future) is None
    assert not call.future.done()


async def test_an_already_resolved_call_wins_over_a_passed_deadline():
    call = make_call(deadline=0.0)
    call.resolve(Outcome(ERROR, error="x"))
    assert (await wait_until_deadline(call, call.future)).status == ERROR


async def test_a_deadline_extended_while_waiting_keeps_the_call_alive():
    loop = asyncio.get_running_loop()
    call = make_call(deadline=loop.time() + 0.05)
    # Extended before the first deadline, answered after it.
    loop.call_later(0.01, call.extend, loop.time() + 30)
    loop.call_later(0.2, call.resolve, Outcome(SUCCESS, result="late but allowed"))
    outcome = await wait_until_deadline(call, call.future)
    assert outcome == Outcome(SUCCESS, result="late but allowed")


async def test_waiting_on_the_decision_future_ignores_the_outcome_future():
    loop = asyncio.get_running_loop()
    call = make_call(deadline=loop.time() + 30)
    call.resolve(Outcome(SUCCESS))
    loop.call_soon(call.decide, "approved")
    assert await wait_until_deadline(call, call.decision) == "approved"


# --- the ledger --------------------------------------------------------------------


async def test_the_ledger_finds_an_open_call_by_id():
    ledger = Ledger()
    call = make_call()
    ledger.add(call)
    assert ledger.get(call.call_id) is call
    assert ledger.open_calls() == [call]


async def test_a_resolved_call_is_unknown_so_a_duplicate_answer_finds_nothing():
    ledger = Ledger()
    call = make_call()
    ledger.add(call)
    call.resolve(Outcome(SUCCESS))
    assert ledger.get(call.call_id) is None
    assert ledger.open_calls() == []


async def test_an_unknown_or_removed_id_finds_nothing():
    ledger = Ledger()
    call = make_call()
    ledger.add(call)
    ledger.remove(call.call_id)
    ledger.remove(call.call_id)  # removing twice is harmless
    assert ledger.get(call.call_id) is None
    assert ledger.get("tc_guess") is None


async def test_a_call_is_found_by_its_open_approval_only():
    ledger = Ledger()
    call = make_call(approval_id=7)
    ledger.add(call)
    assert ledger.by_approval(7) is call
    assert ledger.by_approval(8) is None
    call.resolve(Outcome(DENIED))
    assert ledger.by_approval(7) is None


# --- the text streamer ---------------------------------------------------------------


class Sent:
    """Records the AGENT_RESPONSE chunks a streamer sends; may hold a send back."""

    def __init__(self) -> None:
        self.chunks: list[str] = []
        self.release: asyncio.Event | None = None

    async def __call__(self, message: p.Message) -> None:
        assert message.type is p.MessageType.AGENT_RESPONSE
        assert message.payload.done is False
        if self.release is not None:
            await self.release.wait()
        self.chunks.append(message.payload.chunk)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_the_first_delta_goes_out_at_once():
    sent = Sent()
    streamer = TextStreamer(sent, interval=60)
    streamer.push("Hel")
    await settle()
    assert sent.chunks == ["Hel"]
    await streamer.discard()


async def test_deltas_inside_the_interval_are_coalesced_into_one_frame():
    sent = Sent()
    streamer = TextStreamer(sent, interval=60)
    streamer.push("a")
    await settle()
    for piece in ("b", "c", "d"):
        streamer.push(piece)
        await settle()
    assert sent.chunks == ["a"]
    await streamer.close()
    assert sent.chunks == ["a", "bcd"]


async def test_empty_deltas_send_nothing():
    sent = Sent()
    streamer = TextStreamer(sent, interval=0)
    streamer.push("")
    await streamer.close()
    assert sent.chunks == []


async def test_close_waits_for_a_frame_in_flight_and_keeps_the_order():
    sent = Sent()
    sent.release = asyncio.Event()
    streamer = TextStreamer(sent, interval=60)
    streamer.push("first ")
    await settle()  # "first " is being sent, held by the release event
    streamer.push("second")
    closing = asyncio.create_task(streamer.close())
    await settle()
    assert not closing.done()
    sent.release.set()
    await closing
    assert sent.chunks == ["first ", "second"]


async def test_discard_drops_the_buffered_text():
    sent = Sent()
    streamer = TextStreamer(sent, interval=60)
    streamer.push("a")
    await settle()
    streamer.push("never shown")
    await streamer.discard()
    await streamer.close()
    assert sent.chunks == ["a"]


@settings(max_examples=40, deadline=None)
@given(pieces=st.lists(st.text(max_size=5), max_size=20), interval=st.sampled_from([0, 0.001, 60]))
def test_the_frames_concatenate_to_the_pushed_text(pieces, interval):
    async def run() -> list[str]:
        sent = Sent()
        streamer = TextStreamer(sent, interval=interval)
        for piece in pieces:
            streamer.push(piece)
            await asyncio.sleep(0)
        await streamer.close()
        return sent.chunks

    chunks = asyncio.run(run())
    assert "".join(chunks) == "".join(pieces)
    assert all(chunks)


# --- the history window ------------------------------------------------------------------


def user(text: str) -> dict:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def assistant_text(text: str) -> dict:
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


def assistant_tool(*ids: str) -> dict:
    return {"role": "assistant", "content": [
        {"type": "tool_use", "id": i, "name": "t", "input": {}} for i in ids]}


def results(*ids: str) -> dict:
    return {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": i, "content": "ok"} for i in ids]}


def test_a_short_history_is_sent_whole():
    history = [user("a"), assistant_text("b")]
    assert bounded_history(history, 40) is history


def test_the_window_starts_at_a_user_message_that_is_not_a_tool_result():
    history = [user("1"), assistant_tool("t1"), results("t1"), assistant_text("ok"),
               user("2"), assistant_text("fine")]
    # The last 4 messages would start at a tool_result: the cut moves to user("2").
    assert bounded_history(history, 4) == [user("2"), assistant_text("fine")]


def test_without_a_clean_cut_in_the_window_the_last_user_text_starts_it():
    history = [user("1"), assistant_tool("t1"), results("t1"), assistant_tool("t2"),
               results("t2"), assistant_text("done")]
    assert bounded_history(history, 3) == history


@st.composite
def conversations(draw) -> list[dict]:
    history: list[dict] = []
    counter = 0
    for _ in range(draw(st.integers(1, 12))):
        history.append(user(f"u{counter}"))
        for _ in range(draw(st.integers(0, 3))):
            ids = []
            for _ in range(draw(st.integers(1, 3))):
                counter += 1
                ids.append(f"toolu_{counter}")
            history.append(assistant_tool(*ids))
            history.append(results(*ids))
        history.append(assistant_text("answer"))
    return history


@settings(max_examples=200, deadline=None)
@given(history=conversations(), limit=st.integers(2, 30))
def test_the_window_never_separates_a_tool_use_from_its_result(history, limit):
    window = bounded_history(history, limit)
    assert window == history[len(history) - len(window):]
    first = window[0]
    assert first["role"] == "user"
    assert all(block["type"] == "text" for block in first["content"])
    used = {b["id"] for m in window for b in m["content"] if b["type"] == "tool_use"}
    answered = {b["tool_use_id"] for m in window for b in m["content"] if b["type"] == "tool_result"}
    assert used == answered
