"""Webhook tools against a real HTTP server on 127.0.0.1."""
from __future__ import annotations

import socket

import pytest

from approvals.webhooks import ToolRunError, call_webhook, sign
from tests.approvals.webhook_receiver import SECRET, Receiver


async def call(url: str, *, timeout: float = 5.0, max_bytes: int = 4096, secret: str = SECRET):
    return await call_webhook(
        url=url, secret=secret, tool="refund", arguments={"order": "A1001", "amount": 5},
        session_id="ses_acme", call_id="tc_1", timeout=timeout, max_bytes=max_bytes,
    )


async def test_posts_a_signed_call_and_returns_the_json_answer(receiver):
    answer = await call(receiver + "/echo")

    assert answer["ok"] is True
    assert answer["got"] == {"tool": "refund", "arguments": {"order": "A1001", "amount": 5},
                             "sessionId": "ses_acme", "callId": "tc_1"}
    assert Receiver.received[0]["signed"] is True


async def test_a_receiver_with_another_secret_sees_a_bad_signature(receiver):
    with pytest.raises(ToolRunError) as caught:
        await call(receiver + "/echo", secret="whsec_someone_else")

    assert caught.value.message == "webhook answered 401"
    assert Receiver.received[0]["signed"] is False


def test_the_signature_covers_the_timestamp():
    body = b'{"tool":"refund"}'

    assert sign(SECRET, "1700000000", body) != sign(SECRET, "1700000001", body)
    assert sign(SECRET, "1700000000", body).startswith("sha256=")


async def test_a_slow_webhook_times_out(receiver):
    with pytest.raises(ToolRunError) as caught:
        await call(receiver + "/slow", timeout=0.3)

    assert caught.value.message == "the webhook did not answer"


async def test_an_error_status_is_reported_with_its_code(receiver):
    with pytest.raises(ToolRunError) as caught:
        await call(receiver + "/fail")

    assert caught.value.message == "webhook answered 500"


async def test_a_redirect_is_not_followed(receiver):
    with pytest.raises(ToolRunError) as caught:
        await call(receiver + "/redirect")

    assert caught.value.message == "webhook answered 302"
    assert [r["path"] for r in Receiver.received] == ["/redirect"]


async def test_a_body_that_is_not_json_is_refused(receiver):
    with pytest.raises(ToolRunError) as caught:
        await call(receiver + "/garbage")

    assert caught.value.message == "webhook returned invalid JSON"


@pytest.mark.parametrize("path", ["/huge-declared", "/huge-streamed"])
async def test_an_oversized_answer_is_refused(receiver, path):
    with pytest.raises(ToolRunError) as caught:
        await call(receiver + path, max_bytes=4096)

    assert caught.value.message == "response too large"


async def test_an_unreachable_webhook_is_reported():
    # A bound socket that never listens holds the port and refuses connections.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        with pytest.raises(ToolRunError) as caught:
            await call(f"http://127.0.0.1:{closed.getsockname()[1]}/echo")

    assert caught.value.message == "the webhook did not answer"


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/x", "file:///etc/passwd", "127.0.0.1/echo"])
async def test_only_http_and_https_urls_are_called(url):
    with pytest.raises(ToolRunError) as caught:
        await call(url)

    assert caught.value.message == "webhook url must be http or https"
