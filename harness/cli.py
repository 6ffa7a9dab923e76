"""The command line (DESIGN §9): ``harness run``, ``sessions``, ``show``.

Only the standard library is imported at module level: ``harness --help`` must answer in
well under 100 ms, and each command imports what it needs when it runs.

Exit codes (contract): 0 answered, 1 error, 2 usage, 3 stopped by a limit, 4 stopped by
a denial, 130 cancelled.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

if TYPE_CHECKING:
    from harness.messages.events import Event
    from harness.messages.model import MessageWithParts, Rule
    from harness.runtime import Harness

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_LIMIT, EXIT_DENIED, EXIT_CANCELLED = 0, 1, 2, 3, 4, 130
EXIT_BY_REASON = {
    "answered": EXIT_OK,
    "error": EXIT_ERROR,
    "max_steps": EXIT_LIMIT,
    "doom_loop": EXIT_LIMIT,
    "denied": EXIT_DENIED,
    "cancelled": EXIT_CANCELLED,
}


class UsageError(Exception):
    """Bad flags or arguments: exit 2 with the message."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="harness",
        description="A coding-agent runtime: a model decides, tools act under a permission "
        "gate, and every fact lands in a SQLite ledger under $HARNESS_HOME.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = commands.add_parser("run", help="send a prompt and print the final answer")
    run.add_argument("prompt", nargs="+", help="the prompt ('-' reads it from stdin)")
    run.add_argument("--model", help="mistral/<model>, openai/<model> or scripted:<file>")
    run.add_argument("--base-url", help="the provider's server root (default: the provider's)")
    run.add_argument("--dir", default=".", help="the session's working directory")
    run.add_argument("--session", help="continue this session instead of starting one")
    run.add_argument("--agent", help="build (default) or plan")
    run.add_argument("--max-steps", type=int, help="stop after N model steps (exit 3)")
    run.add_argument("--yes", action="store_true", help="allow every permission that asks")
    run.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="PERMISSION[:PATTERN]",
        help="allow a permission, e.g. --allow 'bash:git *' (repeatable)",
    )
    run.add_argument(
        "--deny",
        action="append",
        default=[],
        metavar="PERMISSION[:PATTERN]",
        help="deny a permission, e.g. --deny edit (repeatable)",
    )
    run.add_argument("--json", action="store_true", help="print one event per line on stdout")
    run.add_argument(
        "--embedded", action="store_true", help="run in this process (no daemon exists yet)"
    )

    sessions = commands.add_parser("sessions", help="list sessions from the ledger")
    sessions.add_argument("--json", action="store_true", help="print JSON")

    show = commands.add_parser("show", help="print a session's transcript")
    show.add_argument("session", help="the session id (ses_…)")
    show.add_argument("--json", action="store_true", help="print JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> NoReturn:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "run":
            code = _run(args)
        elif args.command == "sessions":
            code = _sessions(args)
        elif args.command == "show":
            code = _show(args)
        else:
            parser.print_help(sys.stderr)
            code = EXIT_USAGE
    except BaseException as error:
        code = _exit_code_for(error)
    sys.exit(code)


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


def _exit_code_for(error: BaseException) -> int:
    """Turn an error into a clear message and an exit code: a user never sees a traceback."""
    leaves = _leaves(error)
    first = leaves[0]
    if isinstance(first, SystemExit) and len(leaves) == 1:
        return int(first.code or 0) if not isinstance(first.code, str) else EXIT_ERROR
    if isinstance(first, UsageError):
        print(f"harness: {first}", file=sys.stderr)
        return EXIT_USAGE
    if isinstance(first, KeyboardInterrupt):
        return EXIT_CANCELLED
    if isinstance(first, BrokenPipeError):
        # The reader went away (`| head`): not our failure to report.
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the final flush
        return EXIT_ERROR
    import traceback

    from harness.config import default_home

    log_dir = default_home() / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    crash = log_dir / "crash.log"
    with crash.open("a", encoding="utf-8") as out:
        out.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
        traceback.print_exception(error, file=out)
    print(
        f"harness: internal error: {type(first).__name__}: {first} (details in {crash})",
        file=sys.stderr,
    )
    return EXIT_ERROR


# --- run --------------------------------------------------------------------------------


def _rules(args: argparse.Namespace) -> list[Rule]:
    from harness.permissions.ruleset import allow_all, parse_rule_flag

    rules: list[Rule] = allow_all() if args.yes else []
    try:
        rules += [parse_rule_flag(text, "allow") for text in args.allow]
        rules += [parse_rule_flag(text, "deny") for text in args.deny]
    except ValueError as error:
        raise UsageError(str(error)) from error
    return rules


def _prompt_text(args: argparse.Namespace) -> str:
    text = sys.stdin.read() if args.prompt == ["-"] else " ".join(args.prompt)
    if not text.strip():
        raise UsageError("the prompt is empty")
    return text


def _run(args: argparse.Namespace) -> int:
    if args.max_steps is not None and args.max_steps < 1:
        raise UsageError("--max-steps must be at least 1")
    text = _prompt_text(args)
    rules = _rules(args)
    directory = Path(args.dir).expanduser()
    if not directory.is_dir():
        raise UsageError(f"--dir {args.dir}: no such directory")

    import trio

    from harness.config import Config

    interactive = sys.stdin.isatty() and args.prompt != ["-"]
    config = Config.from_env(
        model=args.model,
        base_url=args.base_url,
        agent=args.agent,
        max_steps=args.max_steps,
        rules=rules,
        interactive=interactive,
    )
    config.log_file = config.home / "logs" / f"run-{time.strftime('%Y%m%d')}.jsonl"
    return trio.run(_run_async, config, args, text, directory)


async def _run_async(config: Any, args: argparse.Namespace, text: str, directory: Path) -> int:
    import trio

    from harness.agents import UnknownAgentError
    from harness.providers.errors import ProviderError
    from harness.runtime import HarnessError, open_harness
    from harness.storage.ledger import LedgerError

    try:
        async with open_harness(config) as h:
            try:
                if args.session:
                    session = h.session(args.session)
                else:
                    session = await h.create_session(
                        directory, model=config.model, agent=config.agent
                    )
            except (HarnessError, UnknownAgentError, ProviderError) as error:
                raise UsageError(str(error)) from error
            view = _Progress(h, session.id, json_mode=args.json, interactive=config.interactive)
            async with h.subscribe(session.id) as events, trio.open_nursery() as nursery:
                message_id = await h.prompt(session.id, text)
                nursery.start_soon(_cancel_on_interrupt, h, session.id, nursery)
                code = await view.follow(events, message_id, nursery)
                nursery.cancel_scope.cancel()
            return code
    except LedgerError as error:
        print(f"harness: {error}", file=sys.stderr)
        return EXIT_ERROR


async def _cancel_on_interrupt(h: Harness, session_id: str, nursery: Any) -> None:
    """Ctrl-C cancels the turn cleanly (the ledger records it); a second one exits at once."""
    import signal

    import trio

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            print("\ncancelling… (Ctrl-C again to quit now)", file=sys.stderr)
            await h.cancel(session_id)
            break
        async for _ in signals:
            os._exit(EXIT_CANCELLED)


class _Progress:
    """Shows a run as it happens: steps on stderr, the answer (or JSON events) on stdout."""

    def __init__(self, h: Harness, session_id: str, *, json_mode: bool, interactive: bool):
        self._h = h
        self._session_id = session_id
        self._json = json_mode
        self._interactive = interactive
        self._err: TextIO = sys.stderr

    async def follow(self, events: Any, message_id: str, nursery: Any) -> int:
        async for event in events:
            if self._json:
                print(event.to_json(), flush=True)
            else:
                self._show(event)
            if event.type == "permission.asked" and self._interactive:
                nursery.start_soon(self._ask, event)
            if event.type == "turn.finished" and event.data.get("message_id") == message_id:
                return self._finish(event)
        print("harness: the event stream ended before the answer", file=sys.stderr)
        return EXIT_ERROR

    def _finish(self, event: Event) -> int:
        reason = event.data["reason"]
        answer = event.data.get("answer") or ""
        error = event.data.get("error")
        if not self._json:
            if answer:
                print(answer, flush=True)
            if reason == "error":
                print(f"harness: error: {error}", file=self._err)
            elif reason != "answered":
                detail = f": {error}" if error else ""
                print(f"harness: stopped ({reason}){detail}", file=self._err)
        return EXIT_BY_REASON.get(reason, EXIT_ERROR)

    def _show(self, event: Event) -> None:
        data = event.data
        if event.type == "part.updated" and data.get("type") == "tool":
            state = data["state"]
            tool = data["tool"]
            if state["status"] == "running":
                print(f"→ {state.get('title') or tool}", file=self._err, flush=True)
            elif state["status"] == "completed":
                print(f"✓ {tool} ({_summary(state)})", file=self._err, flush=True)
            elif state["status"] == "error":
                first = str(state.get("error", "")).splitlines()[0:1]
                print(f"✗ {tool}: {first[0] if first else 'error'}", file=self._err, flush=True)
        elif event.type == "session.retry":
            wait = max(0.0, float(data.get("next", 0)) - time.time())
            print(
                f"… provider error, retry {data.get('attempt')} in {wait:.0f}s: "
                f"{data.get('error')}",
                file=self._err,
                flush=True,
            )

    async def _ask(self, event: Event) -> None:
        import trio

        data = event.data
        child = event.session_id != self._session_id
        question = (
            f"\n? {data['permission']} wants '{data['pattern']}'"
            f"{' (session ' + event.session_id + ')' if child else ''}"
            f"\n  [o]nce  [a]lways ({data['always']})  [r]eject  — or type feedback to reject: "
        )
        print(question, end="", file=self._err, flush=True)
        line = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
        answer = line.strip()
        if answer.lower() in ("o", "once", "y", "yes"):
            await self._h.reply_permission(data["id"], "once")
        elif answer.lower() in ("a", "always"):
            await self._h.reply_permission(data["id"], "always")
        elif answer.lower() in ("", "r", "reject", "n", "no"):
            await self._h.reply_permission(data["id"], "reject")
        else:
            await self._h.reply_permission(data["id"], "reject", answer)


def _summary(state: dict[str, Any]) -> str:
    metadata = state.get("metadata") or {}
    if "lines" in metadata:
        return f"{metadata['lines']} lines"
    if "exit" in metadata:
        return f"exit {metadata['exit']}"
    output = state.get("output") or ""
    count = output.count("\n") + 1 if output else 0
    return f"{count} lines"


# --- sessions and show (read the ledger directly) ---------------------------------------


def _open_ledger() -> Any:
    from harness.config import Config
    from harness.storage.ledger import Ledger, LedgerError

    config = Config.from_env()
    if not config.ledger_path.exists():
        raise UsageError(f"no ledger at {config.ledger_path} (set HARNESS_HOME?)")
    try:
        return Ledger(config.ledger_path, durability=config.durability)
    except LedgerError as error:
        raise UsageError(str(error)) from error


def _sessions(args: argparse.Namespace) -> int:
    ledger = _open_ledger()
    sessions = ledger.sessions()
    if args.json:
        print(json.dumps([s.model_dump(mode="json") for s in sessions], indent=2))
        return EXIT_OK
    print(f"{'ID':36} {'STATUS':6} {'MODEL':32} {'TOKENS':>8} {'COST':>8}  UPDATED  TITLE")
    for s in sessions:
        updated = time.strftime("%m-%d %H:%M", time.localtime(s.updated))
        print(
            f"{s.id:36} {s.status:6} {s.model[-32:]:32} {s.tokens.total:>8} "
            f"{s.cost:>8.4f}  {updated}  {s.title}"
        )
    return EXIT_OK


def _show(args: argparse.Namespace) -> int:
    ledger = _open_ledger()
    session = ledger.session(args.session)
    if session is None:
        raise UsageError(f"no session {args.session}")
    transcript: list[MessageWithParts] = ledger.messages(session.id)
    if args.json:
        print(
            json.dumps(
                {
                    "session": session.model_dump(mode="json"),
                    "messages": [m.model_dump(mode="json") for m in transcript],
                },
                indent=2,
            )
        )
        return EXIT_OK
    print(f"{session.id}  {session.status}  {session.model}  {session.directory}")
    for entry in transcript:
        info = entry.info
        label = info.role if info.role == "user" else f"assistant (step {info.step})"
        print(f"\n── {label}  {info.id}")
        for part in entry.parts:
            if part.type == "text":
                print(part.text)
            elif part.type == "tool":
                state = part.state
                detail = getattr(state, "output", None) or getattr(state, "error", "")
                print(f"[{part.tool} {state.status}] {json.dumps(state.input)}")
                if detail:
                    print("  " + "\n  ".join(str(detail).splitlines()[:20]))
            elif part.type == "step-finish":
                print(f"[finish: {part.reason}; {part.tokens.total} tokens; ${part.cost:.4f}]")
        if info.role == "assistant" and info.error:
            print(f"[error: {info.error}]")
    return EXIT_OK
