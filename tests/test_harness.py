"""The end-to-end harness itself: a real daphne on the test database."""
from __future__ import annotations

import asyncio
import socket
import urllib.request
from pathlib import Path

import pytest
from django.db import connection

from aitp import tenancy
from aitp_client import AitpClient
from tests.support.daphne import DaphneStartError

pytestmark = pytest.mark.django_db(transaction=True)


def test_live_db_url_names_this_runs_own_test_database(live_db_url):
    name = str(connection.settings_dict["NAME"])

    assert live_db_url.endswith(name)
    if connection.vendor == "sqlite":
        assert Path(name).is_file()
        assert Path(name).name.startswith("test-db.sqlite3_p")
    else:
        assert name.startswith("test_") and "_p" in name


def test_a_started_server_answers_http_and_exits_when_stopped(daphne_factory):
    server = daphne_factory()

    with urllib.request.urlopen(f"{server.http_url}/admin/login/", timeout=10) as response:
        status = response.status

    assert status == 200
    assert server.stop() is not None
    assert not server.running


def test_the_server_sees_a_key_the_test_created(daphne_factory):
    tenant = tenancy.tenant_create(slug="harness", name="Harness")
    _, raw_key = tenancy.key_create(tenant=tenant, name="e2e")
    server = daphne_factory()

    async def handshake() -> dict:
        async with AitpClient(server.ws_url(), api_key=raw_key) as client:
            return client.ack

    ack = asyncio.run(handshake())

    assert ack["sessionId"]
    assert ack["protocolVersion"] == "1.0.0"


def test_a_server_that_cannot_start_fails_the_test_with_its_output(daphne_factory):
    with pytest.raises(DaphneStartError) as caught:
        daphne_factory(OWLLAYER_MAX_ACTIVE_TOOLS="many")

    assert "OWLLAYER_MAX_ACTIVE_TOOLS must be an integer" in str(caught.value)



def test_a_port_someone_else_listens_on_is_not_taken_for_the_started_server(daphne_factory):
    # The two test passes start servers at the same time: a port probed free
    # may be another pass's server's by the time ours binds. Accepting there
    # is not this server listening.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        with pytest.raises(DaphneStartError) as caught:
            daphne_factory(port=other.getsockname()[1])

    assert "Address already in use" in str(caught.value)
