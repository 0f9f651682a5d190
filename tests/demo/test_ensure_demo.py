"""`manage.py ensure_demo`: one working demo key, kept across runs."""
from __future__ import annotations

import io
import stat
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from aitp import tenancy
from aitp.models import ApiKey
from aitp.store import keys
from tenants.models import Tenant

pytestmark = pytest.mark.django_db


def run(key_file, *args: str) -> str:
    out = io.StringIO()
    if "--logins-file" not in args:  # never the checkout's own file
        args = (*args, "--logins-file", str(key_file.parent / ".demo-logins"))
    call_command("ensure_demo", "--key-file", str(key_file), *args, stdout=out)
    return out.getvalue()


def active_demo_keys():
    return ApiKey.objects.filter(tenant__slug="demo", name="demo", status=ApiKey.Status.ACTIVE)


def test_a_first_run_creates_the_demo_store_and_saves_its_key_readable_only_by_the_owner(
    tmp_path, monkeypatch
):
    monkeypatch.delenv("PORT", raising=False)
    key_file = tmp_path / ".demo-key"

    output = run(key_file)

    raw = key_file.read_text().strip()
    key = keys.api_key_lookup(raw)
    assert Tenant.objects.get(slug="demo").name == "Demo Store"
    assert key is not None and key.name == "demo" and key.status == ApiKey.Status.ACTIVE
    assert key.allowed_origins == ["http://localhost:8000", "http://127.0.0.1:8000"]
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert f"ws://127.0.0.1:8000/owllayer?apiKey={raw}" in output
    assert "http://127.0.0.1:8000/demo/" in output


def test_a_second_run_reuses_the_saved_key(tmp_path):
    key_file = tmp_path / ".demo-key"
    run(key_file)
    first = key_file.read_text()

    output = run(key_file)

    assert key_file.read_text() == first
    assert active_demo_keys().count() == 1
    assert ApiKey.objects.count() == 1
    assert f"demo key:     {first.strip()}  (from " in output


def test_a_revoked_demo_key_is_replaced_by_a_new_one(tmp_path):
    key_file = tmp_path / ".demo-key"
    run(key_file)
    old_raw = key_file.read_text().strip()
    tenancy.key_revoke(key=keys.api_key_lookup(old_raw))

    run(key_file)

    new_raw = key_file.read_text().strip()
    assert new_raw != old_raw
    assert list(active_demo_keys()) == [keys.api_key_lookup(new_raw)]


def test_a_lost_key_file_revokes_the_old_demo_key_so_only_one_stays_active(tmp_path):
    key_file = tmp_path / ".demo-key"
    run(key_file)
    old_key = keys.api_key_lookup(key_file.read_text().strip())
    key_file.unlink()

    run(key_file)

    old_key.refresh_from_db()
    assert old_key.status == ApiKey.Status.REVOKED
    assert list(active_demo_keys()) == [keys.api_key_lookup(key_file.read_text().strip())]


def test_a_saved_key_of_another_tenant_is_left_alone(tmp_path):
    other = tenancy.tenant_create(slug="acme", name="Acme")
    _, other_raw = tenancy.key_create(tenant=other, name="demo")
    key_file = tmp_path / ".demo-key"
    key_file.write_text(other_raw)

    run(key_file)

    assert key_file.read_text().strip() != other_raw
    assert keys.api_key_lookup(other_raw).status == ApiKey.Status.ACTIVE
    assert active_demo_keys().count() == 1


def test_a_run_on_another_port_adds_its_origins_and_keeps_the_first_servers(tmp_path, monkeypatch):
    key_file = tmp_path / ".demo-key"
    run(key_file, "--port", "8000")
    monkeypatch.setenv("PORT", "9001")

    output = run(key_file)

    key = keys.api_key_lookup(key_file.read_text().strip())
    assert key.allowed_origins == [
        "http://localhost:8000", "http://127.0.0.1:8000",
        "http://localhost:9001", "http://127.0.0.1:9001",
    ]
    assert "ws://127.0.0.1:9001/owllayer?apiKey=" in output


def test_a_replaced_demo_key_still_allows_the_ports_the_old_one_served(tmp_path):
    key_file = tmp_path / ".demo-key"
    run(key_file, "--port", "8000")
    key_file.unlink()

    run(key_file, "--port", "9001")

    key = keys.api_key_lookup(key_file.read_text().strip())
    assert {"http://127.0.0.1:8000", "http://127.0.0.1:9001"} <= set(key.allowed_origins)


def test_a_first_run_makes_an_admin_and_a_console_owner_whose_passwords_it_prints_and_saves(
    tmp_path,
):
    from django.contrib.auth import get_user_model

    from tenants.models import TenantMembership

    logins_file = tmp_path / ".demo-logins"

    output = run(tmp_path / ".demo-key", "--port", "8000", "--logins-file", str(logins_file))

    saved = dict(line.split(" ", 1) for line in logins_file.read_text().splitlines())
    admin = get_user_model().objects.get(username="admin")
    owner = get_user_model().objects.get(username="demo-owner")
    assert admin.is_superuser and admin.check_password(saved["admin"])
    assert not owner.is_staff and owner.check_password(saved["demo-owner"])
    assert TenantMembership.objects.get(user=owner).role == "owner"
    assert stat.S_IMODE(logins_file.stat().st_mode) == 0o600
    assert f"http://127.0.0.1:8000/admin/  user admin, password {saved['admin']}" in output
    assert (f"http://127.0.0.1:8000/console/  user demo-owner, password {saved['demo-owner']}"
            in output)
    assert "http://127.0.0.1:8000/demo/" in output


