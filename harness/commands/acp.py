"""``harness acp``: the Agent Client Protocol on stdin/stdout, for editors (DESIGN §13).

An editor (Zed, JetBrains, Neovim, Emacs) starts this command and speaks JSON-RPC on its
stdin and stdout; stdout carries nothing but the protocol, and logs go to a file under
``$HARNESS_HOME/logs/``. The harness runs embedded in this process, with the model, agent
and rules of the configuration files and the environment, as ``harness run`` takes them.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from harness.commands.base import (
    SANDBOX_HELP,
    SANDBOX_MODES,
    UsageError,
    add_rule_flags,
    rule_flags,
)


def register(commands: Any) -> None:
    acp = commands.add_parser(
        "acp", help="serve the Agent Client Protocol on stdin/stdout (for editors)"
    )
    acp.set_defaults(handler=_acp)
    acp.add_argument(
        "--model",
        help="mistral/<model>, openai/<model>, scripted:<file> or replay:<cassette>",
    )
    acp.add_argument("--base-url", help="the provider's server root (default: the provider's)")
    acp.add_argument("--agent", help="build (default) or plan")
    acp.add_argument("--max-steps", type=int, help="stop each prompt's turn after N model steps")
    add_rule_flags(acp)
    acp.add_argument("--sandbox", choices=SANDBOX_MODES, help=SANDBOX_HELP)


def _acp(args: argparse.Namespace) -> int:
    if args.max_steps is not None and args.max_steps < 1:
        raise UsageError("--max-steps must be at least 1")
    from harness import (
        Config,
        SessionFlags,
        config_overrides,
        load_settings,
        serve_acp,
    )

    rules = rule_flags(args)
    # The harness-wide settings (providers, budget, sandbox) are those of a run in the
    # directory the editor started us in; each session's model, agent and rules are read
    # for its own cwd when it is created.
    values = config_overrides(load_settings(Path.cwd()))
    flags: dict[str, object] = {
        "model": args.model,
        "base_url": args.base_url,
        "agent": args.agent,
        "sandbox": args.sandbox,
    }
    values.update({key: value for key, value in flags.items() if value is not None})
    # Asks wait for the editor's answer (interactive); --yes answers them here instead.
    config = Config.from_env(interactive=True, yes=args.yes, **values)
    config.log_file = config.home / "logs" / f"acp-{time.strftime('%Y%m%d')}.jsonl"
    session_flags = SessionFlags(
        model=args.model,
        agent=args.agent,
        base_url=args.base_url,
        rules=tuple(rules),
        max_steps=args.max_steps,
    )
    import trio

    # A ledger another process holds (a daemon), a bad config: one line, as for `run`.
    trio.run(serve_acp, config, session_flags)
    return 0
