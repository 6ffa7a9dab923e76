"""Admission of new turns: a daemon under load finishes the steps of its running turns
before it starts new ones.

A daemon is one Trio loop. Under a burst of prompts (issue 18: 1,000 prompts over two
daemons) the loop was measured ~92 % busy, running batches of 20-77 task steps that took
10-35 ms each; a step is a dozen or so scheduling hops (runner, executor, permission,
ledger writer, ...), each waiting for such a batch, so the steps of the turns already
going took 84/340 ms (p50/p99) more than the model did, against 14/52 ms once the prompts
had gone in. The extra work was each prompt's claim, user message and turn start (~9 ms
of loop time each), made beside those steps. So new turns wait while the loop is busy:

- *Busy* is the share of wall time the loop spent running tasks rather than waiting for
  I/O, an exponential average over ~``LOAD_WINDOW`` s, measured by a Trio instrument
  (two hooks per loop iteration, no task, no wake-up).
- A turn is admitted at once while the loop is less than ``BUSY`` busy and fewer than
  ``MAX_STARTING`` admitted turns have not reached their first step yet (a start is a
  claim, a commit and the turn's wiring: its cost shows in the load only once made, so
  the number in flight is capped too). With no load there is no wait at all.
- Otherwise it waits, first come first served. It is admitted when the load allows, or,
  once it has waited ``bound`` seconds, whatever the load, as soon as fewer than
  ``OVERDUE_STARTING`` turns are starting: no turn starves. Overdue turns go through a
  cap of their own because, let through all at once, they were a denser burst than the
  one the gate held back (measured: worse than no gate).

The figures chosen are a trade measured on both benchmarks (``benchmarks/cluster.py``):
a gate that holds turns while the loop still has idle time (``BUSY`` 0.6) cut the step
overhead of the 1,000-session burst most (p99 ~100 ms against ~330) but left capacity
unused, and cost up to 25 % of the throughput of the saturation run, whose 300 turns of
30 steps all start at once (a turn started late ends the run late); at 0.85, with a 2 s
bound, the saturation throughput is kept and the burst's p99 is about halved.

It is off unless asked for (``admission_seconds``, 0 by default). Once the prompts and
claims themselves had been made cheaper and the daemon's full GC passes moved (issue 18,
sixth pass), the gate's gain in that burst was small against what it cost, on a quiet
machine: step overhead p99 68-91 ms with it against 88-160 ms without, but claims p99
0.5-1.3 s against 65-82 ms, and one daemon at saturation ran a turn's start up to 2 s late
(300 x 30 steps over 1 and 2 daemons: x1.52 with it, x1.77 without). An operator who wants
the running turns' steps smooth at the price of slower starts turns it on.

Only the start waits: the prompt is durable (``inbox.added``) and answered before it
comes here. On a shared ledger the start waits before the lease is claimed, so a less
busy daemon can claim the session meanwhile (its tail's wake, or its scan of waiting
input; a busy daemon leaves both alone: ``accepting``).
"""

from __future__ import annotations

import math
import time
from collections import deque

import trio

BUSY = 0.85  # the loop's busy share past which new turns wait
MAX_STARTING = 8  # admitted turns not at their first step yet, at most (unless overdue)
OVERDUE_STARTING = 32  # the same, for turns that waited the bound
LOAD_WINDOW = 0.1  # seconds: the time constant of the busy share's average
TICK = 0.01  # seconds between looks at the load while turns wait
PER_TICK = 2  # turns let through a look at most: starts spread out, not in one batch


class LoopLoad(trio.abc.Instrument):
    """The share of wall time the Trio loop spends running tasks, as an exponential
    average with time constant ``window``: each stretch between two I/O waits counts as
    busy, each I/O wait as idle."""

    def __init__(self, window: float = LOAD_WINDOW) -> None:
        self._window = window
        self._share = 0.0
        self._since = time.perf_counter()  # the start of the stretch going on
        self._running = True  # whether that stretch runs tasks (not an I/O wait)

    def _close(self, now: float) -> float:
        weight = math.exp(-(now - self._since) / self._window)
        return self._share * weight + (1.0 - weight if self._running else 0.0)

    def before_io_wait(self, timeout: float) -> None:
        now = time.perf_counter()
        self._share, self._since, self._running = self._close(now), now, False

    def after_io_wait(self, timeout: float) -> None:
        now = time.perf_counter()
        self._share, self._since, self._running = self._close(now), now, True

    def share(self) -> float:
        """The busy share now, the stretch going on included."""
        return self._close(time.perf_counter())


