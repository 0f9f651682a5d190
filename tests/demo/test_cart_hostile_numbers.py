"""The demo cart API answers any number with 200 or a 400 sentence, never a 500."""
from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.django_db]

HOSTILE_NUMBERS = ["1e300", "-1e300", "1e400", "NaN", "Infinity", "-Infinity",
                   "100000000000000000000000000000", "-9223372036854775809", "2.5e-320"]


def post_text(client, action: str, text: str):
    return client.post(f"/demo/api/cart/{action}", text, content_type="application/json")


@pytest.mark.parametrize("number", HOSTILE_NUMBERS)
@pytest.mark.parametrize("action, field", [("add", "quantity"), ("quantity", "quantity"),
                                           ("pay", "amount")])
def test_a_hostile_number_is_answered_400_with_a_sentence(client, action, field, number):
    assert post_text(client, "add", '{"productId": "travel-speaker", "quantity": 1}').status_code == 200
    response = post_text(client, action, f'{{"productId": "travel-speaker", "{field}": {number}}}')
    assert response.status_code == 400, response.content
    sentence = response.json()["error"]
    assert sentence.endswith(".") and len(sentence) < 200


def test_nesting_too_deep_for_the_decoder_is_answered_400(client):
    response = post_text(client, "add", "[" * 100_000)
    assert response.status_code == 400


def test_an_ordinary_payment_still_goes_through(client):
    post_text(client, "add", '{"productId": "travel-speaker", "quantity": 2}')
    response = post_text(client, "pay", json.dumps({"amount": 178.0}))
    assert response.status_code == 200 and response.json()["paid"] is True
