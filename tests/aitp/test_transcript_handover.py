"""An operator's time in charge of a chat, read from the stored messages:
headings for the records, and what a reloaded page draws again (the
operator's words as the agent's, never the note meant for the agent)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from agent.conversation import (
    HANDED_BACK,
    HUMAN_KINDS,
    NO_OPERATOR,
    OPERATOR,
    OPERATOR_TOOL,
    TAKEN_OVER,
    TO_OPERATOR,
    human_block,
)
from aitp.transcript import (
    HUMAN_TITLES,
    Block,
    action_words,
    content_block,
    visible_history,
)


def stored(*contents: list, role: str = "user") -> list[SimpleNamespace]:
    """Messages as the agent stores them: one row per content, in order."""
    return [SimpleNamespace(seq=seq, turn=2, role=role, content=content)
            for seq, content in enumerate(contents, start=1)]


def test_every_kind_of_the_operators_time_in_charge_has_a_heading():
    assert set(HUMAN_TITLES) == set(HUMAN_KINDS)


@pytest.mark.parametrize("block, title", [
    (human_block(TAKEN_OVER, operator="Jane"), "Jane took the chat over"),
    (human_block(TO_OPERATOR, "Are you a person?"), "to the operator"),
    (human_block(OPERATOR, "Yes, I am.", operator="Jane"), "operator Jane"),
    (human_block(HANDED_BACK, "Refund done.", operator="Jane"), "Jane handed the chat back"),
    (human_block(TAKEN_OVER), "an operator took the chat over"),
])
def test_a_block_of_the_operators_time_in_charge_is_headed_by_what_happened_and_who(block, title):
    assert content_block(block).title == title


def test_the_hand_back_note_is_the_blocks_text():
    assert content_block(human_block(HANDED_BACK, "Refund done.", operator="Jane")) == Block(
        kind="text", text="Refund done.", human=HANDED_BACK, operator="Jane")


def test_a_block_marked_with_an_unknown_kind_is_read_as_plain_text():
    assert content_block({"type": "text", "text": "hi", "human": "robot"}) == Block(kind="text", text="hi")


def test_the_operators_steps_are_named_in_words():
    assert action_words("session_take_over") == "Took the chat over"
    assert action_words("session_operator_says") == "Wrote to the page user"
    assert action_words("session_hand_back") == "Handed the chat back"


def test_a_reloaded_page_draws_the_operators_words_as_the_agents_and_the_page_users_as_theirs():
    messages = stored(
        [{"type": "text", "text": "Where is my refund?"}],
        [human_block(TAKEN_OVER, operator="Jane")],
        [human_block(TO_OPERATOR, "Are you a person?")],
        [human_block(OPERATOR, "Yes, Jane from Acme.", operator="Jane")],
        [human_block(HANDED_BACK, "Be kind, the refund is done.", operator="Jane")],
    )

    entries, truncated = visible_history(messages)

    assert not truncated
    assert entries == [
        {"role": "user", "text": "Where is my refund?", "turn": 2},
        {"role": "assistant", "text": "Jane has joined the chat and answers you now.", "turn": 2},
        {"role": "user", "text": "Are you a person?", "turn": 2},
        {"role": "assistant", "text": "Yes, Jane from Acme.", "turn": 2, "operator": "Jane"},
        {"role": "assistant", "text": "Jane has handed the chat back to the assistant.", "turn": 2},
    ]


def test_a_reloaded_page_never_shows_the_note_meant_for_the_agent():
    entries, _ = visible_history(stored([human_block(HANDED_BACK, "Customer is angry.", operator="Jane")]))
    assert all("angry" not in entry["text"] for entry in entries)


def test_empty_words_of_the_time_in_charge_draw_nothing():
    entries, _ = visible_history(stored([human_block(TO_OPERATOR, "")], [human_block(OPERATOR, "", operator="J")]))
    assert entries == []



def test_the_end_of_a_wait_for_a_person_reads_as_such_in_the_record_and_is_not_drawn_again_on_the_page():
    block = human_block(NO_OPERATOR)
    entries, _ = visible_history(stored([block]))

    assert entries == []
    assert content_block(block).title == "the agent asked for a person; none took the chat over in time"


def test_a_page_tool_the_operator_ran_reads_as_such_in_the_record_and_is_not_drawn_again_on_the_page():
    block = human_block(OPERATOR_TOOL, 'open_product {"id": "p1"}: {"opened":true}', operator="Jane Doe")
    entries, _ = visible_history(stored([block]))

    assert entries == []
    assert content_block(block).title == "Jane Doe ran a page tool"
    assert content_block(block).text == 'open_product {"id": "p1"}: {"opened":true}'


def test_a_reloaded_page_is_told_which_words_were_spoken_and_which_answer_was_talked_over():
    messages = stored([{"type": "text", "text": "add two", "voice": "heard"}],
                      [{"type": "text", "text": "Adding two of", "voice": "interrupted"}],
                      [{"type": "text", "text": "Done.", "voice": "said"}])

    entries, _ = visible_history(messages)

    assert [(entry["text"], entry.get("voice"), entry.get("cut")) for entry in entries] == [
        ("add two", True, None), ("Adding two of", True, True), ("Done.", True, None)]
