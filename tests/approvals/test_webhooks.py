"""Webhook tools against a real HTTP(S) server on 127.0.0.1."""
from __future__ import annotations

import asyncio
import logging
import socket

import httpx
import pytest

from approvals import webhooks
from approvals.webhooks import NO_ANSWER, ToolRunError, call_webhook, sign
from runtime.config import config
from tests.approvals.webhook_receiver import (
    MAX_AGE_SECONDS,
    SECRET,
    Receiver,
    start_receiver,
    stop_receiver,
)
from tests.support.certificates import CertificateAuthority, server_context


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


async def test_the_call_is_posted_as_compact_utf8_json_naming_its_type_and_the_server(receiver):
    await call_webhook(
        url=receiver + "/echo", secret=SECRET, tool="refund",
        arguments={"note": "Café – 5 €"}, session_id="ses_acme", call_id="tc_1",
        timeout=5.0, max_bytes=4096,
    )

    (request,) = Receiver.received
    assert request["raw_body"] == (
        '{"tool":"refund","arguments":{"note":"Café – 5 €"},'
        '"sessionId":"ses_acme","callId":"tc_1"}'
    ).encode()
    assert request["headers"]["Content-Type"] == "application/json"
    assert request["headers"]["User-Agent"] == f"OwlLayer/{config().protocol.server_version}"
    assert request["genuine"] is True


async def test_without_a_limit_of_its_own_a_call_is_held_to_the_configured_answer_size(
    receiver, settings
):
    settings.OWLLAYER_WEBHOOK_MAX_BYTES = 4096

    with pytest.raises(ToolRunError) as caught:
        await call_webhook(
            url=receiver + "/huge-declared", secret=SECRET, tool="refund", arguments={},
            session_id="ses_acme", call_id="tc_1", timeout=5.0,
        )

    assert caught.value.message == "response too large"


async def test_an_answer_dripped_past_the_tools_timeout_did_not_answer(receiver):
    # Each byte comes well within the timeout; the whole answer does not.
    with pytest.raises(ToolRunError) as caught:
        await call(receiver + "/drip", timeout=1.0)

    assert caught.value.message == NO_ANSWER


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


async def test_an_answer_with_no_content_is_a_result_of_none(receiver):
    assert await call(receiver + "/no-content") is None


async def test_an_empty_answer_other_than_no_content_is_not_json(receiver):
    with pytest.raises(ToolRunError) as caught:
        await call(receiver + "/empty")

    assert caught.value.message == "webhook returned invalid JSON"


async def test_any_status_outside_2xx_is_refused_even_with_a_json_body(receiver):
    with pytest.raises(ToolRunError) as caught:
        await call(receiver + "/multiple-choices")

    assert caught.value.message == "webhook answered 300"


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


async def test_an_unreachable_webhook_is_reported_and_logged_naming_the_session_and_the_tool(
    caplog
):
    caplog.set_level(logging.WARNING, logger="approvals.webhooks")
    # A bound socket that never listens holds the port and refuses connections.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        with pytest.raises(ToolRunError) as caught:
            await call(f"http://127.0.0.1:{closed.getsockname()[1]}/echo")

    assert caught.value.message == "the webhook did not answer"
    assert [r.getMessage() for r in caplog.records if r.name == "approvals.webhooks"] == [
        "session ses_acme: webhook tool refund did not answer: ConnectError"]


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/x", "file:///etc/passwd", "127.0.0.1/echo"])
async def test_only_http_and_https_urls_are_called(url):
    with pytest.raises(ToolRunError) as caught:
        await call(url)

    assert caught.value.message == "webhook url must be http or https"


# --- the signed timestamp -------------------------------------------------------


async def test_the_signed_timestamp_is_the_time_the_request_was_sent(receiver):
    await call(receiver + "/echo")

    (request,) = Receiver.received
    sent_at = int(request["headers"]["X-OwlLayer-Timestamp"])
    # The task asks for "within a few seconds": a request signed before a slow
    # name lookup, or with a stale clock, would be further off.
    assert abs(request["arrived"] - sent_at) <= 5
    assert request["signed"] is True and request["genuine"] is True


def _replay(url: str, request: dict) -> httpx.Response:
    """The same bytes and headers again, as someone who recorded them would send."""
    headers = {name: value for name, value in request["headers"].items()
               if name.lower() in ("content-type", "x-owllayer-timestamp", "x-owllayer-signature")}
    return httpx.post(url, content=request["raw_body"], headers=headers, trust_env=False)


async def test_the_documented_receiver_refuses_a_request_replayed_after_its_window(receiver):
    await call(receiver + "/echo")
    (original,) = Receiver.received

    Receiver.clock_offset = MAX_AGE_SECONDS + 60
    replayed = await asyncio.to_thread(_replay, receiver + "/echo", original)

    assert replayed.status_code == 401
    assert Receiver.received[1]["signed"] is True  # the signature alone still matches
    assert Receiver.received[1]["genuine"] is False


