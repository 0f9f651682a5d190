"""Telling a tenant something: an e-mail to its owners and a POST to its
alert webhook, whichever it has.

``notify_tenant`` is the one way out for an alert (the monthly budget's,
``aitp.budgets``; the next kind joins by its own ``kind`` name). It never
raises into its caller: a mail server that refuses, an owner without an
address, a webhook that does not answer are logged and the other way is
still tried. It blocks while it sends (SMTP, the webhook's timeout): call
it from a database thread (``db_call``), a command or a test, never on the
event loop.

The webhook's body is ``{"kind": kind, "tenant": slug, **data}`` as JSON,
signed with the tenant's ``alert_webhook_secret`` as a server tool's call is
signed with the tool's (``X-OwlLayer-Timestamp``, ``X-OwlLayer-Signature``),
and sent only to an address a server tool may use
(``OWLLAYER_WEBHOOK_ALLOWED_NETWORKS``): the approvals app sends it, through
``aitp.ports.webhooks``.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from django.core.mail import EmailMessage, get_connection

from aitp import ports
from tenants.models import Tenant, TenantMembership

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Notified:
    """What went out: how many owners were e-mailed, whether the webhook took it."""

    emails: int
    webhook: bool


def owner_addresses(tenant: Tenant) -> list[str]:
    """The e-mail addresses of the tenant's active owners (those that have one)."""
    rows = (
        TenantMembership.objects.filter(tenant=tenant, role=TenantMembership.Role.OWNER,
                                        user__is_active=True)
        .exclude(user__email="")
        .values_list("user__email", flat=True)
    )
    return sorted(set(rows))


def notify_tenant(tenant: Tenant, kind: str, subject: str, text: str, data: dict) -> Notified:
    """Send the alert ``kind``: ``subject`` and ``text`` by e-mail to each
    owner (one message each: owners do not see each other's addresses), and
    ``data`` to the tenant's alert webhook if it set one. Logs what failed."""
    emails = _email_owners(tenant, kind, subject, text)
    webhook = False
    if tenant.alert_webhook_url:
        try:
            ports.webhooks().post_notice(
                url=tenant.alert_webhook_url, secret=tenant.alert_webhook_secret,
                payload={"kind": kind, "tenant": tenant.slug, **data},
            )
            webhook = True
        except Exception as exc:  # logged, never raised into the caller
            logger.warning("alert %s tenant=%s: webhook not taken: %s", kind, tenant.slug, exc)
    logger.info("alert %s tenant=%s: %d e-mails, webhook %s", kind, tenant.slug, emails,
                "sent" if webhook else ("failed" if tenant.alert_webhook_url else "none"))
    return Notified(emails=emails, webhook=webhook)


def _email_owners(tenant: Tenant, kind: str, subject: str, text: str) -> int:
    try:
        addresses = owner_addresses(tenant)
        if not addresses:
            return 0
        messages = [EmailMessage(subject=subject, body=text, to=[address]) for address in addresses]
        with get_connection() as connection:
            return connection.send_messages(messages) or 0
    except Exception as exc:  # logged, never raised into the caller
        logger.warning("alert %s tenant=%s: e-mail not sent: %s", kind, tenant.slug,
                       type(exc).__name__)
        return 0
