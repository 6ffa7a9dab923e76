"""Prices per model, to turn a step's token usage into USD."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from harness.messages.model import Tokens


@dataclass(slots=True, frozen=True)
class Price:
    input: float  # USD per million input tokens
    output: float  # USD per million output tokens


# Mistral's list prices as last known here (USD per million tokens, input/output). They
# change and may be stale: pass your own PriceTable to correct them. Unknown models cost
# 0.0, which callers should show as "no price" rather than "free" where it matters.
MISTRAL_PRICES: Mapping[str, Price] = {
    "mistral-large-latest": Price(0.5, 1.5),
    "mistral-medium-latest": Price(0.4, 2.0),
    "mistral-small-latest": Price(0.1, 0.3),
    "devstral-medium-latest": Price(0.4, 2.0),
    "devstral-small-latest": Price(0.1, 0.3),
    "codestral-latest": Price(0.3, 0.9),
    "magistral-medium-latest": Price(2.0, 5.0),
    "magistral-small-latest": Price(0.5, 1.5),
}


class PriceTable:
    """Model name → Price. Names are matched exactly, with or without a provider prefix."""

    def __init__(self, prices: Mapping[str, Price] | None = None) -> None:
        self._prices: dict[str, Price] = dict(prices or {})

    @classmethod
    def mistral(cls) -> PriceTable:
        return cls(MISTRAL_PRICES)

    def updated(self, prices: Mapping[str, Price]) -> PriceTable:
        return PriceTable({**self._prices, **prices})

    def get(self, model: str) -> Price | None:
        found = self._prices.get(model)
        if found is None and "/" in model:
            found = self._prices.get(model.split("/", 1)[1])
        return found

    def __contains__(self, model: str) -> bool:
        return self.get(model) is not None

    def cost(self, model: str, usage: Tokens) -> float:
        price = self.get(model)
        if price is None:
            return 0.0
        # Cached reads are billed as input here: a discount we do not know is not applied.
        input_tokens = usage.input + usage.cache_read + usage.cache_write
        output_tokens = usage.output + usage.reasoning
        return (input_tokens * price.input + output_tokens * price.output) / 1_000_000


DEFAULT_PRICES = PriceTable.mistral()


def cost(model: str, usage: Tokens, table: PriceTable = DEFAULT_PRICES) -> float:
    return table.cost(model, usage)
