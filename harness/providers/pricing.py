"""Prices per model, to turn a step's token usage into USD (the known ones are in the
provider table, ``harness.providers.table``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from harness.messages.model import Tokens


@dataclass(slots=True, frozen=True)
class Price:
    input: float  # USD per million input tokens
    output: float  # USD per million output tokens


class PriceTable:
    """Model name → Price. Names are matched exactly, with or without a provider prefix."""

    def __init__(self, prices: Mapping[str, Price] | None = None) -> None:
        self._prices: dict[str, Price] = dict(prices or {})

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

