"""``harness run``: send a prompt and print the final answer, through the daemon when one
answers and can honour every flag, else embedded in this process."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.commands.base import (
    DURABILITY_HELP,
    EXIT_CANCELLED,
    SANDBOX_HELP,
    SANDBOX_MODES,
    UsageError,
    add_rule_flags,
    client,
    error_line,
    pause_collector,
    resume_collector,
    rule_flags,
)

if TYPE_CHECKING:
    from harness import Config, Harness, Rule
    from harness.client import Client


def register(commands: Any) -> None:
    run = commands.add_parser("run", help="send a prompt and print the final answer")
    run.set_defaults(handler=_run)
    run.add_argument("prompt", nargs="+", help="the prompt ('-' reads it from stdin)")
    run.add_argument(
        "--model",
        help="mistral/<model>, openai/<model>, scripted:<file> or replay:<cassette>",
    )
    run.add_argument("--base-url", help="the provider's server root (default: the provider's)")
    run.add_argument("--dir", default=".", help="the session's working directory")
    run.add_argument("--session", help="continue this session instead of starting one")
    run.add_argument("--agent", help="build (default) or plan")
    run.add_argument("--max-steps", type=int, help="stop after N model steps (exit 3)")
    add_rule_flags(run)
    run.add_argument("--json", action="store_true", help="print one event per line on stdout")
    run.add_argument(
        "--embedded", action="store_true", help="run in this process even when a daemon answers"
    )
    run.add_argument("--durability", choices=("normal", "full"), help=DURABILITY_HELP)
    run.add_argument(
        "--budget-tokens", type=int, metavar="N", help="stop the run (and its subtasks) at N tokens"
    )
    run.add_argument("--budget-cost", type=float, metavar="USD", help="stop the run at this cost")
    run.add_argument(
        "--budget-time", type=float, metavar="SECONDS", help="stop the run after this long"
    )
    run.add_argument(
        "--show-request",
        action="store_true",
        help="print each exact model request on stderr, every system block with its source",
    )
    run.add_argument(
        "--record",
        metavar="FILE",
        help="write every provider exchange to this JSON-lines cassette (replay:FILE plays it)",
    )
    run.add_argument("--sandbox", choices=SANDBOX_MODES, help=SANDBOX_HELP)


def _prompt_text(args: argparse.Namespace) -> str:
    text = sys.stdin.read() if args.prompt == ["-"] else " ".join(args.prompt)
    if not text.strip():
        raise UsageError("the prompt is empty")
    return text


def _run(args: argparse.Namespace) -> int:
    pause_collector()  # until the prompt is in (see there): ~50 ms of start-up
    try:
        return _start(args)
    finally:
        resume_collector()


def _start(args: argparse.Namespace) -> int:
    if args.max_steps is not None and args.max_steps < 1:
        raise UsageError("--max-steps must be at least 1")
    for flag in ("budget_tokens", "budget_cost", "budget_time"):
        value = getattr(args, flag)
        if value is not None and not value > 0:
            raise UsageError(f"--{flag.replace('_', '-')} must be more than 0")
    text = _prompt_text(args)
    rules = rule_flags(args)
    directory = Path(args.dir).expanduser()
    if not directory.is_dir():
        raise UsageError(f"--dir {args.dir}: no such directory")
    interactive = sys.stdin.isatty() and args.prompt != ["-"]
    from harness import (
        config_overrides,
        daemon_cannot_apply,
        default_home,
        global_catalog,
        load_settings,
        project_catalog,
        read_project,
        use_front_matter_store,
    )

    # Defaults < global file < project file < HARNESS_* < flags (DESIGN §11).
    settings = load_settings(directory)
    # Agent files are checked now, whichever process runs the session: a bad one is one
    # line and exit 1 before anything starts.
    use_front_matter_store(default_home() / "cache" / "front-matter.json")
    project_catalog(global_catalog(), directory)
    # The daemon reads a session's project file itself, except what is its own (a
    # project's providers, budget, sandbox): with those, this run stays embedded.
    project = read_project(directory)
    local_only = project is not None and bool(daemon_cannot_apply(project[1]))
    if args.max_steps is None:
        args.max_steps = settings.get("max_steps")
    record = _record_path(args.record)
    if not args.embedded and not local_only and _daemon_can_take(args):
        daemon = client()
        if daemon is not None and daemon.alive():
            return _run_via_daemon(daemon, args, text, rules, directory, interactive)

    import trio

    from harness import Config

    values = config_overrides(settings)
    flags: dict[str, object] = {
        "model": args.model,
        "base_url": args.base_url,
        "agent": args.agent,
        "durability": args.durability,
        "record": record,
        "budget_tokens": args.budget_tokens,
        "budget_cost": args.budget_cost,
        "budget_time": args.budget_time,
        "show_request": args.show_request or None,
        "sandbox": args.sandbox,
    }
    values.update({key: value for key, value in flags.items() if value is not None})
    values["agent_files"] = True
    config = Config.from_env(
        # --max-steps is the turn's (sent with the prompt), as through the daemon: not a
        # harness-wide limit that would also cut subtasks and other sessions' resumed turns.
        # The files' rules first: a flag's rule, later, wins (last match).
        rules=[*settings.rules, *rules],
        interactive=interactive,
        yes=args.yes,
        **values,
    )
    config.log_file = config.home / "logs" / f"run-{time.strftime('%Y%m%d')}.jsonl"
    if config.sandbox != "off":
        # bwrap's probe runs while the harness's own modules load (~10-20 ms of waiting).
        from harness import start_sandbox_probe

        start_sandbox_probe(config.sandbox_bwrap)
    return trio.run(_run_embedded, config, args, text, directory)


def _record_path(value: str | None) -> Path | None:
    """The cassette ``--record`` names, emptied now: a run records afresh."""
    if value is None:
        return None
    from harness import open_private

    path = Path(value).expanduser()
    try:
        open_private(path, "wb").close()
    except OSError as error:
        raise UsageError(f"--record {value}: {error.strerror or error}") from error
    return path


def _daemon_can_take(args: argparse.Namespace) -> bool:
    """Whether the daemon can honour every flag; if not, ``run`` stays embedded.

    ``--base-url`` is a session setting, ``--max-steps`` one of the turn, and rules
    given with ``--session`` are added to that session's (``PATCH /v1/sessions/{id}``):
    the daemon takes all three. The ones below configure this process's harness.
    """
    budgets = (args.budget_tokens, args.budget_cost, args.budget_time)
    if args.show_request or any(limit is not None for limit in budgets):
        return False  # these configure this process's harness
    if args.record is not None:
        return False  # the cassette records this process's provider calls
    if args.durability is not None:
        return False  # the daemon's ledger is opened with the daemon's own setting
    # The daemon's commands run under the daemon's sandbox.
    return args.sandbox is None or args.sandbox == _daemon_sandbox()


def _daemon_sandbox() -> str | None:
    """The sandbox the daemon's commands run under, or None when no daemon answers."""
    from harness.client import ApiError, DaemonUnavailable

    daemon = client()
    if daemon is None:
        return None
    try:
        mode = daemon.health().get("sandbox")
    except (DaemonUnavailable, OSError, ApiError, ValueError):
        return None
    return mode if isinstance(mode, str) else None


