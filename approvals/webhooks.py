"""Calling a tenant's webhook tool: a signed JSON POST with a bounded answer.

The receiver checks ``X-OwlLayer-Signature`` = ``sha256=`` + hex HMAC-SHA256,
under the tool's secret, of ``f"{timestamp}.{body}"`` where timestamp is the
``X-OwlLayer-Timestamp`` header (unix seconds) and body the raw request bytes;
signing the timestamp lets it refuse replays of an old request.

A tenant chooses the url, so the server must not become their way into the
network it runs in: the name is resolved here, every address it resolves to
must be public (or inside ``OWLLAYER_WEBHOOK_ALLOWED_NETWORKS``), and the
request then goes to the checked address itself, with the original Host
header and TLS server name, so a second DNS answer cannot swap it. The
errors say what failed ("the webhook address is not allowed", "the webhook
did not answer"), never which port was closed or how a connection failed.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import logging
import socket
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from django.conf import settings

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

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def check_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ToolRunError("webhook url must be http or https")
    try:
        _ = parts.port  # the port is only checked when read
    except ValueError:
        raise ToolRunError("webhook url must be http or https") from None


def address_allowed(address: IPAddress, allowed_networks=None) -> bool:
    """Public unicast addresses, or those inside an operator's allowed networks."""
    networks = (settings.OWLLAYER_WEBHOOK_ALLOWED_NETWORKS if allowed_networks is None
                else allowed_networks)
    if any(address.version == net.version and address in net for net in networks):
        return True
    mapped = getattr(address, "ipv4_mapped", None)
    if mapped is not None:  # ::ffff:127.0.0.1 is 127.0.0.1
        return address_allowed(mapped, networks)
    return address.is_global and not (
        address.is_multicast or address.is_reserved or address.is_private
        or address.is_loopback or address.is_link_local or address.is_unspecified
    )


async def resolve(host: str, port: int) -> list[str]:
    """Every address the name resolves to (tests replace this)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [info[4][0] for info in infos]


async def checked_address(host: str, port: int) -> IPAddress:
    """The address to connect to; ToolRunError unless every address the name
    has is allowed (a name with one private address among public ones could
    be steered to it)."""
    try:
        return _allowed_or_refuse([ipaddress.ip_address(host)])
    except ValueError:
        pass  # a name, not an address literal
    try:
        found = await resolve(host, port)
        addresses = [ipaddress.ip_address(a.split("%", 1)[0]) for a in found]
    except (OSError, ValueError, UnicodeError):
        raise ToolRunError(NO_ANSWER) from None
    if not addresses:
        raise ToolRunError(NO_ANSWER)
    return _allowed_or_refuse(addresses)


def _allowed_or_refuse(addresses: list[IPAddress]) -> IPAddress:
    if not all(address_allowed(a) for a in addresses):
        raise ToolRunError(NOT_ALLOWED)
    return addresses[0]


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
) -> Any:
    """POST the call and return the parsed JSON answer; raises ToolRunError."""
    check_url(url)
    limit = settings.OWLLAYER_WEBHOOK_MAX_BYTES if max_bytes is None else max_bytes
    parts = urlsplit(url)
    body = json.dumps(
        {"tool": tool, "arguments": arguments, "sessionId": session_id, "callId": call_id},
        separators=(",", ":"), ensure_ascii=False,
    ).encode("utf-8")
    timestamp = str(int(time.time()))
    headers = {
        "Content-Type": "application/json",
        "User-Agent": f"OwlLayer/{settings.OWLLAYER_SERVER_VERSION}",
        TIMESTAMP_HEADER: timestamp,
        SIGNATURE_HEADER: sign(secret, timestamp, body),
    }
    try:
        # httpx's timeout bounds each network step; asyncio.timeout bounds the
        # whole exchange, so a server dripping bytes cannot hold the turn.
        async with asyncio.timeout(timeout):
            address = await checked_address(
                parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
            )
            target, headers["Host"], server_name = _pinned(url, address)
            # trust_env=False: no proxy from the environment may carry the
            # request somewhere other than the checked address.
            async with httpx.AsyncClient(timeout=timeout, follow_redirects=False,
                                         trust_env=False) as client:
                async with client.stream("POST", target, content=body, headers=headers,
                                         extensions={"sni_hostname": server_name}) as response:
                    if not 200 <= response.status_code < 300:
                        raise ToolRunError(f"webhook answered {response.status_code}")
                    raw = await _read_capped(response, limit)
                    status = response.status_code
    except ToolRunError as exc:
        if exc.message == NOT_ALLOWED:
            logger.warning("session %s: webhook tool %s: address not allowed", session_id, tool)
        raise
    except (TimeoutError, httpx.HTTPError) as exc:
        # One answer for refused, reset, unresolvable and slow alike: the
        # difference would let a tenant map the network behind the server.
        logger.warning("session %s: webhook tool %s did not answer: %s", session_id, tool,
                       type(exc).__name__)
        raise ToolRunError(NO_ANSWER) from None
    if status == 204 and not raw:
        return None
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise ToolRunError("webhook returned invalid JSON") from None


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
