"""Configuration, agent and skill discovery at launch (issue 15): what they add.

Run from the repository root::

    python benchmarks/discovery.py          # about half a minute
    python benchmarks/discovery.py --quick  # fewer runs

Two repositories, the same but for their files: *bare* has a ``.harness/config.toml``
only; *full* adds 20 agent files in ``.harness/agents/`` (description, mode, model, steps,
a two-level ``permission`` map, a ``tools`` map and a prompt) and 50 skills spread over
``.harness/skills``, ``.agents/skills`` and ``.claude/skills``, plus a global agent and a
global skill. What is measured:

discovery, cold
    A fresh Python process per run (nothing cached, nothing imported but what ``harness
    run`` has imported before it reads files): the wall time of exactly what a run does
    with the files before its first request: ``load_settings``, the agent catalog
    checked by ``run`` and read again by ``create_session``, and the skill discovery of
    the turn. full − bare is the cost the 20 agents and 50 skills add. Median of the runs;
    also whether PyYAML got imported (it should not: the front matter fast path).

launch → first request
    The real ``harness run --embedded --model scripted:FILE`` process, from Popen to its
    ``step started`` log line (as benchmarks/loop.py measures it), bare and full
    interleaved; median of each. On a shared machine this is ±tens of ms, so it is the
    cross-check, not the figure.

``harness --help``
    Wall time of the whole process, median.

Every process runs with its ``.pyc`` files, as an installed harness does (the variable
``PYTHONDONTWRITEBYTECODE`` is dropped for them). The import of the four modules issue 15
adds (front matter, agent files, skills, the skill tool) is timed on its own, in CPU.

Figures are written to ``benchmarks/results/discovery.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "discovery.json"
AGENTS = 20
SKILLS = 50

AGENT_FILE = """---
description: Agent {i} reviews one kind of change and reports what is wrong
mode: {mode}
model: openai/qwen3-coder
steps: 12
permission:
  edit: deny
  bash:
    "*": ask
    "git diff*": allow
    "git log*": allow
tools:
  webfetch: false
---
You are agent {i}. Review the change you are given and list the problems you find,
most important first, with the file and line of each. Do not edit anything.
"""

SKILL_FILE = """---
name: skill-{i}
description: Does task {i} the way this team does it, with the scripts in this folder
license: MIT
---
# Skill {i}

1. Read `reference.md` in this folder.
2. Run `scripts/run.sh` and check its output.
"""


def make_repo(base: Path, full: bool) -> Path:
    repo = base / ("full" if full else "bare")
    (repo / ".git").mkdir(parents=True)
    (repo / ".harness").mkdir()
    (repo / ".harness" / "config.toml").write_text('[permission]\nbash = { "rm *" = "deny" }\n')
    (repo / "README.md").write_text("a project\n")
    if full:
        agents = repo / ".harness" / "agents"
        agents.mkdir()
        for i in range(AGENTS):
            mode = "subagent" if i % 2 else "all"
            (agents / f"agent-{i}.md").write_text(AGENT_FILE.format(i=i, mode=mode))
        folders = [".harness/skills", ".agents/skills", ".claude/skills"]
        for i in range(SKILLS):
            folder = repo / folders[i % 3] / f"skill-{i}"
            (folder / "scripts").mkdir(parents=True)
            (folder / "SKILL.md").write_text(SKILL_FILE.format(i=i))
    return repo


def make_xdg(base: Path, full: bool) -> Path:
    xdg = base / ("xdg-full" if full else "xdg-bare")
    (xdg / "harness").mkdir(parents=True)
    if full:
        (xdg / "harness" / "agents").mkdir()
        (xdg / "harness" / "agents" / "mine.md").write_text(AGENT_FILE.format(i=99, mode="all"))
        skill = xdg / "harness" / "skills" / "mine"
        skill.mkdir(parents=True)
        (skill / "SKILL.md").write_text(SKILL_FILE.format(i=99))
    return xdg


NEW_MODULES = (
    "harness.frontmatter",
    "harness.agent_files",
    "harness.skills",
    "harness.tools.skill",
)


def child(directory: Path) -> None:
    """What ``harness run`` does with the files, timed in a fresh process."""
    import importlib

    import trio  # noqa: F401

    # What those modules import, loaded first: their own cost is what issue 15 adds.
    import harness.agents
    import harness.config_files
    import harness.private
    import harness.tools.base

    imports = time.process_time()
    for name in NEW_MODULES:
        importlib.import_module(name)
    imports = time.process_time() - imports
    import harness.runtime  # noqa: F401 - the embedded run imports it before the session

    started = time.perf_counter()
    cpu = time.process_time()
    from harness import (
        default_home,
        global_catalog,
        load_settings,
        project_catalog,
        use_front_matter_store,
    )
    from harness.skills import discover

    use_front_matter_store(default_home() / "cache" / "front-matter.json")
    load_settings(directory)
    base = global_catalog()
    project_catalog(base, directory)  # run's check
    catalog = project_catalog(base, directory)  # create_session's read
    skills, problems = discover(directory)
    elapsed = time.perf_counter() - started
    print(
        json.dumps(
            {
                "seconds": elapsed,
                "cpu": time.process_time() - cpu,
                "imports": imports,
                "agents": len(catalog),
                "skills": len(skills),
                "problems": len(problems),
                "yaml_imported": "yaml" in sys.modules,
            }
        )
    )


def _env(base: Path, xdg: Path, home: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    # As an installed harness runs: with its .pyc files (this machine sets the variable,
    # and then every import compiles its module again).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(
        HARNESS_HOME=str(home or base / f"home-{time.monotonic_ns()}"),
        HARNESS_SOCKET=str(base / "none.sock"),
        HARNESS_LOG_LEVEL="info",
        XDG_CONFIG_HOME=str(xdg),
    )
    return env


def cold_discovery(base: Path, repo: Path, xdg: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A first launch (nothing in ``$HARNESS_HOME``'s front matter store) and a second."""
    home = base / f"home-{time.monotonic_ns()}"
    results = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, __file__, "--child", str(repo)],
            capture_output=True,
            text=True,
            env=_env(base, xdg, home),
            check=True,
        )
        results.append(json.loads(done.stdout))
    return results[0], results[1]


