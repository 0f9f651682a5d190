"""A tenant's webhook url cannot reach inside the network the server runs in.

Every address a webhook name resolves to must be public, or inside the
operator's OWLLAYER_WEBHOOK_ALLOWED_NETWORKS; the request then goes to that
checked address. The refusals below never connect anywhere: the resolver is
a stub and the HTTP transport fails the test if it is ever used. The only
real traffic goes to a receiver on 127.0.0.1, through the allow-list.
"""
from __future__ import annotations

import ipaddress
import socket

import httpx
import pytest

from approvals import webhooks
from approvals.webhooks import NO_ANSWER, NOT_ALLOWED, ToolRunError, address_allowed, call_webhook
from tests.approvals.webhook_receiver import SECRET, Receiver

LOOPBACK_ONLY = (ipaddress.ip_network("127.0.0.1/32"),)


async def call(url: str, *, timeout: float = 5.0):
    return await call_webhook(
        url=url, secret=SECRET, tool="refund", arguments={"order": "A1001"},
        session_id="ses_acme", call_id="tc_1", timeout=timeout, max_bytes=4096,
    )


@pytest.fixture
def no_connection(monkeypatch):
    """Fails the test if an HTTP request leaves the process; records names looked up."""
    attempts: list[str] = []

    async def refuse_to_send(self, request):
        attempts.append(str(request.url))
        raise AssertionError(f"a connection was attempted to {request.url}")

    monkeypatch.setattr(httpx.AsyncHTTPTransport, "handle_async_request", refuse_to_send)
    return attempts


@pytest.fixture
def dns(monkeypatch):
    """A stub resolver: name -> addresses; records every lookup."""
    table: dict[str, list[str]] = {}
    lookups: list[str] = []

    async def resolve(host: str, port: int) -> list[str]:
        lookups.append(host)
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "unknown name")
        return table[host]

    monkeypatch.setattr(webhooks, "resolve", resolve)
    table["lookups"] = lookups  # type: ignore[assignment]
    return table


@pytest.fixture
def nothing_allowed(settings):
    settings.OWLLAYER_WEBHOOK_ALLOWED_NETWORKS = ()


@pytest.mark.parametrize("url", [
    "http://10.0.0.1/hook",
    "http://169.254.169.254/latest/meta-data/",
    "http://127.0.0.1:8000/admin/",
    "http://[::1]/hook",
    "http://[::ffff:127.0.0.1]/hook",
    "http://192.168.1.1/hook",
    "http://172.16.0.5/hook",
    "http://100.64.0.1/hook",
    "http://0.0.0.0/hook",
    "http://224.0.0.1/hook",
    "http://240.0.0.1/hook",
    "http://[fe80::1]/hook",
    "http://[fc00::1]/hook",
])
async def test_a_webhook_to_an_internal_address_is_refused_before_any_connection(
    nothing_allowed, no_connection, url
):
    with pytest.raises(ToolRunError) as caught:
        await call(url)

    assert caught.value.message == NOT_ALLOWED
    assert no_connection == []


async def test_a_name_that_resolves_to_loopback_is_refused_before_any_connection(
    nothing_allowed, no_connection, dns
):
    dns["hooks.shop.test"] = ["127.0.0.1"]

    with pytest.raises(ToolRunError) as caught:
        await call("https://hooks.shop.test/refund")

    assert caught.value.message == NOT_ALLOWED
    assert dns["lookups"] == ["hooks.shop.test"]
    assert no_connection == []


async def test_a_name_with_one_private_address_among_public_ones_is_refused(
    nothing_allowed, no_connection, dns
):
    dns["mixed.shop.test"] = ["93.184.216.34", "10.1.2.3"]

    with pytest.raises(ToolRunError) as caught:
        await call("https://mixed.shop.test/refund")

    assert caught.value.message == NOT_ALLOWED
    assert no_connection == []


async def test_a_name_that_does_not_resolve_gets_the_same_answer_as_a_closed_port(
    nothing_allowed, no_connection, dns
):
    with pytest.raises(ToolRunError) as caught:
        await call("https://nowhere.shop.test/refund")

    assert caught.value.message == NO_ANSWER
    assert no_connection == []


async def test_a_closed_port_and_a_silent_server_give_one_answer_that_maps_nothing(receiver):
    # A bound socket that never listens refuses; the receiver's /slow never answers.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        with pytest.raises(ToolRunError) as refused:
            await call(f"http://127.0.0.1:{port}/echo")
    with pytest.raises(ToolRunError) as silent:
        await call(receiver + "/slow", timeout=1.0)

    assert refused.value.message == silent.value.message == NO_ANSWER
    assert str(port) not in refused.value.message


async def test_an_allowed_network_lets_the_operator_reach_an_internal_receiver(settings, receiver):
    settings.OWLLAYER_WEBHOOK_ALLOWED_NETWORKS = LOOPBACK_ONLY

    answer = await call(receiver + "/echo")

    assert answer["ok"] is True


async def test_the_request_goes_to_the_checked_address_with_the_original_host_header(
    settings, receiver, dns
):
    settings.OWLLAYER_WEBHOOK_ALLOWED_NETWORKS = LOOPBACK_ONLY
    port = receiver.rsplit(":", 1)[1]
    # Resolvable only through the stub: reaching the receiver proves the
    # connection used the checked address, not a second lookup.
    dns["hooks.shop.test"] = ["127.0.0.1"]

    answer = await call(f"http://hooks.shop.test:{port}/echo")

    assert answer["ok"] is True
    assert dns["lookups"] == ["hooks.shop.test"]
    assert Receiver.received[0]["host"] == f"hooks.shop.test:{port}"


async def test_an_allow_list_opens_only_its_own_networks(settings, no_connection):
    settings.OWLLAYER_WEBHOOK_ALLOWED_NETWORKS = LOOPBACK_ONLY

    with pytest.raises(ToolRunError) as caught:
        await call("http://127.0.0.2/hook")

    assert caught.value.message == NOT_ALLOWED
    assert no_connection == []


def test_public_addresses_are_allowed_and_internal_ones_are_not():
    assert address_allowed(ipaddress.ip_address("93.184.216.34"), ())
    assert address_allowed(ipaddress.ip_address("2606:4700::1111"), ())
    assert not address_allowed(ipaddress.ip_address("169.254.169.254"), ())
    assert not address_allowed(ipaddress.ip_address("::ffff:10.0.0.1"), ())
    assert address_allowed(ipaddress.ip_address("10.0.0.1"), (ipaddress.ip_network("10.0.0.0/8"),))
