"""A tenant's webhook url cannot reach inside the network the server runs in.

Every address a webhook name resolves to must be globally reachable by
IANA's special-purpose registries, or opened for that tool by a superuser
(``ServerTool.webhook_networks``) inside the operator's
OWLLAYER_WEBHOOK_ALLOWED_NETWORKS; the request then goes to that checked
address. The refusals below never connect anywhere: the resolver is a stub
and the HTTP transport fails the test if it is ever used. The only real
traffic goes to receivers on 127.0.0.1.
"""
from __future__ import annotations

import ipaddress
import logging
import socket
import threading

import httpx
import pytest
from django.core.exceptions import ValidationError

from approvals import webhook_addresses, webhooks
from approvals.models import ServerTool
from approvals.webhook_addresses import AllowedNetwork, parse_networks
from approvals.webhooks import (
    NO_ANSWER,
    NOT_ALLOWED,
    ToolRunError,
    address_allowed,
    call_webhook,
    tool_networks,
)
from tests.approvals.webhook_receiver import SECRET, Receiver
from tests.support.receiver import serving

LOOPBACK_ONLY = (ipaddress.ip_network("127.0.0.1/32"),)


async def call(url: str, *, timeout: float = 5.0, networks=None):
    return await call_webhook(
        url=url, secret=SECRET, tool="refund", arguments={"order": "A1001"},
        session_id="ses_acme", call_id="tc_1", timeout=timeout, max_bytes=4096,
        allowed_networks=networks,
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


# --- IANA's special-purpose registries, entry by entry ----------------------------

# (registry entry, an address inside it and in no more specific entry, allowed?)
IPV4_REGISTRY_CASES = [
    ("0.0.0.0/8", "0.1.2.3", False),
    ("0.0.0.0/32", "0.0.0.0", False),
    ("10.0.0.0/8", "10.1.2.3", False),
    ("100.64.0.0/10", "100.64.0.1", False),
    ("127.0.0.0/8", "127.0.0.1", False),
    ("169.254.0.0/16", "169.254.169.254", False),
    ("172.16.0.0/12", "172.16.0.5", False),
    ("192.0.0.0/24", "192.0.0.100", False),
    ("192.0.0.0/29", "192.0.0.1", False),
    ("192.0.0.8/32", "192.0.0.8", False),
    ("192.0.0.9/32", "192.0.0.9", True),
    ("192.0.0.10/32", "192.0.0.10", True),
    ("192.0.0.170/32", "192.0.0.170", False),
    ("192.0.0.171/32", "192.0.0.171", False),
    ("192.0.2.0/24", "192.0.2.1", False),
    ("192.31.196.0/24", "192.31.196.1", True),
    ("192.52.193.0/24", "192.52.193.1", True),
    ("192.88.99.0/24", "192.88.99.1", False),
    ("192.88.99.2/32", "192.88.99.2", True),
    ("192.168.0.0/16", "192.168.1.1", False),
    ("192.175.48.0/24", "192.175.48.1", True),
    ("198.18.0.0/15", "198.19.255.1", False),
    ("198.51.100.0/24", "198.51.100.1", False),
    ("203.0.113.0/24", "203.0.113.1", False),
    ("240.0.0.0/4", "240.0.0.1", False),
    ("255.255.255.255/32", "255.255.255.255", False),
]

IPV6_REGISTRY_CASES = [
    ("::1/128", "::1", False),
    ("::/128", "::", False),
    # Judged by the IPv4 address inside: a socket connects to that.
    ("::ffff:0:0/96", "::ffff:127.0.0.1", False),
    ("::ffff:0:0/96", "::ffff:10.0.0.1", False),
    ("::ffff:0:0/96", "::ffff:93.184.216.34", True),
    # NAT64, well-known prefix: the IPv4 address is the last 32 bits.
    ("64:ff9b::/96", "64:ff9b::7f00:1", False),
    ("64:ff9b::/96", "64:ff9b::a00:1", False),
    ("64:ff9b::/96", "64:ff9b::5db8:d822", True),
    # NAT64, local-use prefix: a translator inside the operator's network.
    ("64:ff9b:1::/48", "64:ff9b:1::5db8:d822", False),
    ("100::/64", "100::1", False),
    ("100:0:0:1::/64", "100:0:0:1::1", False),
    ("2001::/23", "2001:4::1", False),
    # Teredo: server 65.54.227.120 and client 93.184.216.34 / 10.0.0.1; server 127.0.0.1.
    ("2001::/32", "2001:0:4136:e378:8000:63bf:a247:27dd", True),
    ("2001::/32", "2001:0:4136:e378:8000:63bf:f5ff:fffe", False),
    ("2001::/32", "2001:0:7f00:1:8000:63bf:a247:27dd", False),
    ("2001:1::1/128", "2001:1::1", True),
    ("2001:1::2/128", "2001:1::2", True),
    ("2001:1::3/128", "2001:1::3", True),
    ("2001:2::/48", "2001:2::1", False),
    ("2001:3::/32", "2001:3::1", True),
    ("2001:4:112::/48", "2001:4:112::1", True),
    ("2001:10::/28", "2001:10::1", False),
    ("2001:20::/28", "2001:20::1", True),
    ("2001:30::/28", "2001:30::1", True),
    ("2001:db8::/32", "2001:db8::1", False),
    # 6to4: the IPv4 address is in bits 16-47.
    ("2002::/16", "2002:7f00:1::1", False),
    ("2002::/16", "2002:c0a8:101::1", False),
    ("2002::/16", "2002:5db8:d822::1", True),
    ("2620:4f:8000::/48", "2620:4f:8000::1", True),
    ("3fff::/20", "3fff::1", False),
    ("5f00::/16", "5f00::1", False),
    ("fc00::/7", "fd12:3456::1", False),
    ("fe80::/10", "fe80::1", False),
]

OUTSIDE_THE_REGISTRIES = [
    ("IPv4 multicast", "224.0.0.1", False),
    ("IPv4 multicast", "239.255.255.250", False),
    ("IPv6 multicast", "ff02::1", False),
    ("IPv6 outside 2000::/3", "4000::1", False),
    ("IPv4-compatible (judged by its IPv4 address)", "::127.0.0.1", False),
    ("IPv4-compatible (judged by its IPv4 address)", "::93.184.216.34", True),
    ("public", "93.184.216.34", True),
    ("public", "8.8.8.8", True),
    ("public", "1.1.1.1", True),
    ("public", "2606:4700::1111", True),
    ("public", "2a00:1450:4001:80b::200e", True),
]


@pytest.mark.parametrize(
    "entry, address, allowed", IPV4_REGISTRY_CASES + IPV6_REGISTRY_CASES + OUTSIDE_THE_REGISTRIES,
    ids=[f"{entry} {address}" for entry, address, _ in
         IPV4_REGISTRY_CASES + IPV6_REGISTRY_CASES + OUTSIDE_THE_REGISTRIES],
)
def test_each_registry_entry_gives_its_verdict(entry, address, allowed):
    assert webhook_addresses.address_allowed(ipaddress.ip_address(address), port=443) is allowed


def test_every_entry_of_both_registries_is_named_by_a_case_above():
    cases = IPV4_REGISTRY_CASES + IPV6_REGISTRY_CASES
    for entry in webhook_addresses.IPV4_SPECIAL + webhook_addresses.IPV6_SPECIAL:
        addresses = [ipaddress.ip_address(a) for name, a, _ in cases if name == str(entry.network)]
        assert addresses, f"no case for {entry.network} ({entry.name})"
        for address in addresses:
            # The case sits in this entry, not in a more specific one.
            assert webhook_addresses.registry_entry(address) == entry, (entry, address)


def test_an_entry_the_registry_calls_reachable_inside_one_it_does_not_is_allowed():
    assert not webhook_addresses.is_public(ipaddress.ip_address("192.0.0.100"))
    assert webhook_addresses.is_public(ipaddress.ip_address("192.0.0.9"))
    assert not webhook_addresses.is_public(ipaddress.ip_address("2001:4::1"))
    assert webhook_addresses.is_public(ipaddress.ip_address("2001:1::1"))


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
    "http://192.0.0.8/hook",
    "http://192.0.0.170/hook",
    "http://[64:ff9b::7f00:1]/hook",
    "http://[64:ff9b:1::5db8:d822]/hook",
    "http://[2002:7f00:1::1]/hook",
    "http://[5f00::1]/hook",
    "http://[3fff::1]/hook",
    "http://[100:0:0:1::1]/hook",
])
async def test_a_webhook_to_an_internal_address_is_refused_before_any_connection(
    nothing_allowed, no_connection, url
):
    with pytest.raises(ToolRunError) as caught:
        await call(url)

    assert caught.value.message == NOT_ALLOWED
    assert no_connection == []


