"""What the sandbox costs per bash call.

Run from the repository root::

    python benchmarks/sandbox.py            # 200 calls per setting, 3 rounds
    python benchmarks/sandbox.py --calls 50 --rounds 1
    python benchmarks/sandbox.py --check    # exit 1 when the p50 added is 10 ms or more

Each call is ``true`` through ``BashTool.execute`` (the tool as the loop runs it: spawn,
read the output, kill the group, reap), in a real session directory holding a git
repository (so the ``.git`` read-only mount is paid for). Settings: the sandbox off,
``workspace-write`` without network (the default: a network namespace is made per call),
``workspace-write`` with network (``bash_network`` allowed), and ``read-only``. The
settings alternate call by call, so load from other processes falls on all of them alike;
each figure is the median over the rounds of that round's percentile. The added cost is
the difference of the p50s. (Not CPU time: the sandbox's init is reparented away from us,
so its CPU and the command's never reach our ``RUSAGE_CHILDREN``.) Wall time stretches with
the machine's load, which is recorded with the figures.

Figures are written to ``benchmarks/results/sandbox.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from harness.messages.model import PermissionAction
from harness.tools.base import ToolContext
from harness.tools.bash import BashParams, BashTool
from harness.tools.sandbox import Sandbox, SandboxMode

RESULTS = Path(__file__).parent / "results" / "sandbox.json"
TARGET_MS = 10.0

SETTINGS: dict[str, tuple[SandboxMode, bool]] = {
    "off": ("off", True),
    "workspace-write": ("workspace-write", False),
    "workspace-write + network": ("workspace-write", True),
    "read-only": ("read-only", False),
}


def _context(directory: Path, mode: SandboxMode, network: bool) -> ToolContext:
    def check(permission: str, pattern: str) -> PermissionAction:
        return "allow" if network and permission == "bash_network" else "ask"

    sandbox = Sandbox.open(mode)
    if sandbox.mode != mode:
        sys.exit(f"the sandbox is unavailable here: {sandbox.unavailable}")
    return ToolContext(
        session_id="ses_bench",
        message_id="msg_bench",
        call_id="cal_bench",
        directory=directory,
        output_dir=directory.parent / "out",
        check=check,
        sandbox=sandbox,
    )


def _percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


async def _round(directory: Path, calls: int) -> dict[str, list[float]]:
    tool = BashTool()
    params = BashParams(command="true")
    contexts = {name: _context(directory, *setting) for name, setting in SETTINGS.items()}
    samples: dict[str, list[float]] = {name: [] for name in SETTINGS}
    for _ in range(calls):
        for name, ctx in contexts.items():
            start = time.perf_counter()
            result = await tool.execute(params, ctx)
            samples[name].append((time.perf_counter() - start) * 1000)
            assert result.metadata["exit"] == 0, result.output
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()

    rounds: list[dict[str, list[float]]] = []
    with tempfile.TemporaryDirectory(prefix="harness-bench-sandbox-") as tmp:
        directory = Path(tmp, "project").resolve()
        directory.mkdir()
        subprocess.run(["git", "init", "-q", str(directory)], check=True)
        for _ in range(args.rounds):
            rounds.append(trio.run(_round, directory, args.calls))

    figures: dict[str, dict[str, float]] = {}
    for name in SETTINGS:
        figures[name] = {
            "p50_ms": statistics.median(_percentile(r[name], 0.5) for r in rounds),
            "p90_ms": statistics.median(_percentile(r[name], 0.9) for r in rounds),
        }
    base = figures["off"]["p50_ms"]
    print(f"{args.calls} `true` calls per setting, {args.rounds} rounds (median of rounds)")
    print(f"{'setting':<28} {'p50 ms':>8} {'p90 ms':>8} {'added p50':>10}")
    for name, row in figures.items():
        row["added_p50_ms"] = row["p50_ms"] - base
        print(
            f"{name:<28} {row['p50_ms']:8.2f} {row['p90_ms']:8.2f} {row['added_p50_ms']:10.2f}"
        )
    added = figures["workspace-write"]["added_p50_ms"]
    out: dict[str, Any] = {
        "calls": args.calls,
        "rounds": args.rounds,
        "load_average": os.getloadavg(),
        "python": platform.python_version(),
        "bwrap": subprocess.run(
            ["bwrap", "--version"], capture_output=True, text=True, check=False
        ).stdout.strip(),
        "figures": figures,
        "target_added_p50_ms": TARGET_MS,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    if args.check and added >= TARGET_MS:
        print(f"FAIL: the sandbox adds {added:.2f} ms per call (target < {TARGET_MS} ms)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
