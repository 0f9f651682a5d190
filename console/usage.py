"""Usage per day and the server-side bar chart that draws it.

The chart is plain SVG geometry computed here (integers only, so template
localisation cannot change a coordinate); the console has no JavaScript.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta

from aitp.models import DailyUsage
from tenants.models import Tenant

USAGE_DAYS = 30


@dataclass(frozen=True)
class DayUsage:
    date: date
    sessions: int = 0
    turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


def daily_usage(tenant: Tenant, *, today: date, days: int = USAGE_DAYS) -> list[DayUsage]:
    """One entry per day, oldest first, ending today; a day without a row is all zeros."""
    first = today - timedelta(days=days - 1)
    rows = {
        row.date: row
        for row in DailyUsage.objects.filter(tenant=tenant, date__gte=first, date__lte=today)
    }
    result = []
    for offset in range(days):
        day = first + timedelta(days=offset)
        row = rows.get(day)
        if row is None:
            result.append(DayUsage(date=day))
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
            )
        )
    return result


@dataclass(frozen=True)
class Bar:
    x: int
    y: int
    width: int
    height: int
    title: str


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


BAR_WIDTH = 16
BAR_GAP = 4
PLOT_TOP = 14  # room for the maximum's label above the tallest bar
PLOT_HEIGHT = 120
LABEL_ROOM = 18  # room for the date labels under the baseline


def bar_chart(values: list[int], labels: list[str], *, unit: str) -> BarChart:
    """Bars scaled to the largest value; a non-zero value is always at least 1px tall."""
    if len(values) != len(labels):
        raise ValueError("one label per value")
    top = max(values, default=0)
    baseline = PLOT_TOP + PLOT_HEIGHT
    bars = []
    for index, (value, label) in enumerate(zip(values, labels)):
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
    return BarChart(
        width=max(1, len(values) * (BAR_WIDTH + BAR_GAP) - BAR_GAP),
        height=baseline + LABEL_ROOM,
        plot_top=PLOT_TOP,
        baseline=baseline,
        bars=bars,
        max_value=top,
        first_label=labels[0] if labels else "",
        last_label=labels[-1] if labels else "",
    )