async def test_a_refused_address_is_logged_once_naming_the_session_and_the_tool(
    nothing_allowed, no_connection, caplog
):
    caplog.set_level(logging.WARNING, logger="approvals.webhooks")

    with pytest.raises(ToolRunError):
        await call("http://127.0.0.1/hook")

    assert [r.getMessage() for r in caplog.records if r.name == "approvals.webhooks"] == [
        "session ses_acme: webhook tool refund: address not allowed"]


async def test_a_name_that_resolves_to_loopback_is_refused_before_any_connection(
    nothing_allowed, no_connection, dns
):
    dns["hooks.shop.test"] = ["127.0.0.1"]

    with pytest.raises(ToolRunError) as caught:
        await call("https://hooks.shop.test/refund")

    assert caught.value.message == NOT_ALLOWED
    assert dns["lookups"] == ["hooks.shop.test"]
    assert no_connection == []


async def test_a_name_that_resolves_to_a_nat64_address_of_loopback_is_refused(
    nothing_allowed, no_connection, dns
):
    dns["hooks.shop.test"] = ["64:ff9b::7f00:1"]

    with pytest.raises(ToolRunError) as caught:
        await call("https://hooks.shop.test/refund")

    assert caught.value.message == NOT_ALLOWED
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


@pytest.mark.parametrize("url, address, pinned", [
    ("https://hooks.shop.test/refund?order=A1", "203.0.113.5",
     ("https://203.0.113.5/refund?order=A1", "hooks.shop.test", "hooks.shop.test")),
    ("http://hooks.shop.test", "203.0.113.5",
     ("http://203.0.113.5/", "hooks.shop.test", "hooks.shop.test")),
    # A scheme's own port may be written out; the pinned url leaves it implied.
    ("http://hooks.shop.test:80/refund", "203.0.113.5",
     ("http://203.0.113.5/refund", "hooks.shop.test:80", "hooks.shop.test")),
    ("https://hooks.shop.test:443/refund", "203.0.113.5",
     ("https://203.0.113.5/refund", "hooks.shop.test:443", "hooks.shop.test")),
    # The other scheme's port is an ordinary port: kept.
    ("https://hooks.shop.test:80/refund", "203.0.113.5",
     ("https://203.0.113.5:80/refund", "hooks.shop.test:80", "hooks.shop.test")),
    ("http://hooks.shop.test:443/refund", "203.0.113.5",
     ("http://203.0.113.5:443/refund", "hooks.shop.test:443", "hooks.shop.test")),
    ("https://hooks.shop.test/refund", "2001:db8::5",
     ("https://[2001:db8::5]/refund", "hooks.shop.test", "hooks.shop.test")),
    ("http://hooks.shop.test:8080/refund", "2001:db8::5",
     ("http://[2001:db8::5]:8080/refund", "hooks.shop.test:8080", "hooks.shop.test")),
    # Credentials in the url never reach the Host header, even with an @ in them.
    ("https://bot:p@ss@hooks.shop.test:8443/refund#part", "203.0.113.5",
     ("https://203.0.113.5:8443/refund", "hooks.shop.test:8443", "hooks.shop.test")),
], ids=["https", "http-bare", "http-own-port", "https-own-port", "https-on-80", "http-on-443",
        "ipv6", "ipv6-port", "credentials"])
