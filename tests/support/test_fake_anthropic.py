"""The fake Messages API server itself, read off the wire without the SDK."""
from __future__ import annotations

import http.client
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.fake_anthropic import (
    FakeAnthropicServer,
    error_response,
    split_json_pieces,
    sse_events,
    text_response,
    tool_use_response,
)

REPO = Path(__file__).resolve().parents[2]
MESSAGE = {"model": "claude-test", "max_tokens": 64, "stream": True,
           "messages": [{"role": "user", "content": "hello"}]}


@pytest.fixture
def fake():
    with FakeAnthropicServer() as server:
        yield server


@dataclass
class Reply:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self) -> dict:
        return json.loads(self.body)


def post(port: int, body: dict, headers: dict | None = None) -> Reply:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("POST", "/v1/messages", json.dumps(body),
                     {"content-type": "application/json", **(headers or {})})
        response = conn.getresponse()
        return Reply(response.status, response.headers, response.read())
    finally:
        conn.close()


def events(raw: bytes) -> list[tuple[str, dict]]:
    parsed = []
    for frame in raw.decode("utf-8").split("\n\n"):
        if not frame:
            continue
        event_line, data_line = frame.split("\n")
        parsed.append((event_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))))
    return parsed


def test_streams_a_text_answer_as_the_real_event_sequence(fake):
    fake.enqueue(text_response("abcdef", chunks=3, usage={"input_tokens": 4, "output_tokens": 2}))

    reply = post(fake.port, MESSAGE)
    stream = events(reply.body)

    assert reply.status == 200
    assert reply.headers["content-type"].startswith("text/event-stream")
    assert [name for name, _ in stream] == [
        "message_start", "content_block_start", "ping", "content_block_delta",
        "content_block_delta", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop",
    ]
    assert all(name == data["type"] for name, data in stream)
    message = stream[0][1]["message"]
    assert message["model"] == "claude-test"
    assert (message["role"], message["content"], message["stop_reason"]) == ("assistant", [], None)
    assert message["usage"]["input_tokens"] == 4
    texts = [data["delta"]["text"] for name, data in stream if name == "content_block_delta"]
    assert texts == ["ab", "cd", "ef"]
    assert stream[-2][1]["delta"]["stop_reason"] == "end_turn"
    assert stream[-2][1]["usage"]["output_tokens"] == 2


