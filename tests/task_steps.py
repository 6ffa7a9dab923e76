"""Counting a task's scheduler steps, for tests that count trips between actors.

Trio instruments see every task step deterministically, where CPU time on shared cores
cannot: a test that says "this makes no round trip" counts them.
"""

from __future__ import annotations

import trio


class TaskSteps(trio.abc.Instrument):
    """How many times tasks whose name ends with ``name`` were scheduled."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.count = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task.name.endswith(self.name):
            self.count += 1
