"""How the operator's and the tenant's pages show times and recorded actions.

A moment is written one way on those pages, as everywhere in the admin and
the console: settings.DATETIME_FORMAT, "3 Dec 2026, 14:05", in the site's
time zone (UTC). ``{{ moment|moment }}`` writes it so; ``{{ moment|clock }}``,
for the lines of a conversation or a feed, writes the time of day to the
second ("14:05:12"). Both give the moment in full, its zone named, on hover
("3 Dec 2026, 14:05 UTC") and in the <time> element's datetime.
``{{ action.action|action_label }}`` turns a recorded action's code
(``session_end``) into words ("Session ended").
"""
from __future__ import annotations

from datetime import datetime

from django import template
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.formats import date_format
from django.utils.html import format_html

from aitp.transcript import action_words

register = template.Library()

CLOCK_FORMAT = "H:i:s"


@register.filter
def action_label(code) -> str:
    return action_words(str(code or ""))


def _local(moment) -> datetime | None:
    """The moment in the site's time zone; an ISO 8601 string (as stored in
    JSON, e.g. a page history) is read too. None for anything else."""
    if isinstance(moment, str):
        try:
            moment = parse_datetime(moment)
        except ValueError:
            moment = None
    if not isinstance(moment, datetime):
        return None
    return timezone.localtime(moment) if timezone.is_aware(moment) else moment


def in_full(moment: datetime) -> str:
    """ "3 Dec 2026, 14:05 UTC": the one format, with its zone."""
    zone = moment.tzname() or timezone.get_current_timezone_name()
    return f"{date_format(moment, 'DATETIME_FORMAT')} {zone}"


def _time(moment, shown_format: str) -> str:
    local = _local(moment)
    if local is None:
        return "-"
    return format_html('<time datetime="{}" title="{}">{}</time>', local.isoformat(), in_full(local),
                       date_format(local, shown_format))


@register.filter(is_safe=True)
def clock(moment) -> str:
    """<time datetime="..." title="1 Dec 2026, 02:30 UTC">02:30:12</time>; "-" for no time."""
    return _time(moment, CLOCK_FORMAT)


@register.filter(name="moment", is_safe=True)
def moment_filter(moment) -> str:
    """<time datetime="..." title="1 Dec 2026, 02:30 UTC">1 Dec 2026, 02:30</time>; "-" for no time."""
    return _time(moment, "DATETIME_FORMAT")


@register.filter
def dollars(micros) -> str:
    """Millionths of a US dollar as "$0.0123"; "-" when there is no price."""
    if micros is None or micros == "":
        return "-"
    return f"${int(micros) / 1_000_000:,.4f}"