def test_a_webhook_goes_to_the_checked_address_with_the_urls_port_path_and_host_name(
    url, address, pinned
):
    """(the url connected to, the Host header, the name the certificate must carry)"""
    assert webhooks._pinned(url, ipaddress.ip_address(address)) == pinned


# --- a tool's own networks ------------------------------------------------------


def make_webhook_tool(tenant, name: str, url: str, networks: str = "") -> ServerTool:
    tool = ServerTool(tenant=tenant, name=name, description="Refund an order", kind="webhook",
                      webhook_url=url, webhook_secret=SECRET, webhook_networks=networks)
    tool.full_clean()
    tool.save()
    return tool


async def call_as(tool: ServerTool, path: str = "/echo"):
    """The tool's webhook with the networks its row opens."""
    return await call_webhook(
        url=tool.webhook_url + path, secret=tool.webhook_secret, tool=tool.name,
        arguments={"order": "A1001"}, session_id="ses_acme", call_id="tc_1",
        timeout=5.0, max_bytes=4096, allowed_networks=tool_networks(tool.webhook_networks),
    )


@pytest.fixture
def second_receiver():
    """Another receiver on another port of 127.0.0.1 (same handler, same record)."""
    with serving(Receiver) as url:
        yield url


@pytest.mark.django_db(transaction=True)
async def test_a_tool_opened_to_one_local_port_reaches_it_and_not_another_port(
    settings, acme, receiver, second_receiver
):
    settings.OWLLAYER_WEBHOOK_ALLOWED_NETWORKS = LOOPBACK_ONLY
    port = receiver.rsplit(":", 1)[1]
    opened = await ServerTool.objects.acreate(
        tenant=acme, name="refund", kind="webhook", webhook_url=receiver,
        webhook_secret=SECRET, webhook_networks=f"127.0.0.1/32:{port}")
    elsewhere = await ServerTool.objects.acreate(
        tenant=acme, name="refund_elsewhere", kind="webhook", webhook_url=second_receiver,
        webhook_secret=SECRET, webhook_networks=f"127.0.0.1/32:{port}")

    answer = await call_as(opened)
    with pytest.raises(ToolRunError) as caught:
        await call_as(elsewhere)

    assert answer["ok"] is True
    assert caught.value.message == NOT_ALLOWED
    assert [r["host"] for r in Receiver.received] == [f"127.0.0.1:{port}"]


