"""The numbered frames of a client that can resume (aitp.outbox)."""
from __future__ import annotations

import json

from aitp import protocol as p
from aitp.outbox import Outbox
from aitp.session import Limits, SessionMachine


def numbers(texts: list[tuple[int, str]]) -> list[int]:
    return [json.loads(text)["meta"]["seq"] for _, text in texts]


def test_frames_are_numbered_one_after_another_from_where_the_count_starts():
    outbox = Outbox(seq=7)
    texts = [outbox.numbered(p.agent_response(word, False)) for word in ("a", "b", "c")]

    assert [json.loads(t)["meta"] for t in texts] == [{"seq": 8}, {"seq": 9}, {"seq": 10}]
    assert numbers(outbox.after(8)) == [9, 10]


def test_a_frames_own_meta_is_kept_beside_its_number():
    outbox = Outbox()
    text = outbox.numbered(p.system_event("transcript", message="hi", meta={"final": True}))

    assert json.loads(text)["meta"] == {"final": True, "seq": 1}


def test_a_client_that_handled_everything_goes_on_from_the_last_number_and_gets_nothing_again():
    outbox = Outbox()
    for _ in range(3):
        outbox.numbered(p.agent_response("x", False))

    assert outbox.position(3) == 3 and outbox.after(3) == []
    assert outbox.position(None) == 3
    assert outbox.position(99) == 3


def test_a_client_behind_the_oldest_kept_frame_gets_every_kept_frame():
    outbox = Outbox(max_frames=2)
    for _ in range(5):
        outbox.numbered(p.agent_response("x", False))

    assert outbox.position(1) == 3
    assert numbers(outbox.after(outbox.position(1))) == [4, 5]


def test_the_oldest_frames_go_first_past_the_byte_limit():
    one = len(Outbox().numbered(p.agent_response("x" * 80, False)))
    outbox = Outbox(max_bytes=2 * one + one // 2)
    for _ in range(5):
        outbox.numbered(p.agent_response("x" * 80, False))

    assert numbers(outbox.after(0)) == [4, 5]


def test_calls_handled_are_those_numbered_up_to_the_clients_position_whether_or_not_still_kept():
    outbox = Outbox(max_frames=1)
    outbox.numbered(p.tool_call("call_1", "add_to_cart", {}))
    outbox.numbered(p.agent_response("x", False))
    outbox.numbered(p.approval_request("call_2", "refund", "high", {}, "Allow refund?"))

    assert outbox.calls_through(2) == ["call_1"]
    assert outbox.calls_through(3) == ["call_1", "call_2"]
    assert outbox.calls_through(0) == []


def test_a_machine_numbers_the_frames_of_a_client_that_offered_to_resume_and_only_those():
    limits = Limits(max_message_bytes=1 << 20, max_active_tools=5, max_context_bytes=1 << 16,
                    max_invalid_frames=5, max_input_chars=1000, max_json_depth=32, max_audio_seconds=30)
    resuming, deployed = (SessionMachine(limits=limits, server_version="t") for _ in range(2))
    for machine in (resuming, deployed):
        machine.handshake_pending = True
    resuming.accept_handshake("ses_1", resume_token="ses_1.x", resumed=False, numbered_from=4)
    deployed.accept_handshake("ses_2")
    for machine in (resuming, deployed):
        machine.send(p.agent_response("hi", False))

    ack, reply = (json.loads(t) for t in resuming.data_to_send())
    assert ack["meta"] == {"seq": 4} and reply["meta"] == {"seq": 5}
    assert all("meta" not in json.loads(t) for t in deployed.data_to_send())
    assert deployed.outbox is None
