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

from aitp.transcript import action_words

register = template.Library()

CLOCK_FORMAT = "%H:%M:%S"
FULL_FORMAT = "%Y-%m-%d %H:%M:%S UTC"


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
