"""One scripted ``read`` step, traced: its scheduler rounds and its Python calls by piece.

``step_turns.py`` gives a step's CPU; on shared cores that moves by more than most
changes to it. This gives what does not move: the deterministic work of a step of
``loop.py``'s 20-step read loop (the scripted provider, in this process).

``--rounds`` prints the 10th step as the event loop ran it: each task step (and where the
task then waits), each task spawned, each wait for I/O (a "round": an epoll wait and the
batch of task steps before it)::

    python benchmarks/step_trace.py --rounds

By default it counts the Python calls (``sys.setprofile``: Python functions and C
functions alike) of steps 2–20 of three turns (after one turn of warm-up), each call
given to the innermost of harness's own modules on the stack (so a pydantic validation
or a Trio channel operation counts for the piece that made it), and prints them a step::

    python benchmarks/step_trace.py
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import loop  # noqa: E402  (the fixtures of the loop benchmark)

STEPS = 20
TRACED_STEP = 10
# Where a call is counted: the first prefix (under harness/) its module path has.
PIECES = (
    ("history.py", "history (History.catch_up, .chat, .estimate)"),
    ("actors/recording.py", "recording (Recorder, Reply)"),
    ("actors/runner.py", "runner"),
    ("actors/tool_executor.py", "tool executor"),
    ("actors/permission.py", "permission actor and rules"),
    ("permissions/", "permission actor and rules"),
    ("tools/", "the read tool (paths, truncation)"),
    ("storage/", "ledger port (post, flush, reads, the writer task)"),
    ("actors/event_feed.py", "event feed"),
    ("logs.py", "logging"),
    ("actors/session.py", "session actor"),
    ("providers/", "provider (scripted) and retries"),
    ("messages/", "messages (events, ids, ask)"),
    ("secrets.py", "redaction"),
    ("runtime.py", "runtime (the writer's and the feed's tasks)"),
    ("actors/admission.py", "admission (its load instrument)"),
)
OUTSIDE = "Trio's run loop and scheduling (no harness frame)"


class _Provider:
    """The scripted provider, telling ``on_request`` of each request it is asked."""

    def __init__(self, inner: Any, on_request: Any) -> None:
        self._inner = inner
        self._on_request = on_request
        self.name = inner.name

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def stream(self, request: Any) -> Any:
        self._on_request()
        return self._inner.stream(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


def _turns(turns: int, on_request: Any, before: Any = None) -> None:
    base = Path(tempfile.mkdtemp(prefix="harness-trace-"))
    home = base / "home"
    os.environ["HARNESS_HOME"] = str(home)
    project = loop.make_project(base)
    script = loop.make_script(base, STEPS)

    import trio

    from harness.config import Config
    from harness.providers import create_provider
    from harness.runtime import open_harness

    config = Config(
        home=home,
        model=f"scripted:{script}",
        interactive=False,
        model_limits={"scripted": (10_000_000, 4_096)},
        provider_factory=lambda m: _Provider(create_provider(m), on_request),
    )

    async def main() -> None:
        async with open_harness(config) as h:
            if before is not None:
                before()
            for turn in range(turns):
                on_request(turn=turn)
                session = await h.create_session(project)
                result = await h.run(session.id, "read the files, then answer")
                if result.reason != "answered":
                    raise SystemExit(f"the turn did not run as scripted: {result}")

    trio.run(main)


def trace_rounds() -> None:
    import trio

    lines: list[str] = []
    state = {"requests": 0, "on": False}

    def on_request(turn: int | None = None) -> None:
        if turn is not None:
            state["requests"] = 0
            return
        state["requests"] += 1
        if state["requests"] in (TRACED_STEP, TRACED_STEP + 1):
            lines.append(f"--- request {state['requests']}")
        state["on"] = state["requests"] == TRACED_STEP

    def waits_at(task: trio.lowlevel.Task) -> str:
        where = []
        coro: Any = task.coro
        while coro is not None:
            frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)
            if frame is not None:
                name = frame.f_code.co_filename.rsplit("/", 1)[-1]
                where.append(f"{name}:{frame.f_lineno} {frame.f_code.co_name}")
            coro = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None)
        return " <- ".join(where[-3:])

    class Trace(trio.abc.Instrument):
        def before_task_step(self, task: trio.lowlevel.Task) -> None:
            if state["on"]:
                lines.append(f"  task  {task.name}")

        def after_task_step(self, task: trio.lowlevel.Task) -> None:
            if state["on"]:
                lines.append(f"          then waits at {waits_at(task)}")

        def task_spawned(self, task: trio.lowlevel.Task) -> None:
            if state["on"]:
                lines.append(f"  spawn {task.name}")

        def after_io_wait(self, timeout: float) -> None:
            if state["on"]:
                lines.append(f"round: I/O wait (timeout {timeout:g} s)")

    _turns(1, on_request, before=lambda: trio.lowlevel.add_instrument(Trace()))
    print("\n".join(lines))
    print(f"{sum(line.startswith('round') for line in lines)} rounds")


def count_calls(turns: int) -> None:
    import harness  # whichever tree this Python runs (``--base`` of step_turns.py: its own)

    harness_root = str(Path(harness.__file__).parent) + "/"
    counts: collections.Counter[str] = collections.Counter()
    pieces: dict[str, str] = {}
    state = {"requests": 0, "turn": 0, "on": False}

    def piece_of(filename: str) -> str:
        piece = pieces.get(filename)
        if piece is None:
            piece = ""
            if filename.startswith(harness_root):
                inside = filename[len(harness_root) :]
                piece = next((p for prefix, p in PIECES if inside.startswith(prefix)), inside)
            pieces[filename] = piece
        return piece

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if not state["on"] or event not in ("call", "c_call"):
            return
        at: FrameType | None = frame
        while at is not None:
            piece = piece_of(at.f_code.co_filename)
            if piece:
                counts[piece] += 1
                return
            at = at.f_back
        counts[OUTSIDE] += 1

    def on_request(turn: int | None = None) -> None:
        if turn is not None:
            state["turn"], state["requests"] = turn, 0
            return
        state["requests"] += 1
        # Steps 2–20 of every turn after the first: the step's own work, not a one-off.
        state["on"] = state["turn"] >= 1 and 2 <= state["requests"] <= STEPS

    _turns(turns + 1, on_request, before=lambda: sys.setprofile(profile))
    sys.setprofile(None)
    steps = turns * (STEPS - 1)
    print(f"{sum(counts.values()) / steps:,.0f} Python calls a step (the event loop's thread)")
    for piece, calls in counts.most_common():
        print(f"{calls / steps:7,.0f}  {piece}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", action="store_true", help="trace one step's rounds")
    parser.add_argument("--turns", type=int, default=3, help="turns counted (calls)")
    args = parser.parse_args(argv)
    if args.rounds:
        trace_rounds()
    else:
        count_calls(args.turns)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
