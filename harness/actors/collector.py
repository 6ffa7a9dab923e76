"""A daemon's garbage collection: young passes rarer, full ones out of its busy moments.

Measured in ``benchmarks/cluster.py`` (2 daemons, 1,000 sessions, 3 steps): while turns
start, the heap grows fast and CPython's collector walks all of it, one to two times per
daemon, for 100-200 ms each (longer on a loaded machine). Every step in flight waits
through each pass. With the automatic full passes off, the step overhead went from
83/336 ms (p50/p99) to 60/160 ms, and the daemons' CPU from 5.3 to 4.3 ms a step.

So a daemon makes automatic full passes ten times rarer (``FULL_THRESHOLD``: the number of
middle-generation passes between two full ones, CPython's default being 10; its other
condition, 25 % growth of the old generation since the last full pass, still applies),
and makes one itself when its loop is idle (busy less than ``IDLE`` of the time) and one
would be due by CPython's default count.

And the youngest generation is collected every ``YOUNG_THRESHOLD`` allocations, not
CPython's 700: a daemon allocates a great deal for each prompt, turn and step and keeps
little of it; at 700 the collector ran ~250 times in 1,000 one-step turns, 0.5 ms of the
event loop's CPU a turn (11 %), against 0.18 ms at 10,000 (issue 18). Garbage that sits
in cycles waits a little longer.
"""

from __future__ import annotations

import gc

import trio

from harness.actors.admission import LoopLoad

YOUNG_THRESHOLD = 10_000  # allocations between two young passes (700 by default)
FULL_THRESHOLD = 100  # middle-generation passes before an automatic full one (10 by default)
IDLE = 0.05  # the loop's busy share under which a due full pass is made
LOOK_EVERY = 0.5  # seconds between looks at whether one is due


async def collect_when_idle(
    *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Run for the daemon's life; the collector's thresholds go back as they were after."""
    first, second, default = gc.get_threshold()
    load = LoopLoad(window=1.0)  # idle over about a second, not between two batches
    trio.lowlevel.add_instrument(load)
    gc.set_threshold(max(first, YOUNG_THRESHOLD), second, max(default, FULL_THRESHOLD))
    try:
        task_status.started()
        while True:
            await trio.sleep(LOOK_EVERY)
            if gc.isenabled() and gc.get_count()[2] >= default and load.share() < IDLE:
                gc.collect()
    finally:
        gc.set_threshold(first, second, default)
        trio.lowlevel.remove_instrument(load)