class Admission:
    """An admitted turn's place among those starting: given back (``release``, once)
    when the turn reaches its first step, or ends or is dropped before."""

    def __init__(self, gate: TurnGate) -> None:
        self._gate: TurnGate | None = gate

    def release(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            gate._starting -= 1


class _Waiter:
    __slots__ = ("admitted", "event", "since")

    def __init__(self, since: float) -> None:
        self.since = since
        self.event = trio.Event()
        self.admitted = False


class TurnGate:
    """The daemon-wide admission of new turns (module docstring). ``bound``: the longest
    a turn waits, in seconds; 0 admits every turn at once (no gate)."""

    def __init__(
        self,
        bound: float = 0.0,
        *,
        busy: float = BUSY,
        starting: int = MAX_STARTING,
        overdue_starting: int = OVERDUE_STARTING,
    ) -> None:
        self.bound = bound
        self._busy = busy
        self._max_starting = starting
        self._max_overdue = max(overdue_starting, starting)
        self._load: LoopLoad | None = None  # installed by ``run``
        self._starting = 0
        self._waiting: deque[_Waiter] = deque()
        self._wake = trio.Event()
        # Counted for the benchmark and the tests: turns that waited, and those of them
        # admitted only because they had waited ``bound``.
        self.waited = 0
        self.overdue = 0

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def starting(self) -> int:
        return self._starting

    def load(self) -> float:
        return self._load.share() if self._load is not None else 0.0

    def accepting(self) -> bool:
        """Whether a new turn would be admitted now, without waiting: what another
        daemon's input, heard of through the shared ledger, is taken on by."""
        return self.room() > 0

    def room(self) -> int:
        """How many new turns would be admitted now, without waiting."""
        if self._load is None or self.bound <= 0:
            return 1 << 30
        if self._waiting or self.load() >= self._busy:
            return 0
        return max(self._max_starting - self._starting, 0)

    def _free(self) -> bool:
        return self._starting < self._max_starting and self.load() < self._busy

    def enter(self) -> Admission:
        """A turn admitted already, without waiting (its session taken over by the scan,
        which looked at the room itself): counted among those starting."""
        self._starting += 1
        return Admission(self)

    async def admit(self) -> Admission:
        """Wait until a new turn may start (at once when the loop has room)."""
        if self._load is None or self.bound <= 0 or (not self._waiting and self._free()):
            return self.enter()
        waiter = _Waiter(trio.current_time())
        self._waiting.append(waiter)
        self._wake.set()
        self.waited += 1
        try:
            await waiter.event.wait()
        except BaseException:
            if waiter.admitted:
                self._starting -= 1  # admitted as it was cancelled: nobody will start
            else:
                self._waiting.remove(waiter)
            raise
        return Admission(self)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Measure the loop's load and admit waiting turns, for as long as the daemon runs.

        With the gate off (``bound`` 0, the default) every turn is admitted at once and
        nothing reads the load: no instrument, whose two hooks would run on every round
        of the event loop (a tool step makes about ten) for nobody."""
        if self.bound <= 0:
            task_status.started()
            await trio.sleep_forever()
        load = LoopLoad()
        trio.lowlevel.add_instrument(load)
        self._load = load
        try:
            task_status.started()
            while True:
                if not self._waiting:
                    await self._wake.wait()
                    self._wake = trio.Event()
                await trio.sleep(TICK)
                self._admit_waiting(trio.current_time())
        finally:
            self._load = None
            for waiter in self._waiting:  # nobody measures any more: let them all go
                self._open(waiter)
            self._waiting.clear()
            trio.lowlevel.remove_instrument(load)

    def _admit_waiting(self, now: float) -> None:
        waiting = self._waiting
        for _ in range(PER_TICK):
            if not waiting:
                return
            if now - waiting[0].since < self.bound:
                if not self._free():
                    return
            elif self._starting >= self._max_overdue:
                return
            elif not self._free():
                self.overdue += 1
            self._open(waiting.popleft())

    def _open(self, waiter: _Waiter) -> None:
        waiter.admitted = True
        self._starting += 1
        waiter.event.set()
