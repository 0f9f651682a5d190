"""What the tool-call ledger promises the model, pinned word for word where
the words are the promise."""
from __future__ import annotations

from aitp.ledger import SUCCESS, Outcome


def test_a_success_without_data_tells_the_model_in_one_plain_sentence():
    assert Outcome(SUCCESS).content_for_model() == "The tool ran successfully and returned no data."
    assert Outcome(SUCCESS).tool_result_block("toolu_1") == {
        "type": "tool_result", "tool_use_id": "toolu_1",
        "content": "The tool ran successfully and returned no data.",
    }


def test_a_result_reaches_the_model_as_compact_json_with_its_text_unescaped():
    outcome = Outcome(SUCCESS, result={"name": "café", "sizes": [1, 2]})
    assert outcome.content_for_model() == '{"name":"café","sizes":[1,2]}'