# --- embedded ---------------------------------------------------------------------------


async def _run_embedded(
    config: Config, args: argparse.Namespace, text: str, directory: Path
) -> int:
    import trio

    from harness import (
        HarnessError,
        LedgerError,
        ProviderError,
        SessionBusy,
        UnknownAgentError,
        open_harness,
    )
    from harness.commands.display import Display
    from harness.commands.follow import HarnessReplies, TurnFollower

    view_code: int | None = None
    if not args.session:
        from harness import prefetch_environment

        prefetch_environment(directory)  # git runs while the harness opens
    try:
        async with open_harness(config) as h:
            try:
                if args.session:
                    session = h.session(args.session)
                    if config.rules or args.base_url:
                        # As through the daemon: the session keeps them for later turns.
                        session = await h.update_session(
                            session.id, add_rules=config.rules, base_url=args.base_url
                        )
                else:
                    # A model named by a flag or HARNESS_MODEL wins over the agent's; the
                    # files' model (config.model) is the fallback after it.
                    session = await h.create_session(
                        directory,
                        model=_model_for_daemon(args),
                        agent=config.agent,
                        base_url=config.base_url,
                    )
            except SessionBusy as error:  # not a usage error: the same command works later
                return error_line(str(error))
            except (HarnessError, UnknownAgentError, ProviderError) as error:
                raise UsageError(str(error)) from error
            view = Display(session.id, json_mode=args.json)
            resume_collector()  # start-up is over: what the turn makes is collected
            async with h.subscribe(session.id) as events, trio.open_nursery() as nursery:
                message_id = await h.prompt(session.id, text, max_steps=args.max_steps)
                # Asks the terminal cannot take, and --yes, are the harness's (Config).
                follower = TurnFollower(
                    view, HarnessReplies(h), message_id, interactive=config.interactive
                )
                nursery.start_soon(_cancel_on_interrupt, h, session.id)
                code = view_code = await follower.follow_feed(events, nursery)
                nursery.cancel_scope.cancel()
            return code
    except LedgerError as error:
        if view_code is not None:
            return view_code  # the turn's end already said why (a full disk)
        return error_line(str(error))


