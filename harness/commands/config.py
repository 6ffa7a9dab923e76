"""``harness config``: the configuration that applies in a directory, and where each value
came from (DESIGN §11), with the agents and skills a session there would find."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from harness import printable
from harness.commands.base import UsageError


def register(commands: Any) -> None:
    config = commands.add_parser(
        "config", help="print the merged configuration and the source of every value"
    )
    config.set_defaults(handler=_config)
    config.add_argument("--dir", default=".", help="the directory a session would run in")
    config.add_argument("--json", action="store_true", help="print it as one JSON object")


def _config(args: argparse.Namespace) -> int:
    from harness import agent_sources, load_settings

    directory = Path(args.dir).expanduser()
    if not directory.is_dir():
        raise UsageError(f"--dir {args.dir}: no such directory")
    settings = load_settings(directory)
    agents = agent_sources(directory.resolve())
    skills, skipped = _skills(directory)
    # Only names of key variables are ever in the files, never a key: nothing to hide.
    if args.json:
        report = {
            "config": settings.values,
            "sources": settings.sources,
            "agents": agents,
            "skills": skills,
            "skills_skipped": skipped,
        }
        print(json.dumps(report, indent=2))
        return 0
    width = max(len(key) for key in settings.sources)
    for key, source in sorted(settings.sources.items()):
        line = f"{key:<{width}}  {json.dumps(_value(settings.values, key))}  ({source})"
        print(printable(line, one_line=True))  # a key or a file's path may hold anything
    # Names and paths come from the user's folders, which may hold anything: printable.
    for name, sources in agents.items():
        print(printable(f"agent {name}  ({', '.join(sources)})", one_line=True))
    for name, file in skills.items():
        print(printable(f"skill {name}  ({file})", one_line=True))
    for problem in skipped:
        print(printable(f"skill skipped: {problem['file']}: {problem['reason']}", one_line=True))
    return 0


def _skills(directory: Path) -> tuple[dict[str, str], list[dict[str, str]]]:
    """The skills a session in ``directory`` would list, by name with their SKILL.md, and
    the files skipped with the reason (the ``skill.invalid`` events a session would record)."""
    from harness import discover_skills

    found, problems = discover_skills(directory.resolve())
    skipped = [{"file": problem.file, "reason": problem.reason} for problem in problems]
    return {skill.name: skill.file for skill in found}, skipped


def _value(values: dict[str, Any], dotted: str) -> Any:
    """The value at a dotted key; a key may itself hold dots (a pattern ``"*.py"``)."""
    if dotted in values:
        return values[dotted]
    for key, value in values.items():
        if isinstance(value, dict) and dotted.startswith(key + "."):
            return _value(value, dotted[len(key) + 1 :])
    return None