async def test_the_documented_receiver_accepts_a_fresh_request_and_refuses_a_forged_timestamp(receiver):
    await call(receiver + "/echo")
    (original,) = Receiver.received
    later = str(int(original["headers"]["X-OwlLayer-Timestamp"]) + 1)
    forged = {**original, "headers": {**original["headers"], "X-OwlLayer-Timestamp": later}}

    fresh = await asyncio.to_thread(_replay, receiver + "/echo", original)
    moved = await asyncio.to_thread(_replay, receiver + "/echo", forged)

    assert fresh.status_code == 200
    assert moved.status_code == 401  # a new timestamp breaks the signature


# --- https: the certificate is checked for the url's name -----------------------

WEBHOOK_NAME = "webhook.test"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A private CA with certificates for webhook.test and for another name, and
    a second CA nobody trusts with a certificate for webhook.test."""
    directory = tmp_path_factory.mktemp("pki")
    trusted = CertificateAuthority.create("Shop Private CA")
    untrusted = CertificateAuthority.create("Unknown CA")
    return {
        "ca_file": trusted.write(directory),
        "right_name": trusted.issue(directory, WEBHOOK_NAME),
        "other_name": trusted.issue(directory, "other.test"),
        "unknown_ca": untrusted.issue(directory, WEBHOOK_NAME),
    }


@pytest.fixture
def tls_receiver(request, pki, monkeypatch, settings):
    """An https receiver on 127.0.0.1 presenting the certificate named by the
    test's parameter; webhook.test resolves to 127.0.0.1 through the stub
    resolver, and the CA setting names the private CA."""
    settings.OWLLAYER_WEBHOOK_CA_FILE = str(pki["ca_file"])

    async def resolve(host: str, port: int) -> list[str]:
        if host != WEBHOOK_NAME:
            raise socket.gaierror(socket.EAI_NONAME, "unknown name")
        return ["127.0.0.1"]

    monkeypatch.setattr(webhooks, "resolve", resolve)
    server, thread = start_receiver(tls=server_context(*pki[request.param]))
    try:
        yield f"https://{WEBHOOK_NAME}:{server.server_address[1]}"
    finally:
        stop_receiver(server, thread)


@pytest.mark.parametrize("tls_receiver", ["right_name"], indirect=True)
async def test_an_https_webhook_with_a_certificate_for_its_name_from_the_configured_ca_answers(
    tls_receiver
):
    answer = await call(tls_receiver + "/echo")

    assert answer["ok"] is True
    assert Receiver.received[0]["host"] == tls_receiver.removeprefix("https://")


@pytest.mark.parametrize("tls_receiver", ["other_name"], indirect=True)
async def test_an_https_webhook_whose_certificate_names_another_host_did_not_answer(
    tls_receiver, caplog
):
    with pytest.raises(ToolRunError) as caught:
        await call(tls_receiver + "/echo")

    assert caught.value.message == NO_ANSWER
    assert Receiver.received == []
    assert "certificate not accepted" in caplog.text


@pytest.mark.parametrize("tls_receiver", ["unknown_ca"], indirect=True)
async def test_an_https_webhook_whose_certificate_comes_from_an_untrusted_ca_did_not_answer(
    tls_receiver, caplog
):
    with pytest.raises(ToolRunError) as caught:
        await call(tls_receiver + "/echo")

    assert caught.value.message == NO_ANSWER
    assert Receiver.received == []
    assert "certificate not accepted" in caplog.text


@pytest.mark.parametrize("tls_receiver", ["right_name"], indirect=True)
async def test_without_the_ca_setting_a_private_certificate_is_not_trusted(tls_receiver, settings):
    settings.OWLLAYER_WEBHOOK_CA_FILE = ""

    with pytest.raises(ToolRunError) as caught:
        await call(tls_receiver + "/echo")

    assert caught.value.message == NO_ANSWER
    assert Receiver.received == []


@pytest.mark.parametrize("tls_receiver", ["right_name"], indirect=True)
async def test_ssl_cert_file_in_the_environment_does_not_make_webhooks_trust_a_ca(
    tls_receiver, settings, monkeypatch, pki
):
    settings.OWLLAYER_WEBHOOK_CA_FILE = ""
    monkeypatch.setenv("SSL_CERT_FILE", str(pki["ca_file"]))
    webhooks._tls_context.cache_clear()  # made anew while the variable is set

    try:
        with pytest.raises(ToolRunError) as caught:
            await call(tls_receiver + "/echo")
    finally:
        webhooks._tls_context.cache_clear()

    assert caught.value.message == NO_ANSWER
