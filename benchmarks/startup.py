"""Start-up and memory of a real ``harness run``, this tree against another, interleaved.

Run from the repository root::

    python benchmarks/startup.py                       # this tree, 7 runs of each path
    python benchmarks/startup.py --base ../other-checkout  # and another tree's, run by run
    python benchmarks/startup.py --runs 11 --steps 20

Each run is one ``harness run`` process of ``benchmarks/loop.py`` (``cli_run``): the
scripted provider, then ``mistral/…`` against loop.py's local wire server in its own
process. For each it reports launch → first model request (wall), the whole process's CPU
(user+sys, ``os.wait4``) and its peak RSS, best and median over the runs; and the wall
time of ``harness --help``. With ``--base``
the two trees run alternately, one run each in turn, so that the shared machine's load
falls on both alike; the load average is printed with the figures.

The other tree is measured with its own ``.venv`` (its ``bin/harness``), its bytecode
written first as for this one; a tree without one (``git archive`` of a commit) runs as
``python -m harness`` on this tree's venv, and ``--module`` runs every tree that way.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import loop  # noqa: E402  (benchmarks/loop.py: the CLI run and the wire server)


def _tree_command(tree: Path, module: bool) -> list[str]:
    """The tree's own ``.venv/bin/harness``; else (or with ``--module``) ``python -m``."""
    script = tree / ".venv" / "bin" / "harness"
    if script.exists() and not module:
        return [str(script)]
    python = tree / ".venv" / "bin" / "python"
    return [str(python if python.exists() else sys.executable), "-m", "harness"]


def _measure(tree: Path, steps: int, wire: str | None, module: bool) -> dict[str, Any]:
    loop.harness_command = lambda: _tree_command(tree, module)  # type: ignore[assignment]
    # With ``python -m``, the tree's package comes first on the path (a tree without a
    # venv of its own, e.g. an exported commit, runs on this one's).
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(tree)
    try:
        return loop.cli_run(steps, wire)
    finally:
        if previous is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = previous


def _help_wall(tree: Path, module: bool) -> float:
    """Wall time of ``harness --help``, in ms (with ``--module``, from the tree's path)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    started = time.perf_counter()
    subprocess.run(
        [*_tree_command(tree, module), "--help"], check=True, stdout=subprocess.DEVNULL, env=env
    )
    return (time.perf_counter() - started) * 1e3


def _summary(samples: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, scale in (("to_first_request", 1e3), ("cpu", 1e3), ("maxrss_mb", 1.0)):
        values = [s[key] * scale for s in samples]
        out[key] = {"best": min(values), "median": statistics.median(values)}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--base", type=Path, help="another tree (with its .venv) to compare")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--path", choices=loop.PATHS, action="append")
    parser.add_argument(
        "--module", action="store_true", help="run every tree as python -m harness"
    )
    args = parser.parse_args()
    trees = {"this": ROOT}
    if args.base is not None:
        trees["base"] = args.base.resolve()
    for tree in trees.values():
        compileall.compile_dir(tree / "harness", quiet=1)
    paths = args.path or list(loop.PATHS)
    samples: dict[str, dict[str, list[dict[str, Any]]]] = {
        name: {path: [] for path in paths} for name in trees
    }
    helps: dict[str, list[float]] = {name: [] for name in trees}
    load_before = os.getloadavg()
    with loop.WireServerProcess() as wire:
        for _ in range(args.runs):
            for path in paths:
                for name, tree in trees.items():
                    samples[name][path].append(
                        _measure(tree, args.steps, wire if path == "wire" else None, args.module)
                    )
            for name, tree in trees.items():
                helps[name].append(_help_wall(tree, args.module))
    load_after = os.getloadavg()
    print(
        f"load average {load_before[0]:.2f} → {load_after[0]:.2f}; "
        f"{args.runs} runs of {args.steps} steps, best / median"
    )
    print(f"{'':16} {'tree':5} {'→ first request ms':>20} {'CPU ms':>16} {'peak RSS MB':>14}")
    results: dict[str, Any] = {"load": [load_before[0], load_after[0]], "trees": {}}
    for path in paths:
        for name, tree in trees.items():
            figures = _summary(samples[name][path])
            results["trees"].setdefault(name, {"tree": str(tree)})[path] = figures
            cells = [figures[k] for k in ("to_first_request", "cpu", "maxrss_mb")]
            print(
                f"{path:16} {name:5} "
                f"{cells[0]['best']:9.0f} / {cells[0]['median']:6.0f}  "
                f"{cells[1]['best']:7.0f} / {cells[1]['median']:6.0f}  "
                f"{cells[2]['best']:6.1f} / {cells[2]['median']:5.1f}"
            )
    for name in trees:
        values = helps[name]
        best, median = min(values), statistics.median(values)
        results["trees"][name]["help_ms"] = {"best": best, "median": median}
        print(f"harness --help   {name:5} {best:9.0f} / {median:6.0f} ms")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
