"""Usage per day and the server-side bar chart that draws it.

The chart is plain SVG geometry computed here (integers only, so template
localisation cannot change a coordinate); the chart needs no JavaScript.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta

from django.db.models import Sum
from django.db.models.functions import TruncDate
from django.utils.formats import date_format

from aitp.models import AudioSeconds, DailyUsage, TurnRecord
from tenants.models import Tenant

USAGE_DAYS = 30


@dataclass(frozen=True)
class DayUsage(AudioSeconds):
    date: date
    sessions: int = 0
    turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    # Voice: milliseconds of the users' speech heard and of the agent's audio sent.
    audio_heard_ms: int = 0
    audio_spoken_ms: int = 0
    # What the day's turns cost (millionths of USD); None: no turn of the day had a price.
    cost_micros: int | None = None

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def used(self) -> bool:
        return bool(self.sessions or self.turns or self.tokens or self.cache_read_tokens
                    or self.cache_write_tokens or self.audio_heard_ms or self.audio_spoken_ms
                    or self.cost_micros)


def daily_usage(tenant: Tenant, *, today: date, days: int = USAGE_DAYS) -> list[DayUsage]:
    """One entry per day, oldest first, ending today; a day without a row is all zeros."""
    first = today - timedelta(days=days - 1)
    rows = {
        row.date: row
        for row in DailyUsage.objects.filter(tenant=tenant, date__gte=first, date__lte=today)
    }
    costs = day_costs(tenant, first, today)
    result = []
    for offset in range(days):
        day = first + timedelta(days=offset)
        row = rows.get(day)
        if row is None:
            result.append(DayUsage(date=day, cost_micros=costs.get(day)))
            continue
        result.append(
            DayUsage(
                date=day,
                sessions=row.sessions,
                turns=row.turns,
                input_tokens=row.input_tokens,
                output_tokens=row.output_tokens,
                cache_read_tokens=row.cache_read_tokens,
                cache_write_tokens=row.cache_write_tokens,
                audio_heard_ms=row.audio_heard_ms,
                audio_spoken_ms=row.audio_spoken_ms,
                cost_micros=costs.get(day),
            )
        )
    return result


def day_costs(tenant: Tenant, first: date, last: date) -> dict[date, int]:
    """What the tenant's turns that ended each day (UTC) cost, in millionths of USD."""
    rows = (TurnRecord.objects
            .filter(session__tenant=tenant, ended_at__date__gte=first, ended_at__date__lte=last,
                    cost_micros__isnull=False)
            .annotate(day=TruncDate("ended_at")).values("day").annotate(total=Sum("cost_micros")))
    return {row["day"]: row["total"] for row in rows}


@dataclass(frozen=True)
class Bar:
    x: int
    y: int
    width: int
    height: int
    title: str


@dataclass(frozen=True)
class Tick:
    x: int  # the middle of its bar
    text: str
    anchor: str  # SVG text-anchor: start, middle or end


@dataclass(frozen=True)
class BarChart:
    width: int
    height: int
    plot_top: int
    baseline: int
    bars: list[Bar]
    max_value: int
    first_label: str
    last_label: str
    ticks: list[Tick]


BAR_WIDTH = 16
BAR_GAP = 4
PLOT_TOP = 14  # room for the maximum's label above the tallest bar
PLOT_HEIGHT = 120
LABEL_ROOM = 18  # room for the date labels under the baseline
TICK_EVERY = 7  # one date label a week: each fits under its bar without touching the next


def day_label(day: date) -> str:
    """A short date for the chart's axis: "3 Nov" (settings.MONTH_DAY_FORMAT)."""
    return date_format(day, "MONTH_DAY_FORMAT")


def day_title(day: date) -> str:
    """A day as every page writes one: "3 Nov 2026" (settings.DATE_FORMAT)."""
    return date_format(day, "DATE_FORMAT")


def bar_chart(values: list[int], labels: list[str], *, unit: str,
              tick_labels: list[str] | None = None, tick_every: int = TICK_EVERY) -> BarChart:
    """Bars scaled to the largest value; a non-zero value is always at least 1px tall.
    Every ``tick_every``-th bar counted back from the last one (which is
    always labelled) gets its ``tick_labels`` entry (default: its label)
    under it."""
    if len(values) != len(labels):
        raise ValueError("one label per value")
    top = max(values, default=0)
    baseline = PLOT_TOP + PLOT_HEIGHT
    bars = []
    for index, (value, label) in enumerate(zip(values, labels, strict=True)):
        height = 0
        if top > 0 and value > 0:
            height = max(1, round(value * PLOT_HEIGHT / top))
        bars.append(
            Bar(
                x=index * (BAR_WIDTH + BAR_GAP),
                y=baseline - height,
                width=BAR_WIDTH,
                height=height,
                title=f"{label}: {value} {unit}",
            )
        )
    width = max(1, len(values) * (BAR_WIDTH + BAR_GAP) - BAR_GAP)
    shown = tick_labels if tick_labels is not None and len(tick_labels) == len(labels) else labels
    ticks = []
    for index in range(len(values) - 1, -1, -max(1, tick_every)):
        middle = index * (BAR_WIDTH + BAR_GAP) + BAR_WIDTH // 2
        # The outermost labels are kept inside the picture.
        anchor = "end" if index == len(values) - 1 else ("start" if middle < 15 else "middle")
        ticks.append(Tick(x=width if anchor == "end" else (0 if anchor == "start" else middle),
                          text=shown[index], anchor=anchor))
    ticks.reverse()
    return BarChart(
        width=width,
        height=baseline + LABEL_ROOM,
        plot_top=PLOT_TOP,
        baseline=baseline,
        bars=bars,
        max_value=top,
        first_label=labels[0] if labels else "",
        last_label=labels[-1] if labels else "",
        ticks=ticks,
    )