@pytest.mark.parametrize("scheme, opened, allowed", [
    ("https", 443, True), ("https", 80, False), ("http", 80, True), ("http", 443, False),
])
async def test_a_url_without_a_port_is_checked_against_its_schemes_own_port(
    settings, scheme, opened, allowed
):
    settings.OWLLAYER_WEBHOOK_ALLOWED_NETWORKS = LOOPBACK_ONLY

    try:
        await call(f"{scheme}://127.0.0.1/refund", timeout=2.0,
                   networks=tool_networks(f"127.0.0.1/32:{opened}"))
        refusal = None
    except ToolRunError as exc:
        refusal = exc.message

    # Allowed: whatever listens there (usually nothing) answers; never the refusal.
    assert (refusal != NOT_ALLOWED) is allowed


@pytest.mark.django_db(transaction=True)
async def test_another_tool_of_the_same_tenant_without_networks_is_refused(
    settings, acme, receiver
):
    settings.OWLLAYER_WEBHOOK_ALLOWED_NETWORKS = LOOPBACK_ONLY
    port = receiver.rsplit(":", 1)[1]
    await ServerTool.objects.acreate(
        tenant=acme, name="refund", kind="webhook", webhook_url=receiver,
        webhook_secret=SECRET, webhook_networks=f"127.0.0.1/32:{port}")
    plain = await ServerTool.objects.acreate(
        tenant=acme, name="order_status", kind="webhook", webhook_url=receiver,
        webhook_secret=SECRET)

    with pytest.raises(ToolRunError) as caught:
        await call_as(plain)

    assert caught.value.message == NOT_ALLOWED
    assert Receiver.received == []


