"""Calling a tenant's webhook tool: a signed JSON POST with a bounded answer.

The receiver checks ``X-OwlLayer-Signature`` = ``sha256=`` + hex HMAC-SHA256,
under the tool's secret, of ``f"{timestamp}.{body}"`` where timestamp is the
``X-OwlLayer-Timestamp`` header (unix seconds) and body the raw request bytes;
signing the timestamp lets it refuse replays of an old request.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from typing import Any
from urllib.parse import urlsplit

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


def check_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ToolRunError("webhook url must be http or https")


async def call_webhook(
    *, url: str, secret: str, tool: str, arguments: dict, session_id: str, call_id: str,
    timeout: float, max_bytes: int | None = None,
) -> Any:
    """POST the call and return the parsed JSON answer; raises ToolRunError."""
    check_url(url)
    limit = settings.OWLLAYER_WEBHOOK_MAX_BYTES if max_bytes is None else max_bytes
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
            async with httpx.AsyncClient(timeout=timeout, follow_redirects=False) as client:
                async with client.stream("POST", url, content=body, headers=headers) as response:
                    if not 200 <= response.status_code < 300:
                        raise ToolRunError(f"webhook answered {response.status_code}")
                    raw = await _read_capped(response, limit)
                    status = response.status_code
    except (TimeoutError, httpx.TimeoutException):
        logger.warning("session %s: webhook tool %s timed out", session_id, tool)
        raise ToolRunError("webhook timed out") from None
    except httpx.HTTPError as exc:
        logger.warning("session %s: webhook tool %s unreachable: %s", session_id, tool,
                       type(exc).__name__)
        raise ToolRunError("webhook unreachable") from None
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
