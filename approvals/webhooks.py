"""Calling a tenant's webhook tool: a signed JSON POST with a bounded answer.

The receiver checks ``X-OwlLayer-Signature`` = ``sha256=`` + hex HMAC-SHA256,
under the tool's secret, of ``f"{timestamp}.{body}"`` where timestamp is the
``X-OwlLayer-Timestamp`` header (unix seconds, taken as the request is
sent) and body the raw request bytes; signing the timestamp lets it refuse
replays of an old request.

A tenant chooses the url, so the server must not become their way into the
network it runs in: the name is resolved here, every address it resolves to
must be allowed (``approvals.webhook_addresses``: public by IANA's
registries, or opened for this tool by a superuser inside the operator's
``OWLLAYER_WEBHOOK_ALLOWED_NETWORKS``), and the request then goes to the
checked address itself, with the original Host header and TLS server name
(the certificate is verified for that name), so a second DNS answer cannot
swap it. No proxy from the environment is used. The errors say what failed
("the webhook address is not allowed", "the webhook did not answer"), never
which port was closed, how a connection failed or that a certificate was
refused.

Inside a turn's trace (``runtime.tracing``) the call is a span ``webhook``,
and the request carries its W3C ``traceparent``: the receiver's own spans
join the turn's trace.
"""
from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import ipaddress
import json
import logging
import socket
import ssl
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import certifi
import httpx

from approvals import webhook_addresses
from approvals.webhook_addresses import AllowedNetwork, IPAddress
from runtime import tracing
from runtime.config import config

logger = logging.getLogger(__name__)

TIMESTAMP_HEADER = "X-OwlLayer-Timestamp"
SIGNATURE_HEADER = "X-OwlLayer-Signature"


class ToolRunError(Exception):
    """A server tool could not produce a result; the message goes to the model."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The signature header value for one request."""
    signed = timestamp.encode("ascii") + b"." + body
    return "sha256=" + hmac.new(secret.encode("utf-8"), signed, hashlib.sha256).hexdigest()


NOT_ALLOWED = "the webhook address is not allowed"
NO_ANSWER = "the webhook did not answer"


def check_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ToolRunError("webhook url must be http or https")
    try:
        _ = parts.port  # the port is only checked when read
    except ValueError:
        raise ToolRunError("webhook url must be http or https") from None


def address_allowed(address: IPAddress, *, port: int,
                    networks: Sequence[AllowedNetwork] = ()) -> bool:
    """Public by IANA's registries, or opened by the tool's ``networks`` (on
    that port) inside the operator's OWLLAYER_WEBHOOK_ALLOWED_NETWORKS."""
    return webhook_addresses.address_allowed(
        address, port=port, networks=networks,
        ceiling=config().webhooks.allowed_networks,
    )


def tool_networks(text: str) -> tuple[AllowedNetwork, ...]:
    """A server tool's ``webhook_networks`` as it is used: an entry that does
    not parse (the row was written around the form) opens nothing."""
    try:
        return webhook_addresses.parse_networks(text or "")
    except ValueError:
        logger.warning("a server tool's webhook networks do not parse; none are opened")
        return ()


async def resolve(host: str, port: int) -> list[str]:
    """Every address the name resolves to (tests replace this)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [info[4][0] for info in infos]


async def checked_address(host: str, port: int,
                          networks: Sequence[AllowedNetwork] = ()) -> IPAddress:
    """The address to connect to; ToolRunError unless every address the name
    has is allowed (a name with one private address among public ones could
    be steered to it)."""
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        pass  # a name, not an address literal
    else:
        return _allowed_or_refuse([literal], port, networks)
    try:
        found = await resolve(host, port)
        addresses = [ipaddress.ip_address(a.split("%", 1)[0]) for a in found]
    except (OSError, ValueError, UnicodeError):
        raise ToolRunError(NO_ANSWER) from None
    if not addresses:
        raise ToolRunError(NO_ANSWER)
    return _allowed_or_refuse(addresses, port, networks)


def _allowed_or_refuse(addresses: list[IPAddress], port: int,
                       networks: Sequence[AllowedNetwork]) -> IPAddress:
    if not all(address_allowed(a, port=port, networks=networks) for a in addresses):
        raise ToolRunError(NOT_ALLOWED)
    return addresses[0]


@functools.lru_cache(maxsize=4)
def _tls_context(ca_file: str) -> ssl.SSLContext:
    """The certificates webhooks trust: the public CAs (certifi), plus the
    operator's OWLLAYER_WEBHOOK_CA_FILE. Made once per file: loading the CA
    bundle costs more than a local request. SSL_CERT_FILE and SSL_CERT_DIR
    are not read (the client does not trust the environment)."""
    context = ssl.create_default_context(cafile=certifi.where())
    if ca_file:
        context.load_verify_locations(cafile=ca_file)
    return context


def _pinned(url: str, address: IPAddress) -> tuple[str, str, str]:
    """(url with the checked address as host, Host header, TLS server name)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    default_port = 443 if parts.scheme == "https" else 80
    port = parts.port or default_port
    literal = f"[{address}]" if address.version == 6 else str(address)
    netloc = literal if port == default_port else f"{literal}:{port}"
    host_header = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, "")), host_header, host


