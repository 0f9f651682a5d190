"""Keys never reach the logs: daphne's access log writes ?apiKey= redacted."""
from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest
import websockets

from owllayer_site.access_log import REDACTED, redact

SECRET = "pk_test_doNotLogThisValue123"


@pytest.mark.parametrize("line, expected", [
    (f"/owllayer?apiKey={SECRET}", f"/owllayer?apiKey={REDACTED}"),
    (f"/owllayer?v=1&apikey={SECRET}&x=2", f"/owllayer?v=1&apikey={REDACTED}&x=2"),
    (f"GET /demo/?token={SECRET}", f"GET /demo/?token={REDACTED}"),
    ("/owllayer?monkey=banana", "/owllayer?monkey=banana"),
])
def test_secret_query_values_are_replaced_and_others_kept(line, expected):
    assert redact(line) == expected


def _status_of(url: str) -> int:
    with urllib.request.urlopen(url) as response:
        return response.status


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
async def test_the_access_log_never_holds_a_key_from_a_url(daphne_factory):
    server = daphne_factory(PYTHONUNBUFFERED="1")

    async with websockets.connect(server.ws_url(api_key=SECRET)) as ws:
        await ws.send(json.dumps({"type": "HANDSHAKE_INIT", "payload": {"apiKey": SECRET}}))
        await ws.recv()
    assert await asyncio.to_thread(_status_of, f"{server.http_url}/healthz?apiKey={SECRET}") == 200
    server.stop()

    logs = server.logs()
    assert "WSCONNECTING /owllayer" in logs
    assert f"/healthz?apiKey={REDACTED}" in logs
    assert SECRET not in logs
