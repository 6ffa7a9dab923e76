"""What file snapshots cost per step, in a 10,000-file repository.

Run from the repository root::

    python benchmarks/snapshots.py           # 10,000 files, 100 edit steps, 5 rounds
    python benchmarks/snapshots.py --quick   # 40 steps, 3 rounds
    python benchmarks/snapshots.py --check   # exit 1 when a step's snapshot cost is 5 ms or more

The repository: 100 directories of 100 Python files (about 1.6 kB, 60 lines each).

Per-step cost, end to end
    The real loop (actors, ledger file, tools) with the scripted provider at zero latency:
    N steps, each an ``edit`` of a different file of the repository, then a text answer.
    Run with snapshots on, and with them off (``touched_paths`` returning nothing for
    every tool, so the executor skips them), in alternation; each figure is the median of
    the rounds. CPU is ``getrusage(RUSAGE_SELF)`` user+sys, all threads (the ledger
    writer's compress-and-insert included); wall is the ``h.run`` time. The snapshot cost
    per step is (on − off) / N.

Per-step cost, the work itself
    The snapshot code of one ``edit`` step timed directly: read and hash the file before,
    read and hash it after, build the two events and the ``patch`` part (line counts), and
    compress and insert the new blobs (what the writer thread adds). Also for a step whose
    ``apply_patch`` touches 5 files.

Figures are written to ``benchmarks/results/snapshots.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import apsw
import trio

from harness.config import Config
from harness.messages.model import Rule
from harness.providers.scripted import ScriptedProvider
from harness.runtime import open_harness
from harness.snapshots import CallSnapshot, patch_part
from harness.storage.schema import MIGRATIONS
from harness.tools.apply_patch import ApplyPatchTool
from harness.tools.edit import EditTool
from harness.tools.write import WriteTool

FILES_PER_DIR = 100
DIRS = 100
RESULTS = Path(__file__).parent / "results" / "snapshots.json"


def make_repo(root: Path) -> list[Path]:
    files: list[Path] = []
    for d in range(DIRS):
        directory = root / f"pkg{d:03d}"
        directory.mkdir(parents=True)
        for f in range(FILES_PER_DIR):
            path = directory / f"mod{f:03d}.py"
            body = "".join(
                f"def function_{d}_{f}_{n}(x):\n    return x + {n}  # value_{d}_{f}_{n}\n\n"
                for n in range(20)
            )
            path.write_text(f'"""Module {d}/{f}."""\n\nVALUE_{d}_{f} = 0\n\n' + body)
            files.append(path)
    return files


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _edit_turns(root: Path, files: list[Path], steps: int, offset: int) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = []
    for step in range(steps):
        path = files[(offset + step * 97) % len(files)]
        d, f = int(path.parent.name[3:]), int(path.stem[3:])
        old = f"VALUE_{d}_{f} = {offset}"
        turns.append(
            {
                "tool_calls": [
                    {
                        "name": "edit",
                        "arguments": {
                            "path": str(path.relative_to(root)),
                            "old_string": old,
                            "new_string": f"VALUE_{d}_{f} = {offset + 1}",
                        },
                    }
                ]
            }
        )
    turns.append({"text": "done"})
    return turns


async def _run_loop(home: Path, root: Path, turns: list[dict[str, Any]]) -> tuple[float, float]:
    provider = ScriptedProvider.from_turns(turns)
    config = Config(
        home=home,
        model=f"scripted:{home / 'unused.json'}",
        provider_factory=lambda model: provider,
        rules=[Rule(permission="edit", pattern="*", action="allow")],
        interactive=False,
    )
    async with open_harness(config) as h:
        session = await h.create_session(root)
        cpu, wall = _cpu(), time.perf_counter()
        result = await h.run(session.id, "edit the files")
        cpu, wall = _cpu() - cpu, time.perf_counter() - wall
        assert result.reason == "answered", result
    return cpu, wall


def _set_snapshots(enabled: bool) -> None:
    for tool in (EditTool, WriteTool, ApplyPatchTool):
        if enabled:
            if "touched_paths" in tool.__dict__ and hasattr(tool, "_saved_touched"):
                tool.touched_paths = tool._saved_touched  # type: ignore[attr-defined,method-assign]
        else:
            tool._saved_touched = tool.__dict__["touched_paths"]  # type: ignore[attr-defined]
            tool.touched_paths = lambda self, args, ctx: []  # type: ignore[method-assign,assignment]


def end_to_end(root: Path, files: list[Path], steps: int, rounds: int) -> dict[str, Any]:
    """Alternate rounds with snapshots on and off; each round edits fresh values."""
    on: list[tuple[float, float]] = []
    off: list[tuple[float, float]] = []
    offset = 0
    with tempfile.TemporaryDirectory(prefix="snapbench-home") as homes:
        for index in range(rounds * 2):
            enabled = index % 2 == 0
            _set_snapshots(enabled)
            turns = _edit_turns(root, files, steps, offset)
            offset += 1
            home = Path(homes) / f"h{index}"
            figures = trio.run(_run_loop, home, root, turns)
            (on if enabled else off).append(figures)
        _set_snapshots(True)
    cpu_on = statistics.median(c for c, _ in on) / steps * 1000
    cpu_off = statistics.median(c for c, _ in off) / steps * 1000
    wall_on = statistics.median(w for _, w in on) / steps * 1000
    wall_off = statistics.median(w for _, w in off) / steps * 1000
    return {
        "steps": steps,
        "rounds": rounds,
        "cpu_ms_per_step_snapshots_on": round(cpu_on, 3),
        "cpu_ms_per_step_snapshots_off": round(cpu_off, 3),
        "cpu_ms_per_step_snapshot_cost": round(cpu_on - cpu_off, 3),
        "wall_ms_per_step_snapshots_on": round(wall_on, 3),
        "wall_ms_per_step_snapshots_off": round(wall_off, 3),
        "wall_ms_per_step_snapshot_cost": round(wall_on - wall_off, 3),
    }


def direct(root: Path, files: list[Path], touched: int, repeats: int = 200) -> dict[str, Any]:
    """The snapshot work of one step touching ``touched`` files, timed directly."""
    conn = apsw.Connection(":memory:")
    for statement in MIGRATIONS[0]:
        conn.execute(statement)
    times: list[float] = []
    for repeat in range(repeats):
        paths = [files[(repeat * 131 + k * 7) % len(files)] for k in range(touched)]
        start = time.perf_counter()
        snapshot = CallSnapshot.capture("ses", "msg", f"call{repeat}", paths)
        _, before_blobs = snapshot.before_event()
        elapsed = time.perf_counter() - start
        for path in paths:  # the tool's own change, not timed
            path.write_text(path.read_text().replace(" = ", " =  ", 1))
        start = time.perf_counter()
        _, after_blobs = snapshot.after_event()
        patch_part("ses", "msg", root, [snapshot])
        with conn:
            for digest, data in [*before_blobs, *after_blobs]:
                if not conn.execute("SELECT 1 FROM blobs WHERE hash = ?", (digest,)).fetchall():
                    conn.execute(
                        "INSERT INTO blobs(hash, size, data) VALUES (?, ?, ?)",
                        (digest, len(data), zlib.compress(data, 1)),
                    )
        elapsed += time.perf_counter() - start
        times.append(elapsed * 1000)
    times.sort()
    return {
        "files_touched": touched,
        "p50_ms": round(statistics.median(times), 3),
        "p95_ms": round(times[int(len(times) * 0.95)], 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    steps, rounds = (40, 3) if args.quick else (100, 5)
    with tempfile.TemporaryDirectory(prefix="snapbench-repo") as tmp:
        root = Path(tmp) / "repo"
        started = time.perf_counter()
        files = make_repo(root)
        made = time.perf_counter() - started
        print(f"repository: {len(files)} files ({made:.1f} s to create)", file=sys.stderr)
        loop = end_to_end(root, files, steps, rounds)
        one = direct(root, files, 1)
        five = direct(root, files, 5)
    result = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "repository_files": len(files),
        "loop": loop,
        "direct_one_file": one,
        "direct_five_files": five,
    }
    print(json.dumps(result, indent=2))
    if not args.quick:
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    if args.check and (
        loop["cpu_ms_per_step_snapshot_cost"] >= 5 or loop["wall_ms_per_step_snapshot_cost"] >= 5
    ):
        print("snapshot cost per step is 5 ms or more", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
