"""Server tools change only through approvals.services: the tenant's owners
(or a superuser), with the model's checks, each change recorded."""
from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied, ValidationError

from aitp.models import OperatorAction
from approvals import services
from approvals.models import ServerTool
from tests.approvals.conftest import make_user

pytestmark = pytest.mark.django_db

WEBHOOK = {"name": "refund", "description": "Refund an order", "kind": "webhook",
           "webhook_url": "https://hooks.example/refund", "risk": "high", "approval_policy": "operator"}


def test_a_viewer_creates_no_server_tool(acme):
    viewer = make_user("vera", tenant=acme, role="viewer")

    with pytest.raises(PermissionDenied):
        services.server_tool_create(tenant=acme, by=viewer, fields=WEBHOOK)

    assert not ServerTool.objects.exists() and not OperatorAction.objects.exists()


def test_an_owner_of_another_tenant_neither_changes_nor_removes_a_tool(acme, olivia, mallory):
    tool = services.server_tool_create(tenant=acme, by=olivia, fields=WEBHOOK)

    with pytest.raises(PermissionDenied):
        services.server_tool_update(tool=tool, by=mallory, changes={"enabled": False})
    with pytest.raises(PermissionDenied):
        services.server_tool_delete(tool=tool, by=mallory)

    assert ServerTool.objects.get(pk=tool.pk).enabled is True
    assert list(OperatorAction.objects.values_list("action", flat=True)) == ["server_tool_created"]


def test_a_name_the_tenant_already_uses_is_refused_by_the_service(acme, olivia):
    services.server_tool_create(tenant=acme, by=olivia, fields=WEBHOOK)

    with pytest.raises(ValidationError):
        services.server_tool_create(tenant=acme, by=olivia, fields=WEBHOOK)

    assert ServerTool.objects.count() == OperatorAction.objects.count() == 1


def test_a_python_tool_needs_a_registered_handler(acme, olivia):
    with pytest.raises(ValidationError) as refused:
        services.server_tool_create(tenant=acme, by=olivia, fields={
            "name": "mystery", "kind": "python", "python_handler": "no_such_handler",
        })

    assert "python_handler" in refused.value.message_dict
    assert not ServerTool.objects.exists()


def test_a_change_to_the_values_a_tool_already_has_records_nothing(acme, olivia):
    tool = services.server_tool_create(tenant=acme, by=olivia, fields=WEBHOOK)

    services.server_tool_update(tool=tool, by=olivia, changes={"risk": "high", "enabled": True})

    assert not OperatorAction.objects.filter(action="server_tool_updated").exists()


def test_a_tool_is_disabled_through_the_service_and_the_record_says_so(acme, olivia):
    tool = services.server_tool_create(tenant=acme, by=olivia, fields=WEBHOOK)

    services.server_tool_update(tool=tool, by=olivia, changes={"enabled": False})

    assert ServerTool.objects.get(pk=tool.pk).enabled is False
    assert OperatorAction.objects.get(action="server_tool_updated").data == {
        "tool": "refund", "fields": ["enabled"], "enabled": False,
    }


def test_the_secret_is_never_a_field_the_service_sets(acme, olivia):
    with pytest.raises(ValueError, match="webhook_secret"):
        services.server_tool_create(tenant=acme, by=olivia,
                                    fields={**WEBHOOK, "webhook_secret": "chosen"})

    assert not ServerTool.objects.exists()
