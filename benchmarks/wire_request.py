"""One wire request's CPU: ``MistralProvider.stream`` against loop.py's server, two trees.

A step on the wire path is the scripted step plus one provider request; this measures
that request alone, in one process, so the loop's other work and its start-up stay out:
request encoding (of a history already encoded once), the POST through httpx and the
transport, the SSE reply (a tool call, the reply loop.py's server gives every step) and
its chunks, events out. Per request: process CPU (``getrusage``, every thread) over a
batch of requests, the best and the median over batches and rounds, the trees taking
turns; then the Python function calls of one request (cProfile's count: deterministic,
unlike CPU time on shared cores)::

    python benchmarks/wire_request.py --base ../base/.venv/bin/python
    python benchmarks/wire_request.py --history 200      # a 200-step history (~180 KB body)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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

import loop  # noqa: E402  (the wire server of the loop benchmark)


def child(root: str, history: int, batch: int, batches: int) -> None:
    import trio

    from harness.messages.provider import (
        AssistantTurn,
        ProviderRequest,
        ToolCall,
        ToolResult,
        UserTurn,
    )
    from harness.providers.mistral import MistralProvider

    # A steps count the server never reaches: every reply is the next tool call.
    url = f"{root}/{secrets.token_hex(4)}/s1000000"
    provider = MistralProvider("devstral-medium-latest", api_key="k", base_url=url)
    messages: list[Any] = [UserTurn("read the files, then answer")]
    for step in range(history):
        call = ToolCall(f"call{step:05d}", "read", json.dumps({"path": f"f{step % 3}.txt"}))
        messages += [AssistantTurn("", (call,)), ToolResult(call.id, "read", "x" * 900)]
    request = ProviderRequest(
        "devstral-medium-latest", ("You are a coding agent. " * 100,), tuple(messages), ()
    )
    per_request: list[float] = []
    calls = 0

    async def one() -> None:
        async with provider.stream(request) as events:
            async for _ in events:
                pass

    async def main() -> None:
        nonlocal calls
        for _ in range(20):  # connection, lazy imports, caches: out of the figures
            await one()
        for _ in range(batches):
            before = resource.getrusage(resource.RUSAGE_SELF)
            for _ in range(batch):
                await one()
            after = resource.getrusage(resource.RUSAGE_SELF)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            per_request.append(cpu / batch)
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(10):
            await one()
        profiler.disable()
        calls = pstats.Stats(profiler).total_calls // 10  # type: ignore[attr-defined]
        await provider.aclose()

    trio.run(main)
    print(json.dumps({"cpu": per_request, "calls": calls}))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--base", help="the Python of another checkout, run interleaved")
    parser.add_argument("--history", type=int, default=20, help="steps of history sent")
    parser.add_argument("--rounds", type=int, default=3, help="processes per tree")
    parser.add_argument("--batch", type=int, default=100, help="requests per measurement")
    parser.add_argument("--batches", type=int, default=5, help="measurements per process")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.history, args.batch, args.batches)
        return 0
    trees = {"this tree": sys.executable}
    if args.base:
        trees = {"base": args.base, **trees}
    results: dict[str, dict[str, Any]] = {name: {"cpu": [], "calls": 0} for name in trees}
    with loop.WireServerProcess() as root:
        for _ in range(args.rounds):
            for name, python in trees.items():
                done = subprocess.run(
                    [python, __file__, "--child", root, "--history", str(args.history),
                     "--batch", str(args.batch), "--batches", str(args.batches)],
                    capture_output=True, text=True, cwd=tempfile.gettempdir(),
                    env={**os.environ, "MISTRAL_API_KEY": "bench-key"},
                )  # fmt: skip
                if done.returncode != 0:
                    raise SystemExit(f"{python}: the requests failed:\n{done.stderr[-3000:]}")
                figures = json.loads(done.stdout.strip().splitlines()[-1])
                results[name]["cpu"] += figures["cpu"]
                results[name]["calls"] = figures["calls"]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"CPU per request, µs, {args.history}-step history: best / median of "
        f"{args.rounds} x {args.batches} batches of {args.batch} (load {load})"
    )
    for name, figures in results.items():
        cpu = [x * 1e6 for x in figures["cpu"]]
        print(
            f"  {name:10} {min(cpu):6.0f} / {statistics.median(cpu):6.0f}"
            f"   Python calls a request {figures['calls']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
