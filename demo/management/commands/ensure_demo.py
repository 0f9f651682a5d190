"""``manage.py ensure_demo``: the demo tenant and one working key, for local use.

Keys are stored hashed, so an existing key cannot be shown again. The demo
key's plaintext is kept in ``.demo-key`` (mode 600, ignored by git) and reused
while it still matches an active demo key; otherwise a new key replaces it.
The console knows that key by the file (``aitp.selectors.is_the_demo_pages_key``)
and warns before it is revoked.

Several local servers on several ports share the database and so the key:
each run adds its port's origins to the key and never removes one, so a
second server never locks the first one's page out. A new key (the old one
revoked, disabled or expired, or its file deleted) allows every origin any
earlier demo key of the tenant allowed, revoked or not, plus this port's.

It also makes the two local sign-ins a newcomer needs: ``admin`` (a
superuser, for the admin and its live sessions) and ``demo-owner`` (owner of
the demo tenant, for the console). Their generated passwords are kept in
``.demo-logins`` (mode 600, ignored by git); an account that already exists
is never changed. The command ends by printing where the store, the admin
and the console are and how to sign in to each.
"""
from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.utils import timezone

from aitp import tenancy
from aitp.models import ApiKey
from aitp.store import keys
from demo.order_tools import demo_tools_install
from runtime.config import config
from tenants.models import Tenant
from widget.services import key_set_appearance

DEMO_SLUG = "demo"
DEMO_NAME = "Demo Store"
DEMO_KEY_NAME = "demo"
ADMIN_USERNAME = "admin"
OWNER_USERNAME = "demo-owner"
# What `make run` says of the agent without a model (OWLLAYER_LLM names it).
AGENT_LINES = {
    "demo": "demo (no ANTHROPIC_API_KEY): a scripted demo assistant answers a few plain requests "
            "and runs the page's tools; set ANTHROPIC_API_KEY and restart for Claude",
    "offline": "offline (OWLLAYER_LLM=offline): no model answers, but page and server tools run on "
               'request, e.g. /tool add_to_cart {"quantity": 2}',
}

# How the store's widget looks and speaks with a new demo key (the console
# changes it like any key's: docs/widget.md, appearance).
DEMO_APPEARANCE = {
    "name": "Shop assistant",
    "greeting": "Hi! I can find products, fill your cart, apply a coupon and pay for you. "
                "I always ask before paying.",
    "prompts": ["Show me the travel speaker", "Add two to my cart", "Pay for my order"],
}


@dataclass(frozen=True)
class DemoKey:
    tenant: Tenant
    key: ApiKey
    raw_key: str
    created: bool


def demo_origins(port: int) -> list[str]:
    return [f"http://localhost:{port}", f"http://127.0.0.1:{port}"]


def ensure_demo(*, key_file: Path, origins: list[str]) -> DemoKey:
    """Make sure the demo tenant has exactly one active demo key, allowing
    ``origins`` besides those it allowed already; return it."""
    with transaction.atomic():
        tenant = Tenant.objects.filter(slug=DEMO_SLUG).first()
        if tenant is None:
            tenant = tenancy.tenant_create(slug=DEMO_SLUG, name=DEMO_NAME)
        raw_key = _read_key(key_file)
        key = keys.api_key_lookup(raw_key) if raw_key else None
        created = not _is_usable_demo_key(key, tenant)
        demo_keys = tenant.api_keys.filter(name=DEMO_KEY_NAME)
        stale = demo_keys.filter(status=ApiKey.Status.ACTIVE)
        if created:
            # Every port an earlier demo key served stays allowed, whether
            # that key is still active or was revoked (from the console, or
            # by a run that lost the key file): those servers may still be
            # running, and their pages read the new key from the same file.
            served = [origin for old_key in demo_keys.order_by("pk")
                      for origin in old_key.allowed_origins]
            key, raw_key = tenancy.key_create(
                tenant=tenant, name=DEMO_KEY_NAME, allowed_origins=_merged(served, origins)
            )
            # The store's widget keeps the look an owner gave the last demo key.
            looks = [old_key.widget_appearance for old_key in demo_keys.exclude(pk=key.pk).order_by("-pk")
                     if old_key.widget_appearance]
            key_set_appearance(key=key, look=looks[0] if looks else DEMO_APPEARANCE)
        elif not set(origins) <= set(key.allowed_origins):
            key = tenancy.key_update(
                key=key, changes={"allowed_origins": _merged(key.allowed_origins, origins)}
            )
        # Older demo keys (from a lost or deleted key file) stop working.
        for old_key in stale.exclude(pk=key.pk):
            tenancy.key_revoke(key=old_key)
        if created:
            # Inside the transaction: a key whose plaintext could not be
            # saved would be unusable, so it is not kept either.
            _write_key(key_file, raw_key)
    return DemoKey(tenant=tenant, key=key, raw_key=raw_key, created=created)


