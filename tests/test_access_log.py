"""Keys never reach the logs: daphne's access log writes key-like query
values as [redacted], however the parameter's name is spelled."""
from __future__ import annotations

import asyncio
import datetime
import io
import json
import urllib.request

import pytest
import websockets

from owllayer_site.access_log import REDACTED, RedactingAccessLogGenerator, redact

SECRET = "pk_test_doNotLogThisValue123"

# (what the query looks like, the query with a secret of its own, the query as logged)
SPELLINGS = [
    ("plain", "apiKey=S1", f"apiKey={REDACTED}"),
    ("lower case", "apikey=S2", f"apikey={REDACTED}"),
    ("upper case", "APIKEY=S3", f"APIKEY={REDACTED}"),
    ("percent-encoded letter", "api%4Bey=S4", f"api%4Bey={REDACTED}"),
    ("percent-encoded first letter", "%61piKey=S5", f"%61piKey={REDACTED}"),
    ("lower-case percent escape", "%61pi%6bey=S6", f"%61pi%6bey={REDACTED}"),
    ("encoded twice", "%2561piKey=S7", f"%2561piKey={REDACTED}"),
    ("plus for a space", "api+key=S8", f"api+key={REDACTED}"),
    ("%20 for a space", "api%20key=S9", f"api%20key={REDACTED}"),
    ("snake case", "api_key=S10", f"api_key={REDACTED}"),
    ("prefixed", "x-api-key=S11", f"x-api-key={REDACTED}"),
    ("full-width letters", "%EF%BD%81piKey=S12", f"%EF%BD%81piKey={REDACTED}"),
    ("repeated", "apiKey=S13&apiKey=S14", f"apiKey={REDACTED}&apiKey={REDACTED}"),
    ("after a ; separator", "v=1;apiKey=S15", f"v=1;apiKey={REDACTED}"),
    ("a ; inside the value", "apiKey=S16;S17&v=1", f"apiKey={REDACTED}&v=1"),
    ("after a second ?", "v=1?apiKey=S18", f"v=1?apiKey={REDACTED}"),
    ("the = encoded", "apiKey%3DS19&v=1", f"{REDACTED}&v=1"),
    ("token", "token=S20", f"token={REDACTED}"),
    ("access token", "access_token=S21", f"access_token={REDACTED}"),
    ("a key under another name", "x=pk_live_S22", f"x={REDACTED}"),
    ("a webhook secret under another name", "note=whsec_S23", f"note={REDACTED}"),
    ("last of several", "v=1&lang=en&apiKey=S24", f"v=1&lang=en&apiKey={REDACTED}"),
    ("the console's preview ticket", "previewTicket=S25&apiKey=S26",
     f"previewTicket={REDACTED}&apiKey={REDACTED}"),
]


@pytest.mark.parametrize("query, logged", [(q, logged) for _, q, logged in SPELLINGS],
                         ids=[name for name, _, _ in SPELLINGS])
def test_a_key_like_parameter_is_redacted_however_its_name_is_spelled(query, logged):
    assert redact(f"GET /owllayer?{query}") == f"GET /owllayer?{logged}"


@pytest.mark.parametrize("line", [
    "/owllayer?monkey=banana",
    "/owllayer?v=1&lang=en",
    "/owllayer?keynote=1",
    "/owllayer",
    "/demo/?page=2;sort=asc",
])
def test_parameters_that_are_not_keys_are_kept(line):
    assert redact(line) == line


@pytest.mark.parametrize("query, logged", [(q, logged) for _, q, logged in SPELLINGS],
                         ids=[name for name, _, _ in SPELLINGS])
def test_the_access_log_writer_writes_each_spelling_redacted(query, logged):
    stream = io.StringIO()
    writer = RedactingAccessLogGenerator(stream)

    writer("http", "complete", {"path": f"/owllayer?{query}", "status": 200, "method": "GET",
                                "client": "127.0.0.1:5000", "time_taken": 0.01, "size": 10})
    writer.write_entry("127.0.0.1:5000", datetime.datetime.now(), f"GET /x?{query}")

    line = stream.getvalue()
    assert f"GET /owllayer?{logged}" in line and f"GET /x?{logged}" in line
    for secret in _secrets(query):
        assert secret not in line


def _secrets(query: str) -> list[str]:
    """The S1, S2, ... markers a query carries."""
    import re

    return re.findall(r"S\d+", query)


def _status_of(url: str) -> int:
    with urllib.request.urlopen(url) as response:
        return response.status


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
async def test_the_access_log_of_a_real_server_never_holds_a_key_from_a_url(daphne_factory):
    server = daphne_factory(PYTHONUNBUFFERED="1")

    async with websockets.connect(server.ws_url(api_key=SECRET)) as ws:
        await ws.send(json.dumps({"type": "HANDSHAKE_INIT", "payload": {"apiKey": SECRET}}))
        await ws.recv()
    # Each spelling with secrets of its own, so a leak names the spelling.
    for index, (_, query, _) in enumerate(SPELLINGS):
        query = query.replace("S", f"Leak{index}x")
        assert await asyncio.to_thread(_status_of, f"{server.http_url}/healthz?{query}") == 200
    server.stop()

    logs = server.logs()
    assert "WSCONNECTING /owllayer" in logs
    for _, _, logged in SPELLINGS:
        assert f"/healthz?{logged}" in logs
    assert SECRET not in logs
    leaked = [name for index, (name, _, _) in enumerate(SPELLINGS) if f"Leak{index}x" in logs]
    assert leaked == []
