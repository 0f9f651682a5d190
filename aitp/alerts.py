"""Telling a tenant something: an e-mail to its owners and a POST to its
alert webhook, whichever it has.

``notify_tenant`` is the one way out for an alert: the monthly budget's
(``aitp.budgets``), a chat whose agent asked for a person
(``handoff_requested``) and an approval waiting for an operator
(``approval_waiting``); the next kind joins by its own ``kind`` name. It
never raises into its caller: a mail server that refuses, an owner without
an address, a webhook that does not answer are logged and the other way is
still tried. It blocks while it sends (SMTP, the webhook's timeout and its
retries): call it from a database thread (``db_call``), a command, a test,
or through ``send_in_background``, never on the event loop.

The webhook's body is ``{"kind": kind, "tenant": slug, "text": line, **data}``
as JSON (``text``, one line, is what Slack-compatible incoming webhooks
show), signed with the tenant's ``alert_webhook_secret`` as a server tool's
call is signed with the tool's (``X-OwlLayer-Timestamp``,
``X-OwlLayer-Signature``), and sent only to an address a server tool may use
(``OWLLAYER_WEBHOOK_ALLOWED_NETWORKS``): the approvals app sends it, through
``aitp.ports.webhooks``. It is tried up to three times (``RETRY_WAITS``)
until an answer in 2xx; an address the rules refuse is not tried again.
Each notice to the webhook is an ``AlertDelivery`` row: its attempts and how
it ended.
"""
from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from django.core.mail import EmailMessage, get_connection
from django.db import connections
from django.utils import timezone

from aitp import ports
from aitp.models import AlertDelivery, Session
from tenants.models import Tenant, TenantMembership

logger = logging.getLogger(__name__)

HANDOFF_REQUESTED = "handoff_requested"
APPROVAL_WAITING = "approval_waiting"

# Seconds waited before the second and the third attempt at the webhook:
# long enough for a receiver restarting, short enough that a chat waiting
# for a person is not told late.
RETRY_WAITS: tuple[float, ...] = (1.0, 3.0)
# The approvals app's words (approvals.webhooks) for a url its rules refuse:
# asking again would be refused again.
REFUSED = ("the webhook address is not allowed", "webhook url must be http or https")
_ANSWERED = re.compile(r"webhook answered (\d{3})")


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


def notify_tenant(tenant: Tenant, kind: str, subject: str, text: str, data: dict, *,
                  line: str = "") -> Notified:
    """Send the alert ``kind``: ``subject`` and ``text`` by e-mail to each
    owner (one message each: owners do not see each other's addresses), and
    ``line`` (the subject when empty) with ``data`` to the tenant's alert
    webhook if it set one. Logs what failed."""
    emails = _email_owners(tenant, kind, subject, text)
    webhook = False
    if tenant.alert_webhook_url:
        payload = {"kind": kind, "tenant": tenant.slug, "text": _slack_text(line or subject), **data}
        webhook = _post_webhook(tenant, kind, payload)
    logger.info("alert %s tenant=%s: %d e-mails, webhook %s", kind, tenant.slug, emails,
                "sent" if webhook else ("failed" if tenant.alert_webhook_url else "none"))
    return Notified(emails=emails, webhook=webhook)


def send_in_background(fn: Callable[..., object], *args: object) -> threading.Thread:
    """Run the alert ``fn(*args)`` on a thread of its own, so the caller (the
    event loop, a request's transaction's ``on_commit``) never waits for the
    mail server or the webhook's retries. What fails there is logged."""
    def run() -> None:
        try:
            fn(*args)
        except Exception:  # logged: nobody waits for this thread
            logger.exception("alert %s%r failed", getattr(fn, "__name__", fn), args)
        finally:
            # The thread's own database connection, not left to the end of the process.
            connections.close_all()

    thread = threading.Thread(target=run, name=f"owllayer-alert-{getattr(fn, '__name__', 'alert')}",
                              daemon=True)
    thread.start()
    return thread


# --- the alerts -----------------------------------------------------------------


def live_path(session_id: str) -> str:
    """The admin's live page of a session: where an operator takes a chat
    over or decides its approvals."""
    return f"/admin/live/{session_id}/"


