"""Structured logs: one JSON object per line when OWLLAYER_LOG_FORMAT=json,
with the session's id and tenant on every line of a session, and the text
format as it always was by default (runtime/logs.py)."""
from __future__ import annotations

import asyncio
import json
import logging
import re
import sys

import pytest

from aitp_client import AitpClient
from runtime import logs
from tests.aitp.conftest import ADD_TO_CART, ORIGIN

PATIENCE = 30


def record(message: str = "session ses_1: turn 1 done: 0 rounds", *args, exc_info=None) -> logging.LogRecord:
    made = logging.LogRecord("agent.loop", logging.INFO, __file__, 1, message, args, exc_info)
    logs.SessionFields().filter(made)
    return made


def test_a_json_line_is_one_object_with_the_time_level_logger_and_message():
    line = logs.JsonFormatter().format(record("turn %s done", 3))

    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed.keys() == {"time", "level", "logger", "message"}
    assert (parsed["level"], parsed["logger"], parsed["message"]) == ("INFO", "agent.loop", "turn 3 done")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", parsed["time"])


def test_a_json_line_carries_its_exception_as_one_string_on_the_same_line():
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        line = logs.JsonFormatter().format(record("crashed", exc_info=sys.exc_info()))

    assert "\n" not in line
    assert "ValueError: bad" in json.loads(line)["exception"]


async def test_the_lines_of_a_bound_session_carry_its_id_and_tenant_in_the_tasks_it_starts():
    async def connection(session_id: str, tenant_id: int) -> dict:
        logs.bind_session(session_id, tenant_id)

        async def turn() -> logging.LogRecord:
            await asyncio.sleep(0)
            return record()

        made = await asyncio.create_task(turn())
        return json.loads(logs.JsonFormatter().format(made))

    first, second = await asyncio.gather(connection("ses_a", 1), connection("ses_b", 2))

    assert (first["session_id"], first["tenant_id"]) == ("ses_a", 1)
    assert (second["session_id"], second["tenant_id"]) == ("ses_b", 2)
    # Outside any session's task: no such fields.
    assert "session_id" not in json.loads(logs.JsonFormatter().format(record()))


def test_the_default_format_is_the_text_one_and_its_lines_read_as_ever(settings):
    assert settings.OWLLAYER_LOG_FORMAT == "text"
    (handler,) = [handler for handler in logging.getLogger().handlers
                  if any(isinstance(f, logs.SessionFields) for f in handler.filters)]
    made = record("session ses_1: turn %s done", 1)

    assert handler.formatter is not None
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO agent\.loop session ses_1: turn 1 done",
                        handler.formatter.format(made))


@pytest.mark.django_db(transaction=True)
async def test_a_server_logging_json_writes_only_json_lines_each_of_a_session_naming_it(
        daphne_factory, api_key):
    server = daphne_factory(OWLLAYER_LOG_FORMAT="json", OWLLAYER_LOG_LEVEL="DEBUG")
    page = AitpClient(server.ws_url(), api_key=api_key.raw, origin=ORIGIN)
    ack = await page.connect(timeout=PATIENCE)
    session_id = ack["sessionId"]
    await page.context_update("/cart", "Cart", tools=[ADD_TO_CART])
    await page.say("hello", timeout=PATIENCE)
    await page.close()
    assert server.stop() == 0

    lines = [json.loads(line) for line in server.logs().splitlines() if line.strip()]
    of_session = [line for line in lines if line.get("session_id") == session_id]
    messages = [line["message"] for line in of_session]
    assert any(re.match(rf"session {session_id}: opened", m) for m in messages), messages
    assert any(re.match(rf"session {session_id}: turn 1 done", m) for m in messages), messages
    assert any(re.match(rf"session {session_id}: closed", m) for m in messages), messages
    assert {line["tenant_id"] for line in of_session} == {api_key.tenant_id}
    # Every line that names the session in its words carries its fields.
    assert all(line.get("session_id") == session_id for line in lines
               if line["message"].startswith(f"session {session_id}:"))
    # daphne's access log too, redacted as ever.
    access = [line for line in lines if line["logger"] == "daphne.access"]
    assert any(line["message"].startswith("WSCONNECT /owllayer") for line in access)
    assert all(api_key.raw not in line["message"] for line in access)


@pytest.mark.django_db(transaction=True)
async def test_a_session_the_drain_closes_names_itself_in_its_closing_line(daphne_factory, api_key):
    server = daphne_factory(OWLLAYER_LOG_FORMAT="json")
    page = AitpClient(server.ws_url(), api_key=api_key.raw, origin=ORIGIN)
    session_id = (await page.connect(timeout=PATIENCE))["sessionId"]
    await page.say("hello", timeout=PATIENCE)

    # The process stops with the page still there: its drain ends the session.
    assert await asyncio.to_thread(server.stop) == 0
    await page.close()

    lines = [json.loads(line) for line in server.logs().splitlines() if line.strip()]
    (closing,) = [line for line in lines if line["message"].startswith(f"session {session_id}: closed")]
    assert "(1001)" in closing["message"]
    assert (closing["session_id"], closing["tenant_id"]) == (session_id, api_key.tenant_id)