def test_an_account_that_existed_already_keeps_its_password(tmp_path):
    from django.contrib.auth import get_user_model

    get_user_model().objects.create_superuser("admin", "", "the-owners-own-password")
    logins_file = tmp_path / ".demo-logins"

    output = run(tmp_path / ".demo-key", "--logins-file", str(logins_file))

    assert get_user_model().objects.get(username="admin").check_password("the-owners-own-password")
    assert "admin" not in dict(line.split(" ", 1) for line in logins_file.read_text().splitlines())
    assert "manage.py changepassword admin" in output


def test_refuses_a_port_that_is_not_a_number(tmp_path):
    with pytest.raises(CommandError, match="port must be a number"):
        run(tmp_path / ".demo-key", "--port", "http")


def test_the_demo_store_gets_its_server_tools_and_says_which_agent_answers(tmp_path, settings):
    from approvals.models import ServerTool

    settings.OWLLAYER_LLM = "offline"
    output = run(tmp_path / ".demo-key")
    names = set(ServerTool.objects.filter(tenant__slug="demo").values_list("name", flat=True))
    assert names == {"order_status", "cancel_order"}
    assert "agent:        offline" in output


def test_without_a_model_key_it_says_the_demo_assistant_answers_and_which_variable_connects_claude(
    tmp_path, settings
):
    settings.OWLLAYER_LLM = "demo"
    output = run(tmp_path / ".demo-key")
    assert "agent:        demo (no ANTHROPIC_API_KEY): a scripted demo assistant" in output
    assert "set ANTHROPIC_API_KEY and restart for Claude" in output


def the_saved_key(key_file) -> ApiKey:
    return keys.api_key_lookup(key_file.read_text().strip())


def test_a_demo_key_revoked_in_the_console_then_deleted_is_replaced_by_one_allowing_both_ports(tmp_path):
    key_file = tmp_path / ".demo-key"
    run(key_file, "--port", "8000")
    tenancy.key_revoke(key=the_saved_key(key_file))
    key_file.unlink()

    run(key_file, "--port", "9001")

    assert set(the_saved_key(key_file).allowed_origins) == {
        "http://localhost:8000", "http://127.0.0.1:8000", "http://localhost:9001", "http://127.0.0.1:9001"}


@pytest.mark.parametrize("stop", ["revoked", "disabled", "expired"])
def test_a_demo_key_that_stopped_working_is_replaced_by_one_allowing_its_ports_and_the_new_one(
    tmp_path, stop
):
    key_file = tmp_path / ".demo-key"
    run(key_file, "--port", "8000")
    old_key = the_saved_key(key_file)
    if stop == "expired":
        tenancy.key_update(key=old_key, changes={"expires_at": timezone.now() - timedelta(minutes=1)})
    else:
        tenancy.key_update(key=old_key, changes={"status": stop})

    run(key_file, "--port", "9001")

    new_key = the_saved_key(key_file)
    assert new_key.pk != old_key.pk and new_key.status == ApiKey.Status.ACTIVE
    assert {"http://127.0.0.1:8000", "http://127.0.0.1:9001"} <= set(new_key.allowed_origins)


def test_a_new_demo_key_allows_every_port_of_every_earlier_demo_key(tmp_path):
    key_file = tmp_path / ".demo-key"
    for port in ("8000", "9001", "9002"):
        if key_file.exists():
            tenancy.key_revoke(key=the_saved_key(key_file))
            key_file.unlink()
        run(key_file, "--port", port)

    assert [origin for origin in the_saved_key(key_file).allowed_origins if "127.0.0.1" in origin] == [
        "http://127.0.0.1:8000", "http://127.0.0.1:9001", "http://127.0.0.1:9002"]
    assert active_demo_keys().count() == 1


def test_another_tenants_key_named_demo_gives_the_demo_key_none_of_its_origins(tmp_path):
    other = tenancy.tenant_create(slug="acme", name="Acme")
    tenancy.key_create(tenant=other, name="demo", allowed_origins=["https://acme.example"])

    run(tmp_path / ".demo-key", "--port", "8000")

    assert "https://acme.example" not in the_saved_key(tmp_path / ".demo-key").allowed_origins


def test_the_key_in_the_demo_key_file_is_known_as_the_demo_pages_key(tmp_path):
    from aitp.selectors import is_the_demo_pages_key

    key_file = tmp_path / ".demo-key"
    run(key_file)
    demo_key = the_saved_key(key_file)
    other, _ = tenancy.key_create(tenant=demo_key.tenant, name="demo")

    assert is_the_demo_pages_key(demo_key, key_file)
    assert not is_the_demo_pages_key(other, key_file)
    assert not is_the_demo_pages_key(demo_key, tmp_path / "missing")


def test_a_new_demo_key_gives_the_stores_widget_the_shop_assistants_name_greeting_and_prompts(tmp_path):
    from widget import appearance

    key_file = tmp_path / ".demo-key"
    run(key_file)

    look = appearance.public(keys.api_key_lookup(key_file.read_text().strip()).widget_appearance)
    assert look["name"] == "Shop assistant"
    assert look["greeting"].startswith("Hi! I can find products")
    assert look["prompts"] == ["Show me the travel speaker", "Add two to my cart", "Pay for my order"]


def test_a_replaced_demo_key_keeps_the_look_an_owner_gave_the_old_one(tmp_path):
    from widget.services import key_set_appearance

    key_file = tmp_path / ".demo-key"
    run(key_file)
    old = keys.api_key_lookup(key_file.read_text().strip())
    key_set_appearance(key=old, look={"name": "Owly", "language": "fr"})
    tenancy.key_revoke(key=ApiKey.objects.get(pk=old.pk))

    run(key_file)

    new = keys.api_key_lookup(key_file.read_text().strip())
    assert new.pk != old.pk
    assert (new.widget_appearance["name"], new.widget_appearance["language"]) == ("Owly", "fr")
