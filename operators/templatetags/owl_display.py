"""How the operator's and the tenant's pages show times and recorded actions.

``{{ moment|clock }}`` is the one way a time is written on those pages: the
time of day (UTC), with the full date and time on hover and in the <time>
element's datetime. ``{{ action.action|action_label }}`` turns a recorded
action's code (``session_end``) into words ("Session ended").
"""
from __future__ import annotations

from datetime import UTC, datetime

from django import template
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.html import format_html

register = template.Library()

CLOCK_FORMAT = "%H:%M:%S"
FULL_FORMAT = "%Y-%m-%d %H:%M:%S UTC"

ACTION_LABELS = {
    "session_end": "Session ended",
    "session_reload": "Page reloaded",
    "session_redirect": "Page sent elsewhere",
    "approval_approved": "Approved a tool call",
    "approval_denied": "Denied a tool call",
    "key_created": "Key created",
    "key_updated": "Key changed",
    "key_active": "Key re-activated",
    "key_disabled": "Key disabled",
    "key_revoked": "Key revoked",
    "member_added": "Member added",
    "member_role_changed": "Member's role changed",
    "member_removed": "Member removed",
}


def action_words(code: str) -> str:
    """A recorded action in words; an unknown code is shown readable, not hidden."""
    return ACTION_LABELS.get(code) or (code.replace("_", " ").capitalize() if code else "-")


@register.filter
def action_label(code) -> str:
    return action_words(str(code or ""))


@register.filter(is_safe=True)
def clock(moment) -> str:
    """<time datetime="..." title="2026-12-01 02:30:12 UTC">02:30:12</time>; "-" for no time.
    An ISO 8601 string (as stored in JSON, e.g. a page history) is read too."""
    if isinstance(moment, str):
        try:
            moment = parse_datetime(moment)
        except ValueError:
            moment = None
    if not isinstance(moment, datetime):
        return "-"
    if timezone.is_aware(moment):
        moment = moment.astimezone(UTC)
    return format_html('<time datetime="{}" title="{}">{}</time>', moment.isoformat(),
                       moment.strftime(FULL_FORMAT), moment.strftime(CLOCK_FORMAT))