async def call_webhook(
    *, url: str, secret: str, tool: str, arguments: dict, session_id: str, call_id: str,
    timeout: float, max_bytes: int | None = None,
    allowed_networks: Sequence[AllowedNetwork] | None = None,
) -> Any:
    """POST the call and return the parsed JSON answer; raises ToolRunError.

    ``allowed_networks``: what the tool's ``webhook_networks`` open. None,
    for a caller that passes no tool's networks, opens every network of
    OWLLAYER_WEBHOOK_ALLOWED_NETWORKS on every port."""
    check_url(url)
    limit = config().webhooks.max_bytes if max_bytes is None else max_bytes
    networks = (tuple(AllowedNetwork(net) for net in config().webhooks.allowed_networks)
                if allowed_networks is None else tuple(allowed_networks))
    body = json.dumps(
        {"tool": tool, "arguments": arguments, "sessionId": session_id, "callId": call_id},
        separators=(",", ":"), ensure_ascii=False,
    ).encode("utf-8")
    try:
        with tracing.span("webhook", tool=tool) as traced:
            status, raw = await _signed_post(url, body, secret=secret, timeout=timeout, limit=limit,
                                             networks=networks)
            traced.set(status_code=status)
    except ToolRunError as exc:
        if exc.message == NOT_ALLOWED:
            logger.warning("session %s: webhook tool %s: address not allowed", session_id, tool)
        raise
    except (TimeoutError, httpx.HTTPError) as exc:
        # One answer for refused, reset, unresolvable and slow alike: the
        # difference would let a tenant map the network behind the server.
        logger.warning("session %s: webhook tool %s did not answer: %s", session_id, tool,
                       _failure(exc))
        raise ToolRunError(NO_ANSWER) from None
    if status == 204 and not raw:
        return None
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise ToolRunError("webhook returned invalid JSON") from None


async def _signed_post(url: str, body: bytes, *, secret: str, timeout: float, limit: int,
                       networks: Sequence[AllowedNetwork]) -> tuple[int, bytes]:
    """POST ``body`` signed to the checked address: (status, answer). Raises
    ToolRunError for an answer outside 2xx, too large or a refused address;
    TimeoutError and httpx.HTTPError as they come."""
    parts = urlsplit(url)
    headers = {
        "Content-Type": "application/json",
        "User-Agent": f"OwlLayer/{config().protocol.server_version}",
    }
    # httpx's timeout bounds each network step; asyncio.timeout bounds the
    # whole exchange, so a server dripping bytes cannot hold the turn.
    async with asyncio.timeout(timeout):
        address = await checked_address(
            parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80),
            networks,
        )
        target, headers["Host"], server_name = _pinned(url, address)
        # Signed as it is sent, not before the name was resolved: a
        # receiver refusing old timestamps sees the time of sending.
        timestamp = str(int(time.time()))
        headers[TIMESTAMP_HEADER] = timestamp
        headers[SIGNATURE_HEADER] = sign(secret, timestamp, body)
        # Inside a turn's trace: the receiver's spans may join it (W3C traceparent).
        tracing.inject(headers)
        # trust_env=False: no proxy from the environment may carry the
        # request somewhere other than the checked address. The
        # certificate is checked for the url's host name (sni_hostname).
        async with httpx.AsyncClient(
            timeout=timeout, follow_redirects=False, trust_env=False,
            verify=_tls_context(config().webhooks.ca_file),
        ) as client:
            async with client.stream("POST", target, content=body, headers=headers,
                                     extensions={"sni_hostname": server_name}) as response:
                if not 200 <= response.status_code < 300:
                    raise ToolRunError(f"webhook answered {response.status_code}")
                return response.status_code, await _read_capped(response, limit)


async def post_notice(*, url: str, secret: str, payload: dict, timeout: float | None = None) -> None:
    """POST a notice to a tenant's own url (an alert: ``{"kind": ...}``),
    signed and sent as a server tool's call is, to an address allowed for
    every network of OWLLAYER_WEBHOOK_ALLOWED_NETWORKS; the answer is read
    (at most OWLLAYER_WEBHOOK_MAX_BYTES) and dropped. Raises ToolRunError
    with the same words as a tool's call."""
    check_url(url)
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    networks = tuple(AllowedNetwork(net) for net in config().webhooks.allowed_networks)
    try:
        await _signed_post(url, body, secret=secret, limit=config().webhooks.max_bytes,
                           timeout=config().webhooks.timeout if timeout is None else timeout,
                           networks=networks)
    except (TimeoutError, httpx.HTTPError) as exc:
        logger.warning("notice %s to a tenant's webhook did not arrive: %s",
                       payload.get("kind", ""), _failure(exc))
        raise ToolRunError(NO_ANSWER) from None


def _failure(exc: BaseException) -> str:
    """For the operator's log: what went wrong, a refused certificate named."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return f"certificate not accepted ({cause.verify_message})"
        cause = cause.__cause__ or cause.__context__
    return type(exc).__name__


async def _read_capped(response: httpx.Response, limit: int) -> bytes:
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ToolRunError("response too large")
    chunks: list[bytes] = []
    received = 0
    async for chunk in response.aiter_bytes():
        received += len(chunk)
        if received > limit:
            # Stop reading here; leaving the stream closes the connection.
            raise ToolRunError("response too large")
        chunks.append(chunk)
    return b"".join(chunks)
