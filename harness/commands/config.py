"""``harness config``: the configuration that applies in a directory, and where each value
came from (DESIGN §11)."""

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
    from harness import load_settings

    directory = Path(args.dir).expanduser()
    if not directory.is_dir():
        raise UsageError(f"--dir {args.dir}: no such directory")
    settings = load_settings(directory)
    # Only names of key variables are ever in the files, never a key: nothing to hide.
    if args.json:
        print(json.dumps({"config": settings.values, "sources": settings.sources}, indent=2))
        return 0
    width = max(len(key) for key in settings.sources)
    for key, source in sorted(settings.sources.items()):
        line = f"{key:<{width}}  {json.dumps(_value(settings.values, key))}  ({source})"
        print(printable(line, one_line=True))  # a key or a file's path may hold anything
    return 0


def _value(values: dict[str, Any], dotted: str) -> Any:
    """The value at a dotted key; a key may itself hold dots (a pattern ``"*.py"``)."""
    if dotted in values:
        return values[dotted]
    for key, value in values.items():
        if isinstance(value, dict) and dotted.startswith(key + "."):
            return _value(value, dotted[len(key) + 1 :])
    return None
