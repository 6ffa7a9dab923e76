"""What a step tells the runner's loop: go on, compact and try again, or stop.

A step, a compaction and a re-run of interrupted calls each answer with one of these,
so the loop has one place that ends a turn and no string to compare against.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.messages.events import StopReason


@dataclass(frozen=True, slots=True)
class Next:
    """The turn goes on: read the ledger again and take the next step."""

    compacted: bool = False  # the history was just compacted: not again for this step


@dataclass(frozen=True, slots=True)
class Overflow:
    """The provider said the request does not fit the model's window."""

    error: str


@dataclass(frozen=True, slots=True)
class Stop:
    """The turn ends, for ``reason``."""

    reason: StopReason
    error: str | None = None
    answer: str | None = None  # the final answer, when the ledger shows one


StepOutcome = Next | Overflow | Stop
