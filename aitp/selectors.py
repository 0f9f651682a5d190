"""Reads of the protocol's records shared by the admin, the console and the
operator pages. Who may see or change which tenant is ``tenants.selectors``."""
from __future__ import annotations

from pathlib import Path

from aitp import visitors
from aitp.models import ApiKey, ConversationMessage, Session
from aitp.store import keys
from runtime.config import config
from tenants.models import Tenant, TenantMembership


def session_conversation(session: Session):
    return session.messages.order_by("seq")


def is_the_demo_pages_key(key: ApiKey, key_file: Path | None = None) -> bool:
    """Whether ``key`` is the one saved in the demo key file
    (``OWLLAYER_DEMO_KEY_FILE``, .demo-key), which the demo store's pages use
    (``manage.py ensure_demo`` writes it; the console warns before revoking it)."""
    try:
        raw_key = (key_file or config().console.demo_key_file).read_text().strip()
    except FileNotFoundError:
        return False
    if not raw_key.startswith(key.prefix):
        return False
    found = keys.api_key_lookup(raw_key)
    return found is not None and found.pk == key.pk


def visitor_secret(tenant_id: int) -> str:
    return Tenant.objects.filter(pk=tenant_id).values_list("visitor_secret", flat=True).first() or ""


def visitor_earlier(tenant_id: int, visitor_id: str, *, before_session: str) -> list[visitors.Earlier]:
    """The visitor's latest conversations before this session, newest first,
    with their messages (aitp.visitors.earlier_account)."""
    sessions = list(Session.objects.filter(tenant_id=tenant_id, visitor_id=visitor_id)
                    .exclude(id=before_session).order_by("-started_at")
                    .only("id", "started_at")[:visitors.EARLIER_CONVERSATIONS])
    messages: dict[str, list] = {s.id: [] for s in sessions}
    for message in ConversationMessage.objects.filter(session_id__in=list(messages)).order_by("seq") \
            .only("session_id", "role", "turn", "content"):
        messages[message.session_id].append(message)
    return [visitors.Earlier(s.started_at, messages[s.id]) for s in sessions]


def visitor_last_conversation(tenant_id: int, visitor_id: str) -> Session | None:
    """The visitor's latest session that holds a message."""
    return (Session.objects.filter(tenant_id=tenant_id, visitor_id=visitor_id, messages__isnull=False)
            .order_by("-started_at").distinct().first())


def is_member_of_keys_tenant(user_id: int, key_id: int) -> bool:
    """Whether this user, still active, is still a member of the tenant of
    this key: what a preview ticket made for them vouches for (aitp.preview)."""
    return TenantMembership.objects.filter(user_id=user_id, user__is_active=True,
                                           tenant__api_keys__pk=key_id).exists()