def test_streams_tool_input_as_json_deltas_that_join_to_the_input(fake):
    arguments = {"sku": "A1", "note": "d\u00e9j\u00e0 vu"}
    fake.enqueue(tool_use_response([("toolu_9", "add_to_cart", arguments)], split_json_at=[3, 9, 27]))

    stream = events(post(fake.port, MESSAGE).body)

    start = next(data for name, data in stream if name == "content_block_start")
    assert start["content_block"] == {
        "type": "tool_use", "id": "toolu_9", "name": "add_to_cart", "input": {},
    }
    pieces = [data["delta"]["partial_json"] for name, data in stream if name == "content_block_delta"]
    assert pieces[0] == ""
    assert len(pieces) == 5
    assert json.loads("".join(pieces)) == arguments
    assert stream[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_cuts_the_http_chunk_inside_a_multibyte_character():
    text = json.dumps({"a": "\u00e9\u65e5"}, ensure_ascii=False)  # {"a": "é日"}
    pieces = split_json_pieces(text, [8, 11])  # inside é, inside 日

    assert [piece.text for piece in pieces] == ['{"a": "', "\u00e9", '\u65e5"}']
    assert [piece.cut for piece in pieces] == [None, 1, 2]
    response = tool_use_response([("toolu_1", "t", {"a": "\u00e9\u65e5"})], split_json_at=[8, 11])
    chunks = [event for event in sse_events(response, "m") if len(event) == 2]
    assert [(first[-2:], rest[:2]) for first, rest in chunks] == [
        (b'"\xc3', b"\xa9\""),  # é is c3 a9
        (b"\xe6\x97", b"\xa5\\"),  # 日 is e6 97 a5, then the escaped quote
    ]


def test_refuses_a_split_offset_outside_the_json():
    with pytest.raises(ValueError):
        split_json_pieces("{}", [2])


def test_answers_an_error_with_the_api_error_body_and_retry_headers(fake):
    fake.enqueue(error_response(429, retry_after=1.5, retry_after_ms=1500))

    reply = post(fake.port, MESSAGE)

    assert reply.status == 429
    assert reply.headers["retry-after"] == "1.5"
    assert reply.headers["retry-after-ms"] == "1500"
    assert reply.json() == {
        "type": "error", "error": {"type": "rate_limit_error", "message": "rate limit error"},
    }


def test_names_a_529_an_overloaded_error(fake):
    fake.enqueue(error_response(529))

    assert post(fake.port, MESSAGE).json()["error"]["type"] == "overloaded_error"


def test_records_every_body_with_its_headers_and_outcome(fake):
    post(fake.port, MESSAGE, {"x-api-key": "sk-one"})
    post(fake.port, {**MESSAGE, "model": "other"}, {"authorization": "Bearer sk-two"})
    # The outcome is recorded once the answer has left, which the client may read first.
    assert fake.wait_for(lambda seen: len(seen) == 2 and seen[0].outcome != "pending")

    first, second = fake.requests
    assert (first["model"], first.api_key, first.outcome) == ("claude-test", "sk-one", "complete")
    assert (second["model"], second.api_key, second.path) == ("other", "sk-two", "/v1/messages")


def test_refuses_a_request_without_the_required_key(fake):
    fake.api_key = "sk-right"

    assert post(fake.port, MESSAGE, {"x-api-key": "sk-wrong"}).status == 401
    assert post(fake.port, MESSAGE, {"x-api-key": "sk-right"}).status == 200


def list_models(port: int, headers: dict | None = None) -> Reply:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/v1/models?limit=1", headers=headers or {})
        response = conn.getresponse()
        return Reply(response.status, response.headers, response.read())
    finally:
        conn.close()


def test_lists_its_model_for_the_right_key_and_answers_401_for_another_without_recording_them(fake):
    fake.api_key = "sk-right"

    refused = list_models(fake.port, {"x-api-key": "sk-wrong"})
    answered = list_models(fake.port, {"authorization": "Bearer sk-right"})

    assert refused.status == 401 and refused.json()["error"]["type"] == "authentication_error"
    assert answered.status == 200
    assert [model["id"] for model in answered.json()["data"]] == ["claude-sonnet-5-5"]
    assert fake.model_lists == 2 and fake.requests == []


def test_rejects_a_request_without_max_tokens_like_the_api(fake):
    reply = post(fake.port, {"model": "m", "messages": []})

    assert reply.status == 400
    assert reply.json()["error"]["type"] == "invalid_request_error"


def test_answers_a_plain_json_message_when_not_streaming(fake):
    fake.enqueue(tool_use_response([("toolu_1", "get_cart", {})], text="Looking."))

    reply = post(fake.port, {**MESSAGE, "stream": False})
    message = reply.json()

    assert reply.headers["content-type"] == "application/json"
    assert message["content"] == [
        {"type": "text", "text": "Looking."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_cart", "input": {}},
    ]
    assert message["stop_reason"] == "tool_use"


def test_default_answers_echo_call_a_tool_and_finish_after_results(fake):
    def answer(messages: list[dict], **extra) -> dict:
        body = {**MESSAGE, "stream": False, "messages": messages, **extra}
        return post(fake.port, body).json()

    echo = answer([{"role": "user", "content": "hello there"}])
    call = answer([{"role": "user", "content": 'please call add_to_cart {"sku": "A1"}'}])
    refused = answer([{"role": "user", "content": "call get_cart"}], tool_choice={"type": "none"})
    done = answer([{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]}])

    assert echo["content"] == [{"type": "text", "text": "You said: hello there"}]
    assert call["content"][0]["name"] == "add_to_cart"
    assert call["content"][0]["input"] == {"sku": "A1"}
    assert call["stop_reason"] == "tool_use"
    assert refused["content"][0]["type"] == "text"
    assert done["content"] == [{"type": "text", "text": "done"}]


def test_runs_as_a_script_until_terminated():
    with subprocess.Popen(
        [sys.executable, "-m", "tests.support.fake_anthropic", "--port", "0"],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    ) as process:
        try:
            line = process.stdout.readline()
            assert line.startswith("fake anthropic listening on http://127.0.0.1:")
            port = int(line.rsplit(":", 1)[1])
            stream = events(post(port, MESSAGE).body)
            assert stream[-1][0] == "message_stop"
        finally:
            process.terminate()
        assert process.wait(timeout=10) == 0
