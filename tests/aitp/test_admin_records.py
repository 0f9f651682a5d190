"""The admin's record pages (sessions, tool calls, conversation messages,
daily usage, operator actions) are read, never written: no add, change or
delete, for a superuser as for an owner given every model permission, so a
record stays what the services wrote."""
from __future__ import annotations

from datetime import date

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from aitp.models import ConversationMessage, DailyUsage, OperatorAction
from tests.support.people import acme, make_session, make_tool_call, make_user, olivia, root  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db


def _records(tenant, user) -> dict[str, object]:
    session = make_session(tenant, "ses_record")
    return {
        "session": session,
        "toolcall": make_tool_call(session, name="order_status", arguments={"order": "A1"},
                                   risk="none", origin="client"),
        "conversationmessage": ConversationMessage.objects.create(
            session=session, seq=1, turn=1, role="user", content=[{"type": "text", "text": "hi"}],
        ),
        "dailyusage": DailyUsage.objects.create(tenant=tenant, date=date(2026, 1, 2), sessions=1),
        "operatoraction": OperatorAction.objects.create(tenant=tenant, user=user, action="session_end"),
    }


def _with_every_aitp_permission(user):
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="aitp"))
    return user


@pytest.fixture(params=["superuser", "owner with every permission"])
def writer(request, acme, root, olivia):
    return root if request.param == "superuser" else _with_every_aitp_permission(olivia)


RECORDS = ["session", "toolcall", "conversationmessage", "dailyusage", "operatoraction"]


def _signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize("model", RECORDS)
def test_a_record_page_is_shown_without_save_or_delete(acme, writer, model):
    record = _records(acme, writer)[model]
    client = _signed_in(writer)

    shown = client.get(reverse(f"admin:aitp_{model}_change", args=[record.pk]))
    listing = client.get(reverse(f"admin:aitp_{model}_changelist"))

    assert (shown.status_code, listing.status_code) == (200, 200)
    assert 'name="_save"' not in shown.content.decode()
    assert "deletelink" not in shown.content.decode()
    assert "delete_selected" not in listing.content.decode()


@pytest.mark.parametrize("model", RECORDS)
def test_a_record_is_never_added_changed_or_deleted_in_the_admin(acme, writer, model):
    record = _records(acme, writer)[model]
    client = _signed_in(writer)

    add = client.post(reverse(f"admin:aitp_{model}_add"), {})
    change = client.post(reverse(f"admin:aitp_{model}_change", args=[record.pk]), {})
    delete = client.post(reverse(f"admin:aitp_{model}_delete", args=[record.pk]), {"post": "yes"})
    bulk = client.post(reverse(f"admin:aitp_{model}_changelist"),
                       {"action": "delete_selected", "_selected_action": [record.pk], "post": "yes"})

    assert (add.status_code, change.status_code, delete.status_code) == (403, 403, 403)
    assert bulk.status_code in (200, 302)  # the list again: no such action ran
    assert type(record).objects.filter(pk=record.pk).exists()