def _merged(kept: list[str], added: list[str]) -> list[str]:
    """``kept``, then what ``added`` adds, each once, in order."""
    return list(dict.fromkeys([*kept, *added]))


@dataclass(frozen=True)
class Login:
    username: str
    password: str | None  # None: the account existed before and is not ours to change


def ensure_logins(*, tenant: Tenant, logins_file: Path) -> tuple[Login, Login]:
    """The local superuser and the demo tenant's owner; new accounts get a
    generated password, saved to ``logins_file``."""
    from django.contrib.auth import get_user_model

    from tenants.models import TenantMembership

    User = get_user_model()
    saved = _read_logins(logins_file)
    logins = []
    with transaction.atomic():
        for username, superuser in ((ADMIN_USERNAME, True), (OWNER_USERNAME, False)):
            user = User.objects.filter(username=username).first()
            if user is None:
                password = secrets.token_urlsafe(12)
                create = User.objects.create_superuser if superuser else User.objects.create_user
                user = create(username=username, email="", password=password)
                saved[username] = password
            elif not (saved.get(username) and user.check_password(saved[username])):
                saved.pop(username, None)
            logins.append(Login(username, saved.get(username)))
            if not superuser:
                TenantMembership.objects.get_or_create(
                    tenant=tenant, user=user, defaults={"role": TenantMembership.Role.OWNER}
                )
        _write_secret(logins_file, "".join(f"{name} {word}\n" for name, word in saved.items()))
    return logins[0], logins[1]


def _read_logins(logins_file: Path) -> dict[str, str]:
    try:
        lines = logins_file.read_text().splitlines()
    except FileNotFoundError:
        return {}
    return dict(line.split(" ", 1) for line in lines if " " in line)


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
    _write_secret(key_file, raw_key + "\n")


def _write_secret(path: Path, text: str) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        # The mode given to open() applies only to a new file.
        os.fchmod(handle.fileno(), 0o600)
        handle.write(text)


class Command(BaseCommand):
    help = "Ensure the demo tenant and its key exist; print the key and the URLs to try."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--key-file",
            default=str(config().console.demo_key_file),
            help="where the demo key's plaintext is kept (default: $OWLLAYER_DEMO_KEY_FILE or .demo-key)",
        )
        parser.add_argument(
            "--logins-file",
            default=str(config().site.base_dir / ".demo-logins"),
            help="where the local sign-ins' generated passwords are kept (default: .demo-logins)",
        )
        parser.add_argument(
            "--port",
            default=os.environ.get("PORT") or "8000",
            help="the port the server listens on (default: $PORT or 8000)",
        )

    def handle(self, *args, key_file: str, logins_file: str, port: str, **options) -> None:
        try:
            port_number = int(port)
        except ValueError:
            raise CommandError(f"port must be a number, got {port!r}") from None
        if not 0 < port_number < 65536:
            raise CommandError(f"port must be between 1 and 65535, got {port_number}")
        demo = ensure_demo(key_file=Path(key_file), origins=demo_origins(port_number))
        # The shop's server-side tools (order lookup; cancelling needs approval).
        demo_tools_install(tenant=demo.tenant)
        base = f"127.0.0.1:{port_number}"
        ws_url = f"ws://{base}{config().protocol.ws_path}?apiKey={quote(demo.raw_key, safe='')}"
        state = f"new, saved to {key_file}" if demo.created else f"from {key_file}"
        self.stdout.write(f"demo tenant:  {demo.tenant.slug} ({demo.tenant.name})")
        self.stdout.write(f"demo key:     {demo.raw_key}  ({state})")
        self.stdout.write(f"websocket:    {ws_url}")
        name = config().llm.name
        agent = f"{config().agent.model} (Anthropic)" if name == "anthropic" else AGENT_LINES.get(name, name)
        self.stdout.write(f"agent:        {agent}")
        admin, owner = ensure_logins(tenant=demo.tenant, logins_file=Path(logins_file))
        self.stdout.write("")
        self.stdout.write(f"store:        http://{base}/demo/  (no sign-in; its chat uses the demo key)")
        self.stdout.write(
            f"admin:        http://{base}/admin/  {_sign_in(admin)}  "
            f"(operators: live sessions at /admin/live/)"
        )
        self.stdout.write(
            f"console:      http://{base}/console/  {_sign_in(owner)}  "
            f"(owner of {demo.tenant.name}: keys, usage, members)"
        )
        self.stdout.write(f"passwords:    kept in {logins_file}")


def _sign_in(login: Login) -> str:
    if login.password is None:
        return (f"user {login.username}, password unknown here (the account existed already; "
                f"set one: .venv/bin/python manage.py changepassword {login.username})")
    return f"user {login.username}, password {login.password}"