def launch_to_first_request(base: Path, repo: Path, xdg: Path) -> float:
    script = base / "script.json"
    script.write_text(json.dumps([{"text": "done"}]))
    env = _env(base, xdg)
    command = [sys.executable, "-m", "harness", "run", "--embedded", "--model",
               f"scripted:{script}", "--dir", str(repo), "hi"]
    launched = time.time()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=base)
    if done.returncode != 0:
        raise SystemExit(f"harness run failed: {done.stderr}")
    for log in sorted((Path(env["HARNESS_HOME"]) / "logs").glob("run-*.jsonl")):
        for line in log.read_text().splitlines():
            record = json.loads(line)
            if record.get("event") == "step started":
                stamp = datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00"))
                return stamp.timestamp() - launched
    raise SystemExit("no 'step started' line in the run log")


def help_wall() -> float:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "harness", "--help"], check=True,
                   stdout=subprocess.DEVNULL, cwd=ROOT, env=env)
    return time.perf_counter() - started


def benchmark(runs: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="harness-discovery-") as tmp:
        base = Path(tmp)
        setups = {
            name: (make_repo(base, full), make_xdg(base, full))
            for name, full in (("bare", False), ("full", True))
        }
        cold: dict[str, list[dict[str, Any]]] = {"bare": [], "full": []}
        warm: dict[str, list[dict[str, Any]]] = {"bare": [], "full": []}
        launch: dict[str, list[float]] = {"bare": [], "full": []}
        for _ in range(runs):  # interleaved, so load changes hit both alike
            for name, (repo, xdg) in setups.items():
                first, second = cold_discovery(base, repo, xdg)
                cold[name].append(first)
                warm[name].append(second)
                launch[name].append(launch_to_first_request(base, repo, xdg))
        helps = [help_wall() for _ in range(10)]
    def ms(rows: list[dict[str, Any]], key: str) -> float:
        return round(statistics.median(r[key] for r in rows) * 1000, 2)

    full = cold["full"][0]
    figures: dict[str, Any] = {
        "imports_of_the_new_modules_cpu_ms": ms(cold["bare"] + warm["bare"], "imports"),
        "runs": runs,
        "agents_found": full["agents"],
        "skills_found": full["skills"],
        "yaml_imported": any(r["yaml_imported"] for rows in cold.values() for r in rows),
    }
    for label, table in (("first_launch", cold), ("later_launch", warm)):
        for key in ("seconds", "cpu"):
            unit = "wall" if key == "seconds" else "cpu"
            bare, loaded = ms(table["bare"], key), ms(table["full"], key)
            figures[f"{label}_{unit}_ms"] = {"bare": bare, "full": loaded}
            figures[f"{label}_{unit}_added_ms"] = round(loaded - bare, 2)
    return {
        **figures,
        "launch_to_first_request_ms": {
            name: statistics.median(values) * 1000 for name, values in launch.items()
        },
        "launch_added_ms": (statistics.median(launch["full"]) - statistics.median(launch["bare"]))
        * 1000,
        "help_ms": statistics.median(helps) * 1000,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="5 runs instead of 15")
    parser.add_argument("--no-write", action="store_true", help="do not write the JSON file")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        child(args.child)
        return 0
    figures = benchmark(5 if args.quick else 15)
    ok = figures["first_launch_cpu_added_ms"] <= 5 and figures["help_ms"] <= 100
    for key, value in figures.items():
        print(f"{key:28} {value}")
    print("targets (added ≤ 5 ms, --help ≤ 100 ms):", "met" if ok else "MISSED")
    if not args.no_write:
        RESULTS.write_text(json.dumps(figures, indent=2) + "\n")
        print(f"written to {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
