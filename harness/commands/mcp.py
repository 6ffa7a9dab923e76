"""``harness mcp [--dir DIR] [--json] [--probe]``: each MCP server, its state, its tool
count, the tokens its schemas take, its last error, and its prompts (DESIGN §12).

A running daemon answers with its servers as they are (their real last errors). Without
one (or with ``--probe``), the servers configured for ``DIR`` are each started once, as a
session's first turn would start them, and stopped again."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from harness import printable
from harness.commands.base import UsageError


def register(commands: Any) -> None:
    mcp = commands.add_parser(
        "mcp", help="start each configured MCP server once and report what it offers"
    )
    mcp.set_defaults(handler=_mcp)
    mcp.add_argument("--dir", default=".", help="the directory a session would run in")
    mcp.add_argument("--json", action="store_true", help="print it as one JSON object")
    mcp.add_argument(
        "--probe",
        action="store_true",
        help="start the configured servers here even when a daemon answers",
    )


def _mcp(args: argparse.Namespace) -> int:
    import trio

    from harness import (
        config_overrides,
        configure_logging,
        default_home,
        load_settings,
        probe_mcp_servers,
    )

    directory = Path(args.dir).expanduser()
    if not directory.is_dir():
        raise UsageError(f"--dir {args.dir}: no such directory")
    from harness.commands.base import from_daemon

    if not args.probe:
        live: dict[str, Any] | None = from_daemon(lambda client: client.mcp())
        if live is not None:
            return _print(live, args.json, "the daemon's servers (idle: no turn started them yet)")
    values = config_overrides(load_settings(directory))
    home = default_home()
    # The report says what failed; the details go to the log file, not into the output.
    configure_logging(level="info", file=home / "logs" / "harness.jsonl")
    servers = values["mcp_servers"]
    threshold = values["mcp_search_threshold"]
    report = trio.run(
        lambda: probe_mcp_servers(
            servers,
            home=home,
            directory=directory.resolve(),
            search_threshold=10_000 if threshold is None else threshold,
        )
    )
    return _print(report, args.json, None)


def _print(report: dict[str, Any], as_json: bool, heading: str | None) -> int:
    if as_json:
        print(json.dumps(report, indent=2))
        return 0
    if heading and report["servers"]:
        print(heading)
    if not report["servers"]:
        print("no MCP servers configured ([mcp.NAME] in config.toml; see docs/mcp.md)")
        return 0
    # Names, errors, prompts and warnings are the servers' own words: shown, never obeyed.
    names = {s["name"]: printable(str(s["name"]), one_line=True) for s in report["servers"]}
    width = max(len(name) for name in names.values())
    for server in report["servers"]:
        last_error = printable(str(server["last_error"]), one_line=True)
        error = f"  {last_error}" if server["last_error"] else ""
        print(
            f"{names[server['name']]:<{width}}  {server['state']:<8}  {server['tools']:>3} tools  "
            f"{server['schema_tokens']:>6} tokens{error}"
        )
        if server["prompts"]:
            prompts = printable(", ".join(str(p) for p in server["prompts"]), one_line=True)
            print(f"{'':<{width}}  prompts: {prompts}")
        for warning in server["warnings"]:
            print(f"{'':<{width}}  warning: {printable(str(warning), one_line=True)}")
    mode = "on" if report.get("tool_search") else "off"
    print(
        f"schemas: {report['schema_tokens']} tokens; tool search {mode} "
        f"(threshold {report['search_threshold']})"
    )
    return 0
