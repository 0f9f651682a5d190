"""``manage.py ensure_demo``: the demo tenant and one working key, for local use.

Keys are stored hashed, so an existing key cannot be shown again. The demo
key's plaintext is kept in ``.demo-key`` (mode 600, ignored by git) and reused
while it still matches an active demo key; otherwise a new key replaces it.
Running the command again changes nothing but the key's allowed origins
when PORT changed.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.utils import timezone

from aitp import services
from aitp.models import ApiKey
from tenants.models import Tenant

DEMO_SLUG = "demo"
DEMO_NAME = "Demo Store"
DEMO_KEY_NAME = "demo"


@dataclass(frozen=True)
class DemoKey:
    tenant: Tenant
    key: ApiKey
    raw_key: str
    created: bool


def demo_origins(port: int) -> list[str]:
    return [f"http://localhost:{port}", f"http://127.0.0.1:{port}"]


def ensure_demo(*, key_file: Path, origins: list[str]) -> DemoKey:
    """Make sure the demo tenant has exactly one active demo key; return it."""
    with transaction.atomic():
        tenant = Tenant.objects.filter(slug=DEMO_SLUG).first()
        if tenant is None:
            tenant = services.tenant_create(slug=DEMO_SLUG, name=DEMO_NAME)
        raw_key = _read_key(key_file)
        key = services.api_key_lookup(raw_key) if raw_key else None
        created = not _is_usable_demo_key(key, tenant)
        if created:
            key, raw_key = services.api_key_create(
                tenant=tenant, name=DEMO_KEY_NAME, allowed_origins=origins
            )
        elif set(key.allowed_origins) != set(origins):
            key = services.api_key_update(key=key, allowed_origins=origins)
        # Older demo keys (from a lost or deleted key file) stop working.
        stale = tenant.api_keys.filter(name=DEMO_KEY_NAME, status=ApiKey.Status.ACTIVE)
        for old_key in stale.exclude(pk=key.pk):
            services.api_key_revoke(key=old_key)
        if created:
            # Inside the transaction: a key whose plaintext could not be
            # saved would be unusable, so it is not kept either.
            _write_key(key_file, raw_key)
    return DemoKey(tenant=tenant, key=key, raw_key=raw_key, created=created)


def _is_usable_demo_key(key: ApiKey | None, tenant: Tenant) -> bool:
    return (
        key is not None
        and key.tenant_id == tenant.pk
        and key.name == DEMO_KEY_NAME
        and key.status == ApiKey.Status.ACTIVE
        and (key.expires_at is None or key.expires_at > timezone.now())
    )


def _read_key(key_file: Path) -> str:
    try:
        return key_file.read_text().strip()
    except FileNotFoundError:
        return ""


def _write_key(key_file: Path, raw_key: str) -> None:
    descriptor = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        # The mode given to open() applies only to a new file.
        os.fchmod(handle.fileno(), 0o600)
        handle.write(raw_key + "\n")


class Command(BaseCommand):
    help = "Ensure the demo tenant and its key exist; print the key and the URLs to try."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--key-file",
            default=str(Path(settings.BASE_DIR) / ".demo-key"),
            help="where the demo key's plaintext is kept (default: .demo-key)",
        )
        parser.add_argument(
            "--port",
            default=os.environ.get("PORT") or "8000",
            help="the port the server listens on (default: $PORT or 8000)",
        )

    def handle(self, *args, key_file: str, port: str, **options) -> None:
        try:
            port_number = int(port)
        except ValueError:
            raise CommandError(f"port must be a number, got {port!r}") from None
        if not 0 < port_number < 65536:
            raise CommandError(f"port must be between 1 and 65535, got {port_number}")
        demo = ensure_demo(key_file=Path(key_file), origins=demo_origins(port_number))
        # The shop's server-side tools (order lookup; cancelling needs approval).
        from demo.order_tools import demo_tools_install

        demo_tools_install(tenant=demo.tenant)
        base = f"127.0.0.1:{port_number}"
        ws_url = f"ws://{base}{settings.OWLLAYER_WS_PATH}?apiKey={quote(demo.raw_key, safe='')}"
        state = f"new, saved to {key_file}" if demo.created else f"from {key_file}"
        self.stdout.write(f"demo tenant:  {demo.tenant.slug} ({demo.tenant.name})")
        self.stdout.write(f"demo key:     {demo.raw_key}  ({state})")
        self.stdout.write(f"websocket:    {ws_url}")
        self.stdout.write(f"demo page:    http://{base}/demo/")
        if settings.OWLLAYER_LLM == "offline":
            self.stdout.write(
                "agent:        offline (no ANTHROPIC_API_KEY): no model answers, but page and "
                'server tools run on request, e.g. /tool add_to_cart {"quantity": 2}'
            )
        else:
            self.stdout.write(f"agent:        {settings.OWLLAYER_MODEL} (Anthropic)")
