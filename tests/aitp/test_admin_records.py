"""The admin's record pages (sessions, tool calls, conversation messages,
daily usage, operator actions) are read, never written: no add, change or
delete, for a superuser as for an owner given every model permission, so a
record stays what the services wrote."""
from __future__ import annotations

from datetime import date

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from aitp.models import ConversationMessage, DailyUsage, OperatorAction
from tests.support.people import acme, globex, make_session, make_tool_call, make_user, olivia, root  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db


def _records(tenant, user) -> dict[str, object]:
    session = make_session(tenant, f"ses_record_{tenant.slug}")
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

    shown = client.get(reverse(f"admin:aitp_{model}_change", args=[quote(record.pk)]))
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
    change = client.post(reverse(f"admin:aitp_{model}_change", args=[quote(record.pk)]), {})
    delete = client.post(reverse(f"admin:aitp_{model}_delete", args=[quote(record.pk)]), {"post": "yes"})
    bulk = client.post(reverse(f"admin:aitp_{model}_changelist"),
                       {"action": "delete_selected", "_selected_action": [record.pk], "post": "yes"})

    assert (add.status_code, change.status_code, delete.status_code) == (403, 403, 403)
    assert bulk.status_code in (200, 302)  # the list again: no such action ran
    assert type(record).objects.filter(pk=record.pk).exists()


# --- the tenant filters name only the tenants the user may see -------------------------


def tenant_filter_choices(page) -> list[str]:
    """The slugs a change list's tenant filter offers (none: Django leaves
    out a filter with a single choice)."""
    specs = [spec for spec in page.context["cl"].filter_specs
             if getattr(spec, "field_path", "").endswith("tenant")]
    assert len(specs) <= 1
    return [name for spec in specs for _pk, name in spec.lookup_choices]


@pytest.mark.parametrize("model", RECORDS)
def test_a_staff_member_of_one_tenant_reads_no_other_tenants_slug_off_a_records_filter(
        acme, globex, olivia, model):
    _records(acme, olivia)
    _records(globex, None)

    page = _signed_in(_with_every_aitp_permission(olivia)).get(reverse(f"admin:aitp_{model}_changelist"))

    assert page.status_code == 200
    assert tenant_filter_choices(page) in ([], ["acme"])
    assert "globex" not in page.content.decode()


@pytest.mark.parametrize("model", RECORDS)
def test_a_superuser_filters_the_records_by_every_tenant(acme, globex, root, model):
    _records(acme, root)
    _records(globex, root)

    page = _signed_in(root).get(reverse(f"admin:aitp_{model}_changelist"))

    assert tenant_filter_choices(page) == ["acme", "globex"]
