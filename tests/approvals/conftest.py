"""Fixtures for approvals: two shops, their sessions, tool calls, and the people involved.

Personas (tests.support.people): Olivia operates Acme (staff, owner of acme),
Mallory operates Globex (staff, owner of globex only), Root is a superuser.
"""
from __future__ import annotations

import pytest

# Also helpers for the tests, which import them from here.
from tests.support.people import acme, globex, make_session, make_tool_call, make_user, mallory, olivia, root  # noqa: F401 (fixtures)  # noqa: F401


def make_call(session, name="process_payment", args=None, risk="critical", origin="client"):
    """A call sent to the page and not answered yet: a payment, unless told otherwise."""
    from aitp.models import ToolCall

    return make_tool_call(
        session, name=name, arguments={"amount": 299.98} if args is None else args, risk=risk,
        origin=origin, status=ToolCall.Status.SENT,
    )


@pytest.fixture
def acme_session(acme):
    return make_session(acme, "ses_acme")


@pytest.fixture
def globex_session(globex):
    return make_session(globex, "ses_globex")


@pytest.fixture
def payment_call(acme_session):
    return make_call(acme_session)


@pytest.fixture(autouse=True)
def webhooks_may_reach_this_machine(settings):
    """The test receivers listen on 127.0.0.1, which webhooks may only reach
    through the operator's allow-list (tests/approvals/test_webhook_safety.py)."""
    import ipaddress

    settings.OWLLAYER_WEBHOOK_ALLOWED_NETWORKS = (ipaddress.ip_network("127.0.0.1/32"),)


@pytest.fixture
def receiver():
    """Base URL of a webhook endpoint checking signatures under webhook_receiver.SECRET."""
    from tests.approvals.webhook_receiver import start_receiver, stop_receiver

    server, thread = start_receiver()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        stop_receiver(server, thread)