def handoff_requested(session_id: str) -> Notified | None:
    """The agent of ``session_id`` asked for a person: tell its tenant.
    None when the session is gone or nobody waits for a person any more
    (an operator took the chat over first)."""
    session = Session.objects.select_related("tenant").filter(pk=session_id).first()
    if session is None or session.handoff_requested_at is None:
        return None
    tenant, path = session.tenant, live_path(session_id)
    reason = _one_line(session.handoff_reason) or "none given"
    subject = f"{_one_line(tenant.name)}: a page user asked for a person (session {session_id})"
    text = (
        f"The assistant on a page of {tenant.name} asked for a person to join the chat.\n\n"
        f"Session: {session_id}\n"
        f"Reason: {reason}\n"
        f"Page: {session.current_url or session.origin or 'unknown'}\n\n"
        f"An operator takes the chat over on its live page in the admin: {path}\n"
        "Until one does, the assistant goes on answering.\n"
    )
    line = f"{tenant.name}: a page user asked for a person (reason: {reason}). Open {path}"
    return notify_tenant(tenant, HANDOFF_REQUESTED, subject, text, {
        "session_id": session_id, "reason": session.handoff_reason, "admin_path": path,
        "requested_at": session.handoff_requested_at.isoformat(),
    }, line=line)


def approval_waiting(tenant_id: int, session_id: str, approval_id: int, tool_name: str, risk: str,
                     deadline: datetime) -> Notified | None:
    """An approval that needs an operator was opened: tell its tenant. None
    when the tenant is gone."""
    tenant = Tenant.objects.filter(pk=tenant_id).first()
    if tenant is None:
        return None
    path = live_path(session_id)
    until = deadline.astimezone(UTC).strftime("%H:%M:%S UTC")
    subject = f"{_one_line(tenant.name)}: an approval waits for an operator ({tool_name})"
    text = (
        f"The assistant on a page of {tenant.name} wants to run {tool_name} (risk: {risk}), "
        "which needs an operator's approval.\n\n"
        f"Session: {session_id}\n"
        f"Approval: {approval_id}\n"
        f"Decide before: {until}\n\n"
        f"Approve or deny it on the session's live page in the admin: {path}\n"
        "Undecided by then, the call does not run.\n"
    )
    line = (f"{tenant.name}: {tool_name} (risk: {risk}) waits for an operator's approval until "
            f"{until}. Open {path}")
    return notify_tenant(tenant, APPROVAL_WAITING, subject, text, {
        "session_id": session_id, "approval_id": approval_id, "tool": tool_name, "risk": risk,
        "deadline": deadline.isoformat(), "admin_path": path,
    }, line=line)


# --- sending --------------------------------------------------------------------


def _one_line(text: str) -> str:
    """Text from a page or a form, fit for a subject or a line: no line breaks."""
    return " ".join(text.split())


def _slack_text(line: str) -> str:
    """Slack reads ``<...>`` as a link and ``&`` as an entity: written as
    text, so words from a page can never make a link in the tenant's channel."""
    return _one_line(line).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _post_webhook(tenant: Tenant, kind: str, payload: dict) -> bool:
    """POST ``payload`` until the webhook takes it, at most 1 + len(RETRY_WAITS)
    times, recording the delivery; whether it was taken."""
    delivery = _delivery_started(tenant, kind)
    attempts, error, status_code, taken = 0, "", None, False
    for wait in (0.0, *RETRY_WAITS):
        if attempts:
            time.sleep(wait)
        attempts += 1
        try:
            ports.webhooks().post_notice(url=tenant.alert_webhook_url, secret=tenant.alert_webhook_secret,
                                         payload=payload)
        except Exception as exc:  # logged and recorded, never raised into the caller
            error = str(exc) or type(exc).__name__
            answered = _ANSWERED.search(error)
            status_code = int(answered.group(1)) if answered else None
            logger.warning("alert %s tenant=%s: webhook not taken (attempt %d): %s", kind, tenant.slug,
                           attempts, error)
            if error in REFUSED or isinstance(exc, ports.PortMissing):
                break
        else:
            taken, error, status_code = True, "", None
            break
    _delivery_finished(delivery, attempts=attempts, taken=taken, error=error, status_code=status_code)
    return taken


def _delivery_started(tenant: Tenant, kind: str) -> int | None:
    try:
        return AlertDelivery.objects.create(tenant=tenant, kind=kind, url=tenant.alert_webhook_url[:500]).pk
    except Exception as exc:  # the alert still goes out unrecorded
        logger.warning("alert %s tenant=%s: delivery not recorded: %s", kind, tenant.slug, type(exc).__name__)
        return None


def _delivery_finished(delivery: int | None, *, attempts: int, taken: bool, error: str,
                       status_code: int | None) -> None:
    if delivery is None:
        return
    try:
        AlertDelivery.objects.filter(pk=delivery).update(
            attempts=attempts, status=AlertDelivery.Status.OK if taken else AlertDelivery.Status.FAILED,
            last_error=error[:500], status_code=status_code, finished_at=timezone.now(),
        )
    except Exception as exc:  # logged above already, attempt by attempt
        logger.warning("alert delivery %s: outcome not recorded: %s", delivery, type(exc).__name__)


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
