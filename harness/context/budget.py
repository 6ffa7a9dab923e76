"""Budgets: tokens, cost and wall time for one run, counted over the whole session tree.

One ``Budget`` is made when a root session's turn starts and handed down to every child
session the turn spawns (like a cancel scope, it is shared by reference: each runner adds
what its steps used). A runner checks it before each step; once spent, the next step is
the last, text only, and the run ends with reason ``budget``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Final

from harness.messages.model import Tokens

# What the last step's model is told once a budget is spent ({reason}: Budget.spent()).
BUDGET_PROMPT: Final = (
    "BUDGET REACHED. The budget for this task ({reason}) is used up, so tools are disabled "
    "now. Do not call any tool. Answer with text only: say that the budget was reached, "
    "summarise what was done, list what remains, and recommend next steps."
)


@dataclass
class Budget:
    tokens: int | None = None
    cost: float | None = None
    seconds: float | None = None
    used_tokens: int = 0
    used_cost: float = 0.0
    started: float = field(default_factory=time.monotonic)

    @property
    def limited(self) -> bool:
        return any(limit is not None for limit in (self.tokens, self.cost, self.seconds))

    def add(self, tokens: Tokens, cost: float) -> None:
        self.used_tokens += tokens.total
        self.used_cost += cost

    def spent(self) -> str | None:
        """Which limit is reached, said for people; None while there is budget left."""
        if self.tokens is not None and self.used_tokens >= self.tokens:
            return f"the token budget ({self.used_tokens} of {self.tokens}) is spent"
        if self.cost is not None and self.used_cost >= self.cost:
            return f"the cost budget (${self.used_cost:.4f} of ${self.cost:.4f}) is spent"
        elapsed = time.monotonic() - self.started
        if self.seconds is not None and elapsed >= self.seconds:
            return f"the time budget ({elapsed:.1f} s of {self.seconds:.1f} s) is spent"
        return None
