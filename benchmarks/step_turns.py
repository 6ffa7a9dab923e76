"""A step's CPU, before/after on a shared machine: many turns, interleaved trees, the best.

``loop.py`` takes (CPU(N steps) − CPU(0 steps)) / N over fresh processes, which on a
loaded 2-core box swings by a millisecond a step. This runs several turns in one
process (one harness, a session per turn, ``loop.py``'s fixtures and wire server) and
takes each turn's CPU between its second and its last request (every thread: the ledger
writer's commits too), so start-up and the first step's one-off work are out; then the
best (and the first quartile) over all turns of all rounds, the trees taking turns::

    python benchmarks/step_turns.py                      # this tree, 4 rounds x 8 turns of 20
    python benchmarks/step_turns.py --base ../main/.venv/bin/python --steps 200 --turns 2

``--base`` names the Python of another checkout (its own venv, its harness) to run
interleaved with this one. For turns of 40 steps or more, steps 1–20 and the last 20 are
reported as well (the flatness of one turn).

``--count`` adds what CPU time on shared cores cannot show steadily, a step's ledger
transactions (each a worker-thread round trip, a feed publish and the subscribers it
wakes) and the event loop's rounds (its waits for I/O), counted over the same steps::

    python benchmarks/step_turns.py --base ../base/.venv/bin/python --count --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import loop  # noqa: E402  (the fixtures and the wire server of the loop benchmark)


class _Counts:
    """Ledger transactions and event-loop rounds, as running totals (``--count``)."""

    def __init__(self) -> None:
        self.commits = 0
        self.rounds = 0

    def install(self) -> None:
        import trio

        from harness.storage.ledger import Ledger

        counts = self
        # The backend's own commit, on whichever thread it runs (a step's on the loop's
        # since the ninth pass; a worker thread's before: ``_run_commit``).
        commit = Ledger._commit

        def counted(port: Ledger, batch: list[Any]) -> Any:
            counts.commits += 1
            return commit(port, batch)

        Ledger._commit = counted  # type: ignore[method-assign]

        class Rounds(trio.abc.Instrument):
            def after_io_wait(self, timeout: float) -> None:
                counts.rounds += 1

        trio.lowlevel.add_instrument(Rounds())


def turns_child(steps: int, turns: int, wire: str | None, count: bool = False) -> None:
    """In this process: ``turns`` turns of ``steps`` reads; print each one's figures."""
    base = Path(tempfile.mkdtemp(prefix="harness-turns-"))
    home = base / "home"
    os.environ["HARNESS_HOME"] = str(home)
    os.environ["MISTRAL_API_KEY"] = "bench-key"  # the local server takes any key
    project = loop.make_project(base)
    script = loop.make_script(base, steps)

    import trio

    from harness.config import Config
    from harness.providers import create_provider
    from harness.runtime import open_harness

    if wire is not None:
        import harness.providers.mistral  # noqa: F401  (imported before any turn)

    stamps: list[float] = []
    counts = _Counts()
    # Each request's running totals, noted with its CPU stamp (``--count``).
    marks: list[tuple[int, int]] = []

    model = f"scripted:{script}" if wire is None else loop.WIRE_MODEL
    base_url = None if wire is None else f"{wire}/{secrets.token_hex(6)}/s{steps}"
    config = Config(
        home=home,
        model=model,
        interactive=False,
        model_limits={"scripted": (10_000_000, 4_096), loop.WIRE_MODEL: (10_000_000, 4_096)},
        provider_factory=lambda m: _Marked(
            loop.Stamped(create_provider(m, base_url=base_url), stamps), counts, marks
        ),
    )
    rows: list[dict[str, float]] = []

    async def main() -> None:
        if count:
            counts.install()
        async with open_harness(config) as h:
            for _ in range(turns):
                stamps.clear()
                marks.clear()
                session = await h.create_session(project)
                result = await h.run(session.id, "read the files, then answer")
                if result.reason != "answered" or len(stamps) != steps + 1:
                    raise SystemExit(f"the turn did not run as scripted: {result}")
                row = {"steps 2–N": (stamps[steps] - stamps[1]) / (steps - 1)}
                if steps >= 40:
                    row["steps 1–20"] = (stamps[21] - stamps[1]) / 20
                    row["last 20"] = (stamps[steps] - stamps[steps - 20]) / 20
                if count:
                    for name, which in (("transactions", 0), ("loop rounds", 1)):
                        row[name] = (marks[steps][which] - marks[1][which]) / (steps - 1)
                        if steps >= 40:
                            late = marks[steps][which] - marks[steps - 20][which]
                            row[f"{name}, last 20"] = late / 20
                rows.append(row)

    trio.run(main)
    print(json.dumps(rows))


class _Marked:
    """A provider, noting the running counts when each request is made (``--count``)."""

    def __init__(self, inner: Any, counts: _Counts, marks: list[tuple[int, int]]) -> None:
        self._inner = inner
        self._counts = counts
        self._marks = marks
        self.name = inner.name

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def stream(self, request: Any) -> Any:
        self._marks.append((self._counts.commits, self._counts.rounds))
        return self._inner.stream(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


def run_tree(
    python: str, steps: int, turns: int, wire: str | None, count: bool = False
) -> list[dict[str, float]]:
    command = [python, __file__, "--child", str(steps), str(turns)]
    if wire is not None:
        command += ["--wire", wire]
    if count:
        command.append("--count")
    env = dict(os.environ)
    env.pop("HARNESS_MODEL", None)
    done = subprocess.run(
        command, capture_output=True, text=True, env=env, cwd=tempfile.gettempdir()
    )
    if done.returncode != 0:
        raise SystemExit(f"{python}: the turns failed:\n{done.stderr[-3000:]}")
    rows: list[dict[str, float]] = json.loads(done.stdout.strip().splitlines()[-1])
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--turns", type=int, default=8, help="turns per process")
    parser.add_argument("--rounds", type=int, default=4, help="processes per tree and path")
    parser.add_argument("--path", choices=loop.PATHS, action="append")
    parser.add_argument("--base", help="the Python of another checkout, run interleaved")
    parser.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)
    parser.add_argument("--wire", help=argparse.SUPPRESS)
    parser.add_argument(
        "--count", action="store_true", help="also count transactions and loop rounds a step"
    )
    args = parser.parse_args(argv)
    if args.child:
        turns_child(args.child[0], args.child[1], args.wire, args.count)
        return 0
    if args.steps < 2:
        parser.error("--steps must be at least 2")
    trees = {"this tree": sys.executable}
    if args.base:
        trees = {"base": args.base, **trees}
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    with loop.WireServerProcess() as root:
        for _ in range(args.rounds):
            for path in args.path or loop.PATHS:
                for name, python in trees.items():
                    wire = root if path == "wire" else None
                    results.setdefault((path, name), []).extend(
                        run_tree(python, args.steps, args.turns, wire, args.count)
                    )
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"CPU per step, ms: best / first quartile of {args.rounds} x {args.turns} turns of "
          f"{args.steps} steps (load {load})")
    for (path, name), rows in results.items():
        cells = []
        for key in rows[0]:
            if key.startswith(("transactions", "loop rounds")):
                median = statistics.median(row[key] for row in rows)
                cells.append(f"{key} {median:.2f}")
                continue
            values = [row[key] * 1000 for row in rows]
            quartile = (
                statistics.quantiles(values, n=4, method="inclusive")[0]
                if len(values) > 1
                else values[0]
            )
            cells.append(f"{key} {min(values):.2f} / {quartile:.2f}")
        print(f"  {path:9} {name:10} " + "   ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
