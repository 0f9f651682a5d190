"""What a turn's tokens cost: the model's prices (US dollars per million
tokens of each kind, from OWLLAYER_MODEL_PRICES) times its tokens.

A price names a model or the start of its name: ``claude-sonnet-4-5``
prices ``claude-sonnet-4-5-20250929`` too; the longest name that fits wins.
Per million tokens times tokens is millionths of a dollar, kept as whole
numbers (``TurnRecord.cost_micros``).
"""
from __future__ import annotations

from collections.abc import Iterable

from aitp.llm import Usage

# (model or model prefix, input, output, cache read, cache write), USD per million tokens.
PriceRow = tuple[str, float, float, float, float]


def price_of(prices: Iterable[PriceRow], model: str) -> PriceRow | None:
    best = None
    for row in prices:
        if model.startswith(row[0]) and (best is None or len(row[0]) > len(best[0])):
            best = row
    return best


def cost_micros(price: PriceRow, usage: Usage) -> int:
    _, per_input, per_output, per_cache_read, per_cache_write = price
    return round(usage.input_tokens * per_input + usage.output_tokens * per_output
                 + usage.cache_read_tokens * per_cache_read + usage.cache_write_tokens * per_cache_write)
