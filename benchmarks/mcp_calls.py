"""What an MCP server costs (issue 16): per call, and at start-up when none is configured.

Run from the repository root::

    python benchmarks/mcp_calls.py                  # 200 calls each way, 5 rounds
    python benchmarks/mcp_calls.py --calls 50 --rounds 1 --base 1c57de0

1. *Per call*: the same stdio server (tests/mcp_servers.py ``basic``, its ``echo`` tool),
   called 200 times in a row
   - directly with the SDK (``stdio_client`` + ``ClientSession.call_tool``): the floor;
   - through harness's client (``McpTool.execute``: harness's stdio transport, the client
     actor's checks, the result turned into text). The difference of the medians is the
     overhead, target ≤ 1 ms;
   - through a whole harness turn (scripted model calling the tool, the gate, the durable
     ``running`` record, truncation, the result recorded): the tool part's recorded
     start → end, for scale; the ledger's write is most of it and is the same for every
     tool.
   Rounds alternate the two ways, so a load change on the shared machine hits both.
2. *Start-up with no server*: a fresh interpreter opens a harness, creates a session and
   runs one scripted turn; the ``mcp`` SDK must not be imported. With ``--base REV`` the
   same is timed on that revision's tree (``git archive``), interleaved, for comparison.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "mcp_calls.json"
SERVER = [sys.executable, str(ROOT / "tests" / "mcp_servers.py"), "basic"]


async def direct(calls: int) -> list[float]:
    from mcp import ClientSession, StdioServerParameters, stdio_client

    params = StdioServerParameters(command=SERVER[0], args=SERVER[1:])
    times: list[float] = []
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        await session.list_tools()
        for _ in range(20):
            await session.call_tool("echo", {"text": "x"})
        for _ in range(calls):
            start = time.perf_counter()
            await session.call_tool("echo", {"text": "x"})
            times.append((time.perf_counter() - start) * 1000)
    return times


async def through_client(calls: int, home: Path) -> list[float]:
    from harness.actors.mcp_client import McpHub
    from harness.mcp.spec import McpServerSpec
    from harness.storage.ledger import Ledger
    from harness.tools.base import ToolContext, parse_arguments

    ledger = Ledger(home / "client.db")
    hub = McpHub(
        {"basic": McpServerSpec(command=SERVER)}, ledger=ledger, home=home, search_threshold=10**6
    )
    ctx = ToolContext(
        session_id="ses_b", message_id="msg_b", call_id="cal_b", directory=ROOT, output_dir=home
    )
    times: list[float] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ledger.run_writer, None)
        await nursery.start(hub.run)
        await hub.prepare("ses_b", ROOT)
        tool = hub.tools()["basic_echo"]
        for _ in range(20):
            args, _ = parse_arguments(tool.params, {"text": "x"})
            await tool.execute(args, ctx)
        for _ in range(calls):
            start = time.perf_counter()
            args, _ = parse_arguments(tool.params, {"text": "x"})
            await tool.execute(args, ctx)
            times.append((time.perf_counter() - start) * 1000)
        await hub.clients["basic"].stop()
        nursery.cancel_scope.cancel()
    ledger.close()
    return times


async def through_turn(calls: int, home: Path) -> list[float]:
    from harness.config import Config
    from harness.mcp.spec import McpServerSpec
    from harness.messages.model import ToolCompleted, ToolPart
    from harness.providers.scripted import ScriptedProvider
    from harness.runtime import open_harness

    # Each call's text differs: three identical calls in a row would be a doom loop.
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "basic_echo", "arguments": {"text": f"x{i}"}}]}
        for i in range(calls)
    ]
    provider = ScriptedProvider.from_turns([*turns, {"text": "done"}])
    config = Config(
        home=home / "turn",
        model="scripted:bench",
        provider_factory=lambda model: provider,
        interactive=False,
        mcp_servers={"basic": McpServerSpec(command=SERVER)},
        log_level="warning",
    )
    async with open_harness(config) as h:
        session = await h.create_session(ROOT)
        await h.run(session.id, "go")
        parts = [p for m in h.ledger.messages(session.id) for p in m.parts]
    states = [p.state for p in parts if isinstance(p, ToolPart)]
    done = [(s.end - s.start) * 1000 for s in states if isinstance(s, ToolCompleted)]
    assert len(done) == calls, f"{len(done)} of {calls} calls completed"
    return done


async def stop_times(home: Path, runs: int) -> dict[str, list[float]]:
    """How long stopping a server takes: one that exits when its stdin closes, and one that
    ignores that and SIGTERM (tests/mcp_servers.py stubborn, with a child as deaf)."""
    from harness.actors.mcp_client import McpHub
    from harness.mcp.spec import McpServerSpec
    from harness.storage.ledger import Ledger

    found: dict[str, list[float]] = {"basic": [], "stubborn": []}
    ledger = Ledger(home / "stop.db")
    specs = {kind: McpServerSpec(command=[*SERVER[:2], kind]) for kind in found}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ledger.run_writer, None)
        for _ in range(runs):
            hub = McpHub(specs, ledger=ledger, home=home, search_threshold=10**6)
            await nursery.start(hub.run)
            await hub.prepare("ses_b", ROOT)
            for kind, client in hub.clients.items():
                start = time.perf_counter()
                await client.stop()
                found[kind].append((time.perf_counter() - start) * 1000)
        nursery.cancel_scope.cancel()
    ledger.close()
    return found


STARTUP = """
import sys, time
# The tree on PYTHONPATH, not the editable install's finder (which would win otherwise).
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in getattr(f, "__module__", "")]
t = time.perf_counter()
import trio
from harness.config import Config
from harness.providers.scripted import ScriptedProvider
from harness.runtime import open_harness
async def main():
    p = ScriptedProvider.from_turns([{"text": "hi"}])
    c = Config(home=sys.argv[1], model="scripted:x", interactive=False,
               provider_factory=lambda m: p, log_level="warning")
    async with open_harness(c) as h:
        s = await h.create_session(sys.argv[2])
        await h.run(s.id, "go")