async def _cancel_on_interrupt(h: Harness, session_id: str) -> None:
    """Ctrl-C cancels the turn cleanly (the ledger records it); a second one exits at once."""
    import signal

    import trio

    from harness.commands.follow import CANCELLING

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            print(CANCELLING, file=sys.stderr)
            await h.cancel(session_id)
            break
        async for _ in signals:
            os._exit(EXIT_CANCELLED)


# --- through the daemon -----------------------------------------------------------------


def _model_for_daemon(args: argparse.Namespace) -> str | None:
    """The model this process would use; a scripted file resolved against our directory."""
    from harness import resolve_model

    model: str | None = args.model or os.environ.get("HARNESS_MODEL") or None
    return resolve_model(model) if model is not None else None


def _run_via_daemon(
    daemon: Client,
    args: argparse.Namespace,
    text: str,
    rules: list[Rule],
    directory: Path,
    interactive: bool,
) -> int:
    from harness import new_message_id
    from harness.client import ApiError
    from harness.commands.display import Display
    from harness.commands.follow import ClientReplies, TurnFollower

    resume_collector()  # this process only follows the daemon from here
    base_url = args.base_url or os.environ.get("HARNESS_BASE_URL") or None
    try:
        if args.session:
            session_id = daemon.session(args.session)["id"]
            if rules or args.base_url:
                daemon.update_session(
                    session_id,
                    permission=[rule.model_dump() for rule in rules],
                    base_url=args.base_url,
                )
        else:
            session_id = daemon.create_session(
                directory=str(directory.resolve()),
                model=_model_for_daemon(args),
                base_url=base_url,
                agent=args.agent,
                permission=[rule.model_dump() for rule in rules],
            )["id"]
    except ApiError as error:
        if error.status in (404, 422):
            raise UsageError(error.message) from error
        if error.status == 409:  # busy: the same command works once the session is idle
            return error_line(error.message)
        raise
    # Follow from the ledger's current end, subscribed before the prompt goes in: every
    # event of this turn reaches us, deltas included, and a reconnect replays the rest.
    stream = daemon.events(session_id, after=daemon.health()["last_seq"])
    stream.open()
    message_id = daemon.prompt(
        session_id, text, message_id=new_message_id(), max_steps=args.max_steps
    )
    # --yes through the daemon: this client answers "once" to every ask of its session
    # tree. The daemon asks only what no rule decided, so a deny is never seen here.
    follower = TurnFollower(
        Display(session_id, json_mode=args.json),
        ClientReplies(daemon),
        message_id,
        interactive=interactive,
        yes=args.yes,
        unattended=True,
    )
    try:
        return follower.follow_stream(stream, lambda: daemon.cancel(session_id))
    finally:
        stream.close()