@pytest.mark.django_db(transaction=True)
async def test_a_tools_networks_open_nothing_outside_the_operators_ceiling(
    settings, acme, receiver
):
    port = receiver.rsplit(":", 1)[1]
    tool = await ServerTool.objects.acreate(
        tenant=acme, name="refund", kind="webhook", webhook_url=receiver,
        webhook_secret=SECRET, webhook_networks=f"127.0.0.1/32:{port}")
    settings.OWLLAYER_WEBHOOK_ALLOWED_NETWORKS = (ipaddress.ip_network("10.0.0.0/8"),)

    with pytest.raises(ToolRunError) as caught:
        await call_as(tool)

    assert caught.value.message == NOT_ALLOWED
    assert Receiver.received == []


def test_an_opened_network_applies_to_the_ipv4_address_a_mapped_or_nat64_one_stands_for(settings):
    settings.OWLLAYER_WEBHOOK_ALLOWED_NETWORKS = (ipaddress.ip_network("10.0.0.0/8"),)
    tool = parse_networks("10.20.0.0/16:8443")

    assert address_allowed(ipaddress.ip_address("::ffff:10.20.0.7"), port=8443, networks=tool)
    assert address_allowed(ipaddress.ip_address("64:ff9b::a14:7"), port=8443, networks=tool)
    assert not address_allowed(ipaddress.ip_address("::ffff:10.20.0.7"), port=443, networks=tool)
    assert not address_allowed(ipaddress.ip_address("::ffff:10.21.0.7"), port=8443, networks=tool)


def test_opening_a_local_nat64_translator_does_not_open_the_private_networks_behind_it(settings):
    settings.OWLLAYER_WEBHOOK_ALLOWED_NETWORKS = (ipaddress.ip_network("64:ff9b:1::/48"),)
    tool = parse_networks("64:ff9b:1::/96")

    assert address_allowed(ipaddress.ip_address("64:ff9b:1::5db8:d822"), port=443, networks=tool)
    assert not address_allowed(ipaddress.ip_address("64:ff9b:1::a00:1"), port=443, networks=tool)
    assert not address_allowed(ipaddress.ip_address("64:ff9b:1::5db8:d822"), port=443)


@pytest.mark.parametrize("text, entries", [
    ("", ()),
    ("10.20.0.0/16", (AllowedNetwork(ipaddress.ip_network("10.20.0.0/16")),)),
    ("10.20.0.7", (AllowedNetwork(ipaddress.ip_network("10.20.0.7/32")),)),
    ("127.0.0.1/32:8080,8443",
     (AllowedNetwork(ipaddress.ip_network("127.0.0.1/32"), frozenset({8080, 8443})),)),
    ("fd00:1::/64", (AllowedNetwork(ipaddress.ip_network("fd00:1::/64")),)),
    ("[fd00:1::/64]:443\n10.0.0.0/8",
     (AllowedNetwork(ipaddress.ip_network("fd00:1::/64"), frozenset({443})),
      AllowedNetwork(ipaddress.ip_network("10.0.0.0/8")))),
])
def test_a_tools_networks_are_written_one_per_line_with_optional_ports(text, entries):
    assert parse_networks(text) == entries


@pytest.mark.parametrize("text, says", [
    ("10.0.0.1/8", "host bits"),
    ("10.0.0.0/8:0", "not a port"),
    ("10.0.0.0/8:65536", "not a port"),
    ("10.0.0.0/8:http", "not a port"),
    ("fd00::/64:443", "not a network"),
    ("[fd00::/64]443", "write an IPv6 network with ports as"),
    ("64:ff9b:1::/64", "/96 or longer"),
    ("intranet", "not a network"),
])
def test_a_tools_networks_that_do_not_parse_are_refused_with_the_entry_named(text, says):
    with pytest.raises(ValueError) as caught:
        parse_networks(text)

    assert says in str(caught.value)
    assert repr(text) in str(caught.value)


@pytest.mark.django_db
def test_a_tool_cannot_be_saved_with_networks_outside_the_ceiling(settings, acme):
    settings.OWLLAYER_WEBHOOK_ALLOWED_NETWORKS = (ipaddress.ip_network("10.20.0.0/16"),)

    make_webhook_tool(acme, "inside", "http://10.20.0.7/hook", "10.20.0.0/24:8443")
    with pytest.raises(ValidationError) as caught:
        make_webhook_tool(acme, "outside", "http://10.30.0.7/hook", "10.30.0.0/24")

    assert "OWLLAYER_WEBHOOK_ALLOWED_NETWORKS" in str(caught.value)
    assert "10.30.0.0/24" in str(caught.value)


