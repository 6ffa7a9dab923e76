"""grep and glob on a 100,000-file repository: the Python engine, ripgrep, and before.

Run from the repository root::

    python benchmarks/search.py                  # 100,000 files, 3 rounds
    python benchmarks/search.py --files 20000    # a smaller tree
    python benchmarks/search.py --tree DIR       # reuse (or create once) a tree in DIR

The tree is benchmarks/search_tree.py's (nested sources, node_modules/, build/, binaries,
files over 5 MB, hidden files, a .gitignore). Each call is the tool's ``execute`` with the
default rules' answers as the gate gives them (so ``.env`` is skipped, as in a session):

- ``before``: grep.py and glob.py as they were before ripgrep (commit 32c7088), loaded
  from git; what a session paid until now.
- ``python``: today's code with ``HARNESS_RIPGREP=0``, the fallback when rg is missing.
- ``ripgrep``: today's code with rg on PATH.
- ``rg -n``: ripgrep alone from a shell, the way OpenCode and Codex call it (it honours
  .gitignore, so it searches fewer files; for scale only).

Wall time and CPU (this process and its reaped children, user + sys) are the median of the
rounds, file contents in the page cache (one warm-up call first). Every engine's output is
compared with ``python``'s: the figures are only printed for identical results. Written to
``benchmarks/results/search.json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).parent))

from search_tree import RARE_TOKEN, generate

from harness.permissions.ruleset import DEFAULT_RULES, decide
from harness.tools.base import ToolContext
from harness.tools.glob import GlobParams, GlobTool
from harness.tools.grep import GrepParams, GrepTool

RESULTS = Path(__file__).parent / "results" / "search.json"
BEFORE = "32c7088"

GREPS: list[tuple[str, dict[str, str]]] = [
    ("rare literal", {"pattern": RARE_TOKEN}),
    ("common word", {"pattern": "return"}),
    ("regex", {"pattern": r"def \w+_config\("}),
    ("regex, include *.py", {"pattern": r"\bimport (request|response)\b", "include": "*.py"}),
    ("no literal", {"pattern": r"^\s*\w+ = \d"}),
]
GLOBS: list[tuple[str, dict[str, str]]] = [
    ("**/*.py", {"pattern": "**/*.py"}),
    ("src/**/*.ts", {"pattern": "src/**/*.ts"}),
]


def _load_before(name: str) -> ModuleType:
    """harness/tools/<name>.py as it was at BEFORE, as a module of its own."""
    root = Path(__file__).resolve().parent.parent
    source = subprocess.run(
        ["git", "-C", str(root), "show", f"{BEFORE}:harness/tools/{name}.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    spec = importlib.util.spec_from_loader(f"before_{name}", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    exec(compile(source, f"before/{name}.py", "exec"), module.__dict__)
    return module


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _measure(call: Call, rounds: int) -> tuple[dict[str, float], str]:
    output = trio.run(call)  # warm-up: the page cache, imports, rg's first start
    walls, cpus = [], []
    for _ in range(rounds):
        cpu, wall = _cpu(), time.perf_counter()
        again = trio.run(call)
        walls.append(time.perf_counter() - wall)
        cpus.append(_cpu() - cpu)
        assert again == output
    figures = {"wall_ms": statistics.median(walls) * 1000, "cpu_ms": statistics.median(cpus) * 1000}
    return figures, output


Call = Callable[[], Awaitable[str]]


def _call(tool: Any, params_type: Any, params: dict[str, str], ctx: ToolContext) -> Call:
    async def call() -> str:
        out = await tool().execute(params_type(**params), ctx)
        return str(out.output)

    return call


def _engine(value: str | None) -> None:
    if value is None:
        os.environ.pop("HARNESS_RIPGREP", None)
    else:
        os.environ["HARNESS_RIPGREP"] = value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tree", type=Path, help="directory to keep the tree in")
    args = parser.parse_args()

    tmp = tempfile.TemporaryDirectory() if args.tree is None else None
    base = Path(tmp.name) if tmp is not None else args.tree
    repo = (base / "repo").resolve()
    if not repo.exists():
        print(f"generating {args.files} files in {repo} ...", flush=True)
        generate(repo, args.files)
    ctx = ToolContext(
        session_id="ses_bench",
        message_id="msg_bench",
        call_id="cal_bench",
        directory=repo,
        output_dir=base / "tool-output",
        check=lambda permission, pattern: decide(permission, pattern, [DEFAULT_RULES])[0],
    )
    before_grep, before_glob = _load_before("grep"), _load_before("glob")
    results: dict[str, Any] = {
        "files": sum(len(names) for _, _, names in os.walk(repo)),
        "rounds": args.rounds,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "rg": subprocess.run(["rg", "--version"], capture_output=True, text=True).stdout.split()[1],
        "grep": {},
        "glob": {},
    }

    def row(kind: str, label: str, engines: dict[str, Call]) -> None:
        figures: dict[str, Any] = {}
        outputs: dict[str, str] = {}
        for engine, call in engines.items():
            _engine(None if engine == "ripgrep" else "0")
            figures[engine], outputs[engine] = _measure(call, args.rounds)
        _engine(None)
        reference = outputs["python"]
        figures["identical"] = all(out == reference for out in outputs.values())
        figures["first_line"] = reference.split("\n")[0]
        results[kind][label] = figures
        shown = "  ".join(
            f"{e} {f['wall_ms']:6.0f} ms wall {f['cpu_ms']:6.0f} ms CPU"
            for e, f in figures.items()
            if isinstance(f, dict)
        )
        print(f"{kind} {label:22} {shown}  identical={figures['identical']}", flush=True)

    def alone(kind: str, label: str, argv: list[str]) -> None:
        cpu, wall = _cpu(), time.perf_counter()
        subprocess.run(argv, cwd=repo, capture_output=True, check=False)
        figures = {"wall_ms": (time.perf_counter() - wall) * 1000, "cpu_ms": (_cpu() - cpu) * 1000}
        results[kind][label][argv[0] + " " + argv[1]] = figures
        print(f"{'':27} {' '.join(argv[:2])} alone: {figures['wall_ms']:.0f} ms wall", flush=True)

    for label, params in GREPS:
        row(
            "grep",
            label,
            {
                "before": _call(before_grep.GrepTool, before_grep.GrepParams, params, ctx),
                "python": _call(GrepTool, GrepParams, params, ctx),
                "ripgrep": _call(GrepTool, GrepParams, params, ctx),
            },
        )
        include = ["-g", params["include"]] if "include" in params else []
        alone("grep", label, ["rg", "-n", "-e", params["pattern"], *include])

    for label, params in GLOBS:
        row(
            "glob",
            label,
            {
                "before": _call(before_glob.GlobTool, before_glob.GlobParams, params, ctx),
                "python": _call(GlobTool, GlobParams, params, ctx),
            },
        )
        alone("glob", label, ["rg", "--files", "-g", params["pattern"]])

    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {RESULTS}")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