trio.run(main)
import harness
assert harness.__file__.startswith(sys.argv[3]), harness.__file__
print((time.perf_counter() - t) * 1000, "mcp" in sys.modules)
"""


def startup(tree: Path, home: Path, runs: int) -> tuple[list[float], bool]:
    times: list[float] = []
    loaded = False
    home.mkdir(parents=True, exist_ok=True)
    for run in range(runs):
        out = subprocess.run(
            [sys.executable, "-c", STARTUP, str(home / f"s{run}"), str(ROOT), str(tree)],
            capture_output=True,
            text=True,
            env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin", "HOME": str(home)},
            cwd=home,  # "" on the path is the working directory: not the repository
            check=True,
        ).stdout.split()
        times.append(float(out[0]))
        loaded = loaded or out[1] == "True"
    return times, loaded


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--startups", type=int, default=5)
    parser.add_argument("--base", help="a revision to compare the start-up with")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-mcp-") as scratch:
        home = Path(scratch)
        sdk: list[float] = []
        ours: list[float] = []
        rounds: list[dict[str, float]] = []
        for index in range(args.rounds):
            (home / f"r{index}").mkdir()
            a = trio.run(direct, args.calls)
            b = trio.run(through_client, args.calls, home / f"r{index}")
            sdk += a
            ours += b
            rounds.append(
                {"sdk": statistics.median(a), "harness": statistics.median(b)}
            )
        turn_home = home / "t"
        turn_home.mkdir()
        turn = trio.run(through_turn, args.calls, turn_home)
        (home / "stop").mkdir()
        stops = trio.run(stop_times, home / "stop", 3)
        base: Path | None = None
        if args.base:
            base = home / "base"
            base.mkdir()
            archive = subprocess.run(
                ["git", "-C", str(ROOT), "archive", args.base, "harness"],
                capture_output=True,
                check=True,
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
        # Interleaved, one run of each at a time: the shared machine's load hits both.
        here: list[float] = []
        base_times: list[float] | None = [] if base is not None else None
        loaded = False
        for run in range(args.startups):
            times, imported = startup(ROOT, home / f"up{run}", 1)
            here += times
            loaded = loaded or imported
            if base is not None and base_times is not None:
                base_times += startup(base, home / f"upb{run}", 1)[0]
    report: dict[str, Any] = {
        "machine": platform.platform(),
        "calls": args.calls,
        "rounds": rounds,
        "sdk_median_ms": statistics.median(sdk),
        "harness_client_median_ms": statistics.median(ours),
        "overhead_ms": statistics.median(ours) - statistics.median(sdk),
        "whole_turn_call_median_ms": statistics.median(turn),
        "stop_ms": stops,
        "startup_no_mcp_ms": sorted(here),
        "startup_imports_mcp": loaded,
        "startup_base_ms": sorted(base_times) if base_times else None,
    }
    print(f"{'MCP echo call, median of ' + str(args.calls * args.rounds):<44}  ms")
    print(f"{'  SDK directly':<44}  {report['sdk_median_ms']:.3f}")
    print(f"{'  harness client (McpTool.execute)':<44}  {report['harness_client_median_ms']:.3f}")
    print(f"{'  overhead (target <= 1 ms)':<44}  {report['overhead_ms']:+.3f}")
    whole = report["whole_turn_call_median_ms"]
    print(f"{'  whole tool call in a turn (ledger incl.)':<44}  {whole:.3f}")
    for row in rounds:
        print(f"    round: sdk {row['sdk']:.3f} / harness {row['harness']:.3f}")
    for kind, times in stops.items():
        print(f"stop a {kind} server (ms): {[round(t) for t in times]}")
    print(f"start-up, no MCP server (ms, sorted): {[round(t) for t in sorted(here)]}")
    if base_times:
        print(f"start-up at {args.base} (ms, sorted):   {[round(t) for t in sorted(base_times)]}")
    print(f"mcp SDK imported without a server: {loaded}")
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