def test_networks_written_around_the_form_that_do_not_parse_open_nothing():
    assert tool_networks("127.0.0.1/32:notaport") == ()


# --- who may set a tool's networks --------------------------------------------------


def _admin_form_post(tenant, **fields) -> dict:
    return {
        "tenant": str(tenant.pk), "name": "refund", "description": "Refund an order",
        "kind": "webhook", "webhook_url": "http://10.20.0.7:8443/refund", "timeout_seconds": "5",
        "python_handler": "", "parameters": "", "risk": "high", "approval_policy": "operator",
        "enabled": "on", **fields,
    }


@pytest.mark.django_db
def test_a_tenant_owner_neither_sees_nor_sets_a_tools_networks(settings, acme, olivia):
    from django.test import Client
    from django.urls import reverse

    settings.OWLLAYER_WEBHOOK_ALLOWED_NETWORKS = (ipaddress.ip_network("10.20.0.0/16"),)
    client = Client()
    client.force_login(olivia)

    form_page = client.get(reverse("admin:approvals_servertool_add"))
    client.post(reverse("admin:approvals_servertool_add"),
                _admin_form_post(acme, webhook_networks="10.20.0.0/16"))

    assert form_page.status_code == 200
    assert "webhook_networks" not in form_page.content.decode()
    tool = ServerTool.objects.get(tenant=acme, name="refund")
    assert tool.webhook_networks == ""
    edit_page = client.get(reverse("admin:approvals_servertool_change", args=[tool.pk]))
    client.post(reverse("admin:approvals_servertool_change", args=[tool.pk]),
                _admin_form_post(acme, webhook_networks="10.20.0.0/16"))
    assert "webhook_networks" not in edit_page.content.decode()
    tool.refresh_from_db()
    assert tool.webhook_networks == ""


@pytest.mark.django_db
def test_the_server_tool_form_built_for_a_tenant_owner_has_no_networks_field(olivia, root):
    from django.contrib import admin
    from django.test import RequestFactory

    tool_admin = admin.site._registry[ServerTool]
    request = RequestFactory().get("/")

    request.user = olivia
    owners_form = tool_admin.get_form(request, fields=None)  # the form's own field list
    request.user = root
    superusers_form = tool_admin.get_form(request, fields=None)

    assert "webhook_networks" not in owners_form.base_fields
    assert "webhook_networks" in superusers_form.base_fields


@pytest.mark.django_db
def test_a_superuser_is_offered_a_tools_networks(acme, root):
    from django.test import Client
    from django.urls import reverse

    client = Client()
    client.force_login(root)

    page = client.get(reverse("admin:approvals_servertool_add"))

    assert 'name="webhook_networks"' in page.content.decode()


# --- what the environment may not change ------------------------------------------


class ProxyListener:
    """A TCP listener standing in for a proxy: records every connection."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.1)
        self.connections: list[tuple[str, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = self.sock.accept()
            except TimeoutError:
                continue
            self.connections.append(peer)
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
                   "all_proxy")


async def test_proxy_variables_in_the_environment_are_never_used(monkeypatch, settings, receiver):
    settings.OWLLAYER_WEBHOOK_ALLOWED_NETWORKS = LOOPBACK_ONLY
    proxy = ProxyListener()
    try:
        for name in PROXY_VARIABLES:
            monkeypatch.setenv(name, proxy.url)
        # A NO_PROXY that does not name the receiver: the proxy would be used.
        monkeypatch.setenv("NO_PROXY", "elsewhere.test")
        monkeypatch.setenv("no_proxy", "elsewhere.test")

        answer = await call(receiver + "/echo")
    finally:
        proxy.close()

    assert proxy.connections == []
    assert answer["ok"] is True
    assert [r["path"] for r in Receiver.received] == ["/echo"]


def test_the_tls_context_is_made_once_per_ca_file():
    assert webhooks._tls_context("") is webhooks._tls_context("")
