"""A continued session's conversation, rebuilt from its stored messages:
what the model is sent is what it was sent before the socket dropped, and
every tool_use has exactly one tool_result."""
from __future__ import annotations

from agent.conversation import NOT_ANSWERED, Conversation


def text(words: str, **marks) -> dict:
    return {"type": "text", "text": words, **marks}


def use(call_id: str) -> dict:
    return {"type": "tool_use", "id": call_id, "name": "add_to_cart", "input": {}}


def result(call_id: str, content: str = "done") -> dict:
    return {"type": "tool_result", "tool_use_id": call_id, "content": content}


def not_answered(call_id: str) -> dict:
    return {"type": "tool_result", "tool_use_id": call_id, "content": NOT_ANSWERED, "is_error": True}


def stored(*messages: tuple[str, list[dict]]) -> list[dict]:
    return [{"seq": n, "role": role, "content": content} for n, (role, content) in enumerate(messages, 1)]


def test_a_conversation_that_ended_its_turns_is_sent_as_it_was():
    rows = stored(("user", [text("hi")]), ("assistant", [text("hello"), use("a")]),
                  ("user", [result("a")]), ("assistant", [text("added")]))

    restored = Conversation.restored(rows)

    assert restored.history == [{"role": role, "content": content} for role, content in
                                [("user", [text("hi")]), ("assistant", [text("hello"), use("a")]),
                                 ("user", [result("a")]), ("assistant", [text("added")])]]
    assert not restored.unsaved


def test_the_records_marks_are_not_sent_to_the_model():
    rows = stored(("user", [text("hi", voice="heard")]),
                  ("assistant", [text("hello", voice="said")]),
                  ("user", [text("again"), {"type": "turn_error", "code": "timeout", "message": "m"}]))

    restored = Conversation.restored(rows)

    assert restored.history == [{"role": "user", "content": [text("hi")]},
                                {"role": "assistant", "content": [text("hello")]},
                                {"role": "user", "content": [text("again")]}]


def test_a_call_cut_by_the_drop_is_answered_as_not_answered_once():
    rows = stored(("user", [text("buy two")]), ("assistant", [use("a"), use("b")]),
                  ("user", [result("b")]))

    history = Conversation.restored(rows).history

    assert history[-1] == {"role": "user", "content": [not_answered("a"), result("b")]}


def test_a_last_message_of_calls_without_results_gets_them():
    rows = stored(("user", [text("buy")]), ("assistant", [text("ok"), use("a")]))

    history = Conversation.restored(rows).history

    assert history[-1] == {"role": "user", "content": [not_answered("a")]}


def test_a_result_that_answers_no_call_is_left_out_and_the_roles_alternate():
    rows = stored(("user", [text("hi")]), ("user", [result("ghost"), text("still there?")]),
                  ("assistant", [text("yes")]), ("assistant", [text("and more")]))

    history = Conversation.restored(rows).history

    assert history == [{"role": "user", "content": [text("hi"), text("still there?")]},
                       {"role": "assistant", "content": [text("yes"), text("and more")]}]


def test_the_next_message_is_numbered_after_the_stored_ones():
    restored = Conversation.restored(stored(("user", [text("hi")]), ("assistant", [text("hello")])))

    restored.append("user", [text("next")])

    assert restored.unsaved == [{"seq": 3, "role": "user", "content": [text("next")]}]
