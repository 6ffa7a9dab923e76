"""The command line (DESIGN §9): ``serve``, ``run``, ``sessions``, ``show``, ``events``,
``cancel``, ``approve``, ``deny``, ``answer``.

Only the standard library is imported at module level: ``harness --help`` must answer in
well under 100 ms, and each command imports what it needs when it runs. The commands that
talk to the daemon use ``harness.client`` (standard library only), so ``harness sessions``
against a live daemon never loads Trio, httpx or pydantic.

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
    from harness.client import Client, WireEvent
    from harness.messages.events import Event
    from harness.messages.model import Rule
    from harness.runtime import Harness

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_LIMIT, EXIT_DENIED, EXIT_CANCELLED = 0, 1, 2, 3, 4, 130
EXIT_BY_REASON = {
    "answered": EXIT_OK,
    "error": EXIT_ERROR,
    "max_steps": EXIT_LIMIT,
    "doom_loop": EXIT_LIMIT,
    "budget": EXIT_LIMIT,
    "overflow": EXIT_LIMIT,
    "denied": EXIT_DENIED,
    "cancelled": EXIT_CANCELLED,
}


class UsageError(Exception):
    """Bad flags or arguments: exit 2 with the message."""


_DURABILITY_HELP = (
    "normal (default): a commit survives a crash of the process; "
    "full: it also survives a power loss (an fsync per commit batch)"
)
_SANDBOX_MODES = ("workspace-write", "read-only", "off")  # harness/tools/sandbox.py
_SANDBOX_HELP = (
    "what commands run under: workspace-write (default: only the session directory and "
    "a private /tmp writable, no network), read-only, or off ($HARNESS_SANDBOX)"
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="harness",
        description="A coding-agent runtime: a model decides, tools act under a permission "
        "gate, and every fact lands in a SQLite ledger under $HARNESS_HOME.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = commands.add_parser("run", help="send a prompt and print the final answer")
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
    run.add_argument(
        "--yes", action="store_true", help="allow every permission that asks (never a deny)"
    )
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
        "--embedded", action="store_true", help="run in this process even when a daemon answers"
    )
    run.add_argument("--durability", choices=("normal", "full"), help=_DURABILITY_HELP)
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
    run.add_argument("--sandbox", choices=_SANDBOX_MODES, help=_SANDBOX_HELP)

    serve = commands.add_parser("serve", help="run the daemon: the HTTP API on a Unix socket")
    serve.add_argument(
        "--socket", help="the socket path (default $HARNESS_SOCKET or $HARNESS_HOME/harness.sock)"
    )
    serve.add_argument("--log-file", help="write the JSON log lines to this file, not stderr")
    serve.add_argument("--durability", choices=("normal", "full"), help=_DURABILITY_HELP)
    serve.add_argument("--sandbox", choices=_SANDBOX_MODES, help=_SANDBOX_HELP)

    sessions = commands.add_parser("sessions", help="list sessions")
    sessions.add_argument("--json", action="store_true", help="print JSON")

    show = commands.add_parser("show", help="print a session's transcript")
    show.add_argument("session", help="the session id (ses_…)")
    show.add_argument("--json", action="store_true", help="print JSON")

    trace = commands.add_parser("trace", help="draw a session's tree: steps, tools, children")
    trace.add_argument("session", help="the session id (ses_…)")
    trace.add_argument("--json", action="store_true", help="print JSON")

    diff = commands.add_parser(
        "diff", help="show what a session changed in its files, as a unified diff"
    )
    diff.add_argument("session", help="the session id (ses_…)")
    diff.add_argument("--since", metavar="MESSAGE", help="only changes from this message on")
    diff.add_argument("--json", action="store_true", help="print JSON")

    revert = commands.add_parser(
        "revert", help="put the files back as they were before a message of a session"
    )
    revert.add_argument("session", help="the session id (ses_…)")
    revert.add_argument(
        "--to", required=True, metavar="MESSAGE", help="the message (msg_…) to go back before"
    )
    revert.add_argument("--json", action="store_true", help="print JSON")

    events = commands.add_parser("events", help="follow the daemon's event stream (Ctrl-C stops)")
    events.add_argument("--session", help="only this session and its child sessions")
    events.add_argument("--after", type=int, help="replay from the ledger after this seq first")
    events.add_argument("--json", action="store_true", help="print one event object per line")

    cancel = commands.add_parser("cancel", help="cancel a session's running turn")
    cancel.add_argument("session", help="the session id (ses_…)")
    cancel.add_argument("--json", action="store_true", help="print JSON")

    approve = commands.add_parser("approve", help="allow a pending permission ask")
    approve.add_argument("permission", help="the permission request id (per_…)")
    approve.add_argument(
        "--always", action="store_true", help="also allow it from now on in this project"
    )
    approve.add_argument("--json", action="store_true", help="print JSON")

    deny = commands.add_parser("deny", help="reject a pending permission ask")
    deny.add_argument("permission", help="the permission request id (per_…)")
    deny.add_argument("--message", help="feedback the model sees (the turn then continues)")
    deny.add_argument("--json", action="store_true", help="print JSON")

    answer = commands.add_parser(
        "answer",
        help="answer a pending question",
        description="Answer a question the model asked: one ANSWER per question, in order. "
        "An answer is an option's label or number, several separated by commas when the "
        "question allows more than one, or text of your own.",
    )
    answer.add_argument("question", help="the question id (que_…)")
    answer.add_argument("answers", nargs="*", metavar="ANSWER", help="one answer per question")
    answer.add_argument("--reject", action="store_true", help="dismiss the question instead")
    answer.add_argument(
        "--message", help="with --reject: feedback the model sees (the turn then continues)"
    )
    answer.add_argument("--json", action="store_true", help="print JSON")
    return parser


def _redact_output() -> None:
    """Whatever a command prints passes redaction when this process knows a secret."""
    from harness.secrets import RedactingStream, has_secrets

    if has_secrets():
        if not isinstance(sys.stdout, RedactingStream):
            sys.stdout = RedactingStream(sys.stdout)
        if not isinstance(sys.stderr, RedactingStream):
            sys.stderr = RedactingStream(sys.stderr)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    parser = _parser()
    args = parser.parse_args(argv)
    _redact_output()
    commands = {
        "run": _run,
        "serve": _serve,
        "sessions": _sessions,
        "show": _show,
        "trace": _trace,
        "diff": _diff,
        "revert": _revert,
        "events": _events,
        "cancel": _cancel,
        "approve": _approve,
        "deny": _deny,
        "answer": _answer,
    }
    try:
        command = commands.get(args.command)
        if command is None:
            parser.print_help(sys.stderr)
            code = EXIT_USAGE
        else:
            code = command(args)
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
    from harness.config import ConfigError

    if isinstance(first, ConfigError):
        print(f"harness: {first}", file=sys.stderr)
        return EXIT_USAGE
    from harness.client import ApiError, DaemonUnavailable

    if isinstance(first, ApiError):
        print(f"harness: {first.message}", file=sys.stderr)
        return EXIT_USAGE if first.status in (400, 404, 422) else EXIT_ERROR
    if isinstance(first, DaemonUnavailable):
        print(f"harness: {first}", file=sys.stderr)
        return EXIT_ERROR
    storage = _storage_failure(first)
    if storage is not None:
        print(f"harness: {storage}", file=sys.stderr)
        return EXIT_ERROR
    if isinstance(first, KeyboardInterrupt):
        return EXIT_CANCELLED
    if isinstance(first, BrokenPipeError):
        # The reader went away (`| head`): not our failure to report.
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the final flush
        return EXIT_ERROR
    import traceback

    from harness.config import default_home
    from harness.private import open_private, private_dir
    from harness.secrets import redact

    crash = default_home() / "logs" / "crash.log"
    try:
        private_dir(private_dir(default_home()) / "logs")
        with open_private(crash, "a", encoding="utf-8") as out:
            out.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
            out.write(redact("".join(traceback.format_exception(error))))
        where = f"details in {crash}"
    except OSError as unwritable:
        where = f"no details: {crash} cannot be written: {unwritable.strerror or unwritable}"
    print(
        redact(f"harness: internal error: {type(first).__name__}: {first} ({where})"),
        file=sys.stderr,
    )
    return EXIT_ERROR


def _storage_failure(error: BaseException) -> str | None:
    """One line for a failure of the disk or the ledger; None for anything else.

    A read-only or full ``HARNESS_HOME``, a corrupt or truncated ledger: the user's
    files, not a bug, so no traceback and no crash log (which could not be written).
    """
    import errno

    from harness.storage.ledger import LedgerError

    if isinstance(error, LedgerError):
        return str(error)
    if "apsw" in sys.modules:
        import apsw

        if isinstance(error, apsw.Error):
            return f"the ledger cannot be read or written: {error}"
    if isinstance(error, OSError) and error.errno is not None:
        if error.errno == errno.ENOSPC:
            return f"disk full: {error.filename or 'a write'} failed ({error.strerror})"
        if error.filename is not None:
            return f"{error.filename}: {error.strerror or error}"
    return None


# --- run --------------------------------------------------------------------------------


def _rules(args: argparse.Namespace) -> list[Rule]:
    from harness.permissions.ruleset import parse_rule_flag

    # --yes is not a rule: it answers asks (Config.yes, _DaemonTurn), so no rule it could
    # outrank, the plan agent's `edit deny` included, is ever lifted by it.
    rules: list[Rule] = []
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
    for flag in ("budget_tokens", "budget_cost", "budget_time"):
        value = getattr(args, flag)
        if value is not None and not value > 0:
            raise UsageError(f"--{flag.replace('_', '-')} must be more than 0")
    text = _prompt_text(args)
    rules = _rules(args)
    directory = Path(args.dir).expanduser()
    if not directory.is_dir():
        raise UsageError(f"--dir {args.dir}: no such directory")
    interactive = sys.stdin.isatty() and args.prompt != ["-"]
    record = _record_path(args.record)
    if not args.embedded and _daemon_can_take(args):
        client = _client()
        if client is not None and client.alive():
            return _run_via_daemon(client, args, text, rules, directory, interactive)

    import trio

    from harness.config import Config

    config = Config.from_env(
        model=args.model,
        base_url=args.base_url,
        agent=args.agent,
        # --max-steps is the turn's (sent with the prompt), as through the daemon: not a
        # harness-wide limit that would also cut subtasks and other sessions' resumed turns.
        rules=rules,
        interactive=interactive,
        yes=args.yes,
        durability=args.durability,
        record=record,
        budget_tokens=args.budget_tokens,
        budget_cost=args.budget_cost,
        budget_time=args.budget_time,
        show_request=args.show_request or None,
        sandbox=args.sandbox,
    )
    config.log_file = config.home / "logs" / f"run-{time.strftime('%Y%m%d')}.jsonl"
    return trio.run(_run_async, config, args, text, directory)


def _record_path(value: str | None) -> Path | None:
    """The cassette ``--record`` names, emptied now: a run records afresh."""
    if value is None:
        return None
    from harness.private import open_private

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

    client = _client()
    if client is None:
        return None
    try:
        mode = client.health().get("sandbox")
    except (DaemonUnavailable, OSError, ApiError, ValueError):
        return None
    return mode if isinstance(mode, str) else None


async def _run_async(config: Any, args: argparse.Namespace, text: str, directory: Path) -> int:
    import trio

    from harness.agents import UnknownAgentError
    from harness.providers.errors import ProviderError
    from harness.runtime import HarnessError, open_harness
    from harness.snapshots import SessionBusy
    from harness.storage.ledger import LedgerError

    view_code: int | None = None
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
                    session = await h.create_session(
                        directory, model=config.model, agent=config.agent, base_url=config.base_url
                    )
            except SessionBusy as error:  # not a usage error: the same command works later
                print(f"harness: {error}", file=sys.stderr)
                return EXIT_ERROR
            except (HarnessError, UnknownAgentError, ProviderError) as error:
                raise UsageError(str(error)) from error
            view = _Progress(h, session.id, json_mode=args.json, interactive=config.interactive)
            async with h.subscribe(session.id) as events, trio.open_nursery() as nursery:
                message_id = await h.prompt(session.id, text, max_steps=args.max_steps)
                nursery.start_soon(_cancel_on_interrupt, h, session.id, nursery)
                code = view_code = await view.follow(events, message_id, nursery)
                nursery.cancel_scope.cancel()
            return code
    except LedgerError as error:
        if view_code is not None:
            return view_code  # the turn's end already said why (a full disk)
        print(f"harness: {error}", file=sys.stderr)
        return EXIT_ERROR


async def _cancel_on_interrupt(h: Harness, session_id: str, nursery: Any) -> None:
    """Ctrl-C cancels the turn cleanly (the ledger records it); a second one exits at once."""
    import signal

    import trio

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            print(_CANCELLING, file=sys.stderr)
            await h.cancel(session_id)
            break
        async for _ in signals:
            os._exit(EXIT_CANCELLED)


_CANCELLING = "\ncancelling… (Ctrl-C again to quit now)"


class _Display:
    """How a run looks, embedded or through the daemon: steps on stderr, answer on stdout."""

    def __init__(self, session_id: str, *, json_mode: bool) -> None:
        self.session_id = session_id
        self.json = json_mode
        self._err: TextIO = sys.stderr
        self._sandbox_noticed = False

    def show(self, event: Event | WireEvent) -> None:
        if event.type == "sandbox.unavailable" and not self._sandbox_noticed:
            # On stderr even with --json: the one line that says commands ran unsandboxed.
            self._sandbox_noticed = True
            print(f"harness: {event.data.get('notice')}", file=self._err, flush=True)
        if self.json:
            print(event.to_json(), flush=True)
            return
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
        elif event.type == "step.request":
            print(json.dumps(data, indent=2, ensure_ascii=False), file=self._err, flush=True)
        elif event.type == "todo.updated":
            print(todo_lines(data.get("todos") or [], indent="  "), file=self._err, flush=True)
        elif event.type == "session.retry":
            wait = max(0.0, float(data.get("next", 0)) - time.time())
            print(
                f"… provider error, retry {data.get('attempt')} in {wait:.0f}s: "
                f"{data.get('error')}",
                file=self._err,
                flush=True,
            )

    def finish(self, event: Event | WireEvent) -> int:
        reason = event.data["reason"]
        answer = event.data.get("answer") or ""
        error = event.data.get("error")
        if not self.json:
            if answer:
                print(answer, flush=True)
            if reason == "error":
                print(f"harness: error: {error}", file=self._err)
            elif reason != "answered":
                detail = f": {error}" if error else ""
                print(f"harness: stopped ({reason}){detail}", file=self._err)
        return EXIT_BY_REASON.get(reason, EXIT_ERROR)

    def question(self, event: Event | WireEvent) -> str:
        data = event.data
        child = event.session_id != self.session_id
        return (
            f"\n? {data['permission']} wants '{data['pattern']}'"
            f"{' (session ' + event.session_id + ')' if child else ''}"
            f"\n  [o]nce  [a]lways ({data['always']})  [r]eject  — or type feedback to reject: "
        )


def _parse_answer(line: str) -> tuple[str, str | None]:
    """A typed answer to a permission ask: the reply, and feedback when it is free text."""
    answer = line.strip()
    if answer.lower() in ("o", "once", "y", "yes"):
        return "once", None
    if answer.lower() in ("a", "always"):
        return "always", None
    if answer.lower() in ("", "r", "reject", "n", "no"):
        return "reject", None
    return "reject", answer


class _Progress:
    """Follows an embedded run: shows each event and asks permission at the terminal."""

    def __init__(self, h: Harness, session_id: str, *, json_mode: bool, interactive: bool):
        self._h = h
        self._view = _Display(session_id, json_mode=json_mode)
        self._interactive = interactive

    async def follow(self, events: Any, message_id: str, nursery: Any) -> int:
        async for event in events:
            self._view.show(event)
            if event.type == "permission.asked" and self._interactive:
                nursery.start_soon(self._ask, event)
            if event.type == "question.asked" and self._interactive:
                nursery.start_soon(self._ask_question, event)
            if event.type == "turn.finished" and event.data.get("message_id") == message_id:
                return self._view.finish(event)
        print("harness: the event stream ended before the answer", file=sys.stderr)
        return EXIT_ERROR

    async def _ask(self, event: Event) -> None:
        import trio

        print(self._view.question(event), end="", file=sys.stderr, flush=True)
        line = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
        reply, message = _parse_answer(line)
        await self._h.reply_permission(event.data["id"], reply, message)  # type: ignore[arg-type]

    async def _ask_question(self, event: Event) -> None:
        import trio

        child = event.session_id if event.session_id != self._view.session_id else None
        answers = await trio.to_thread.run_sync(
            _ask_at_terminal, event.data, child, abandon_on_cancel=True
        )
        if answers is None:
            await self._h.reject_question(event.data["id"])
        else:
            await self._h.answer_question(event.data["id"], answers)


def _ask_at_terminal(data: dict[str, Any], child: str | None) -> list[list[str]] | None:
    """Ask each question of a ``question.asked`` event; None when the user dismisses them."""
    texts: list[str] = []
    for index in range(len(data["questions"])):
        print(question_prompt(data, index, child), end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline().strip()
        if not line:
            return None
        texts.append(line)
    return shape_answers(data["questions"], texts)


def todo_lines(todos: list[dict[str, Any]], indent: str = "") -> str:
    """A task list as ``show`` and ``run`` print it: ``[x] write tests (high)``."""
    marks = {"pending": "[ ]", "in_progress": "[>]", "completed": "[x]", "cancelled": "[-]"}
    done = sum(t.get("status") == "completed" for t in todos)
    lines = [f"todos: {done}/{len(todos)} completed"]
    for todo in todos:
        mark = marks.get(todo.get("status", ""), "[?]")
        lines.append(f"{indent}{mark} {todo.get('content')} ({todo.get('priority', 'medium')})")
    return "\n".join(lines)


def _summary(state: dict[str, Any]) -> str:
    metadata = state.get("metadata") or {}
    if "todos" in metadata or "answers" in metadata:
        return str(state.get("title") or "done")  # "3 todos", "asked 2 questions"
    if "lines" in metadata:
        return f"{metadata['lines']} lines"
    if "exit" in metadata:
        return f"exit {metadata['exit']}"
    output = state.get("output") or ""
    count = output.count("\n") + 1 if output else 0
    return f"{count} lines"


# --- run through the daemon -------------------------------------------------------------


def _client() -> Client | None:
    """A client for the daemon's socket, or None when no usable socket path exists."""
    from harness.client import Client
    from harness.config import Config, SocketPathError

    try:
        return Client(Config.from_env().socket_path)
    except SocketPathError:
        return None


def _model_for_daemon(args: argparse.Namespace) -> str | None:
    """The model this process would use; a scripted file resolved against our directory."""
    model: str | None = args.model or os.environ.get("HARNESS_MODEL") or None
    for kind in ("scripted:", "replay:"):
        if model is not None and model.startswith(kind):
            model = kind + str(Path(model.removeprefix(kind)).expanduser().resolve())
    return model


def _run_via_daemon(
    client: Client,
    args: argparse.Namespace,
    text: str,
    rules: list[Rule],
    directory: Path,
    interactive: bool,
) -> int:
    from harness.client import ApiError
    from harness.messages import ids

    base_url = args.base_url or os.environ.get("HARNESS_BASE_URL") or None
    try:
        if args.session:
            session_id = client.session(args.session)["id"]
            if rules or args.base_url:
                client.update_session(
                    session_id,
                    permission=[rule.model_dump() for rule in rules],
                    base_url=args.base_url,
                )
        else:
            session_id = client.create_session(
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
            print(f"harness: {error.message}", file=sys.stderr)
            return EXIT_ERROR
        raise
    # Follow from the ledger's current end, subscribed before the prompt goes in: every
    # event of this turn reaches us, deltas included, and a reconnect replays the rest.
    stream = client.events(session_id, after=client.health()["last_seq"])
    stream.open()
    message_id = client.prompt(
        session_id, text, message_id=ids.message_id(), max_steps=args.max_steps
    )
    turn = _DaemonTurn(
        client, _Display(session_id, json_mode=args.json), interactive, yes=args.yes
    )
    try:
        return turn.follow(stream, message_id)
    finally:
        stream.close()


class _DaemonTurn:
    """Follows one turn through the daemon, with embedded ``run``'s output and exit codes."""

    def __init__(
        self, client: Client, view: _Display, interactive: bool, *, yes: bool = False
    ) -> None:
        self._client = client
        self._view = view
        self._interactive = interactive
        # --yes through the daemon: this client answers "once" to every ask of its session
        # tree. The daemon asks only what no rule decided, so a deny is never seen here.
        self._yes = yes
        self._asked: set[str] = set()
        self._rejected_calls: set[str] = set()

    def follow(self, stream: Any, message_id: str) -> int:
        import signal

        signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM cancels like Ctrl-C, as embedded
        cancelled = False
        while True:
            try:
                for event in stream:
                    if not self._already_shown(event):
                        self._view.show(event)
                    if event.type == "permission.asked":
                        self._answer(event)
                    if event.type == "question.asked":
                        self._answer_question(event)
                    if event.type == "turn.finished" and event.data.get("message_id") == message_id:
                        return self._view.finish(event)
            except KeyboardInterrupt:
                if cancelled:
                    return EXIT_CANCELLED
                cancelled = True
                print(_CANCELLING, file=sys.stderr)
                self._client.cancel(self._view.session_id)
                stream.close()  # the read was cut mid-frame: resume from the last id

    def _already_shown(self, event: WireEvent) -> bool:
        """The error line of a call we rejected for lack of a terminal was printed already."""
        data = event.data
        return (
            not self._view.json
            and event.type == "part.updated"
            and data.get("call_id") in self._rejected_calls
            and data.get("state", {}).get("status") == "error"
        )

    def _answer(self, event: WireEvent) -> None:
        from harness.client import ApiError

        data = event.data
        if data["id"] in self._asked:
            return  # replayed after a reconnect: answered already
        self._asked.add(data["id"])
        message: str | None = None
        no_terminal = not self._interactive and not self._yes
        if self._yes:
            reply = "once"
        elif self._interactive:
            print(self._view.question(event), end="", file=sys.stderr, flush=True)
            reply, message = _parse_answer(sys.stdin.readline())
        else:
            # Nobody to ask: reject at once, with the same words an embedded run prints.
            from harness.actors.permission import no_terminal_hint

            reply = "reject"
            self._rejected_calls.add(data["call_id"])
            if not self._view.json:
                hint = no_terminal_hint(data["permission"], data["always"])
                print(f"✗ {data['tool']}: the call was rejected: {hint}", file=sys.stderr)
        try:
            self._client.reply_permission(data["id"], reply, message, no_terminal=no_terminal)
        except ApiError as error:
            if error.status != 404:  # 404: someone else answered it first
                raise

    def _answer_question(self, event: WireEvent) -> None:
        from harness.client import ApiError

        data = event.data
        if data["id"] in self._asked:
            return  # replayed after a reconnect: answered already
        self._asked.add(data["id"])
        try:
            if self._interactive:
                child = event.session_id if event.session_id != self._view.session_id else None
                answers = _ask_at_terminal(data, child)
                if answers is None:
                    self._client.reject_question(data["id"])
                else:
                    self._client.answer_question(data["id"], answers)
                return
            # Nobody to ask: the call fails at once and the model carries on, as embedded.
            from harness.messages.question import NO_TERMINAL

            self._rejected_calls.add(data["call_id"])
            if not self._view.json:
                line = f"✗ question: the question could not be asked: {NO_TERMINAL}"
                print(line, file=sys.stderr)
            self._client.reject_question(data["id"], NO_TERMINAL)
        except ApiError as error:
            if error.status != 404:  # 404: someone else answered it first
                raise


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


# --- serve ------------------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> int:
    import signal

    import structlog
    import trio

    from harness.config import Config, SocketPathError, usable_socket_path
    from harness.logs import configure_logging
    from harness.server import DaemonRunning, serve
    from harness.storage.ledger import LedgerError

    # An unavailable sandbox is a warning in the log (stderr, one JSON object a line).
    config = Config.from_env(durability=args.durability, sandbox=args.sandbox)
    log_file = Path(args.log_file).expanduser() if args.log_file else None
    configure_logging(level=config.log_level, format=config.log_format, file=log_file)
    log = structlog.get_logger("harness.serve")
    try:
        path = usable_socket_path(Path(args.socket)) if args.socket else config.socket_path
    except SocketPathError as error:
        log.error("cannot start", error=str(error))
        return EXIT_ERROR

    async def main() -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                await nursery.start(serve, config, path)
                async for number in signals:
                    # Turns in flight stop here and stay in the ledger, to be resumed.
                    log.info("shutting down", signal=signal.Signals(number).name)
                    nursery.cancel_scope.cancel()
                    break

    try:
        trio.run(main)
    except BaseException as error:
        refusals = DaemonRunning | LedgerError | OSError
        refused = [leaf for leaf in _leaves(error) if isinstance(leaf, refusals)]
        if not refused:
            raise
        log.error("cannot start", error=str(refused[0]))
        return EXIT_ERROR
    return EXIT_OK


# --- commands that read sessions: the daemon when it answers, else the ledger -----------


def _from_daemon(call: Any) -> Any:
    """``call(client)`` against the daemon, or None when no daemon answers."""
    from harness.client import DaemonUnavailable

    client = _client()
    if client is None:
        return None
    try:
        return call(client)
    except DaemonUnavailable:
        return None


def _open_ledger(*, read_only: bool = True) -> Any:
    from harness.config import Config
    from harness.storage.ledger import Ledger

    config = Config.from_env()
    if not config.ledger_path.exists():
        raise UsageError(f"no ledger at {config.ledger_path} (set HARNESS_HOME?)")
    # Read-only: a reader never changes the file, and works on a read-only one. A file
    # that cannot be read is a storage failure (exit 1), not a usage error.
    return Ledger(config.ledger_path, durability=config.durability, read_only=read_only)


def _sessions(args: argparse.Namespace) -> int:
    sessions: list[dict[str, Any]] | None = _from_daemon(lambda client: client.sessions())
    if sessions is None:
        sessions = [s.model_dump(mode="json") for s in _open_ledger().sessions()]
    if args.json:
        print(json.dumps(sessions, indent=2))
        return EXIT_OK
    print(f"{'ID':36} {'STATUS':6} {'MODEL':32} {'TOKENS':>8} {'COST':>8}  UPDATED  TITLE")
    for s in sessions:
        updated = time.strftime("%m-%d %H:%M", time.localtime(s["updated"]))
        tokens = sum(s.get("tokens", {}).values())
        print(
            f"{s['id']:36} {s['status']:6} {s['model'][-32:]:32} {tokens:>8} "
            f"{s.get('cost', 0.0):>8.4f}  {updated}  {s.get('title', '')}"
        )
    return EXIT_OK


def _transcript_from_daemon(client: Client, session_id: str) -> Any:
    from harness.client import ApiError

    try:
        return client.session(session_id), client.messages(session_id), client.todos(session_id)
    except ApiError as error:
        if error.status == 404:
            raise UsageError(error.message) from error
        raise


def _trace(args: argparse.Namespace) -> int:
    """The session tree, read from the ledger (readers never wait for the daemon's writes)."""
    from harness.trace import build_trace, render_trace

    try:
        data = build_trace(_open_ledger(), args.session)
    except LookupError as error:
        raise UsageError(str(error).strip("'\"")) from error
    print(json.dumps(data, indent=2) if args.json else render_trace(data))
    return EXIT_OK


def _diff(args: argparse.Namespace) -> int:
    """The session's file changes: from the daemon when it answers, else the ledger."""
    answer = _from_daemon(lambda client: _diff_from_daemon(client, args.session, args.since))
    if answer is None:
        from harness.snapshots import SnapshotError, diff_session

        try:
            text, files = diff_session(_open_ledger(), args.session, since_message=args.since)
        except SnapshotError as error:
            raise UsageError(str(error)) from error
        answer = {"session_id": args.session, "files": files, "diff": text}
    if args.json:
        print(json.dumps(answer, indent=2))
    elif answer["diff"]:
        sys.stdout.write(answer["diff"])
    else:
        print("no file changes", file=sys.stderr)
    return EXIT_OK


def _diff_from_daemon(client: Client, session_id: str, since: str | None) -> Any:
    from harness.client import ApiError

    try:
        return client.diff(session_id, since)
    except ApiError as error:
        if error.status in (404, 422):
            raise UsageError(error.message) from error
        raise


def _revert(args: argparse.Namespace) -> int:
    """Revert through the daemon when it answers, else on the ledger directly."""
    from harness.client import ApiError

    client = _client()
    if client is not None and client.alive():
        try:
            result = client.revert(args.session, args.to)
        except ApiError as error:
            if error.status in (404, 422):
                raise UsageError(error.message) from error
            print(f"harness: {error.message}", file=sys.stderr)
            return EXIT_ERROR
    else:
        from harness.snapshots import RevertConflict, SessionBusy, SnapshotError

        found = _revert_embedded(args.session, args.to)
        if isinstance(found, RevertConflict | SessionBusy):
            print(f"harness: {found}", file=sys.stderr)
            return EXIT_ERROR
        if isinstance(found, SnapshotError):
            raise UsageError(str(found))
        result = found.to_dict()
    if args.json:
        print(json.dumps(result, indent=2))
        return EXIT_OK
    files = [f for f in result["files"] if f["action"] != "unchanged"]
    print(f"reverted {args.session} to before {args.to}: {len(files)} file(s) changed")
    for file in files:
        print(f"  {file['action']:9} {file['shown']}")
    return EXIT_OK


def _revert_embedded(session_id: str, message_id: str) -> Any:
    """The revert on the ledger, with a writer of its own: the result or the SnapshotError."""
    import trio

    from harness.snapshots import SnapshotError, revert_session

    ledger = _open_ledger(read_only=False)

    async def main() -> Any:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ledger.run_writer, None)
            try:
                return await revert_session(ledger, session_id, message_id)
            except SnapshotError as error:
                return error
            finally:
                ledger.close_writer()

    try:
        return trio.run(main)
    finally:
        ledger.close()


def _show(args: argparse.Namespace) -> int:
    found = _from_daemon(lambda client: _transcript_from_daemon(client, args.session))
    if found is None:
        ledger = _open_ledger()
        stored = ledger.session(args.session)
        if stored is None:
            raise UsageError(f"no session {args.session}")
        found = (
            stored.model_dump(mode="json"),
            [m.model_dump(mode="json") for m in ledger.messages(stored.id)],
            [t.model_dump(mode="json") for t in ledger.todos(stored.id)],
        )
    session, transcript, todos = found
    if args.json:
        print(json.dumps({"session": session, "messages": transcript, "todos": todos}, indent=2))
        return EXIT_OK
    print(f"{session['id']}  {session['status']}  {session['model']}  {session['directory']}")
    for entry in transcript:
        info = entry["info"]
        label = info["role"] if info["role"] == "user" else f"assistant (step {info.get('step')})"
        print(f"\n── {label}  {info['id']}")
        for part in entry["parts"]:
            _print_part(part)
        if info["role"] == "assistant" and info.get("error"):
            print(f"[error: {info['error']}]")
    if todos:
        print("\n── " + todo_lines(todos, indent="  "))
    return EXIT_OK


def _print_part(part: dict[str, Any]) -> None:
    if part["type"] == "text":
        print(part["text"])
    elif part["type"] == "tool":
        state = part["state"]
        detail = state.get("output") or state.get("error") or ""
        print(f"[{part['tool']} {state['status']}] {json.dumps(state.get('input', {}))}")
        if detail:
            print("  " + "\n  ".join(str(detail).splitlines()[:20]))
    elif part["type"] == "patch":
        changed = ", ".join(f"{f['path']} +{f['added']} -{f['removed']}" for f in part["files"])
        print(f"[patch] {changed}")
    elif part["type"] == "step-finish":
        tokens = sum(part.get("tokens", {}).values())
        print(f"[finish: {part['reason']}; {tokens} tokens; ${part.get('cost', 0.0):.4f}]")


# --- commands that need the daemon ------------------------------------------------------


def _require_daemon() -> Client:
    from harness.client import DaemonUnavailable

    client = _client()
    if client is None or not client.alive():
        where = client.socket_path if client is not None else "$HARNESS_SOCKET"
        raise DaemonUnavailable(f"no daemon answers on {where} (start one with `harness serve`)")
    return client


def _events(args: argparse.Namespace) -> int:
    stream = _require_daemon().events(args.session, args.after)
    try:
        for event in stream:
            print(event.to_json() if args.json else _event_line(event), flush=True)
    except KeyboardInterrupt:
        return EXIT_CANCELLED
    finally:
        stream.close()
    return EXIT_OK


def _event_line(event: WireEvent) -> str:
    when = time.strftime("%H:%M:%S", time.localtime(event.ts))
    seq = str(event.seq) if event.seq is not None else "-"
    data = json.dumps(event.data, ensure_ascii=False)
    return f"{seq:>7} {when} {event.session_id} {event.type:18} {data[:120]}"


def _print_result(args: argparse.Namespace, body: dict[str, Any], text: str) -> int:
    print(json.dumps(body) if args.json else text)
    return EXIT_OK


def _cancel(args: argparse.Namespace) -> int:
    cancelled = _require_daemon().cancel(args.session)
    text = "cancelled the running turn" if cancelled else "nothing was running"
    return _print_result(args, {"session_id": args.session, "cancelled": cancelled}, text)


def _approve(args: argparse.Namespace) -> int:
    reply = "always" if args.always else "once"
    _require_daemon().reply_permission(args.permission, reply)
    return _print_result(args, {"id": args.permission, "reply": reply}, f"approved ({reply})")


def _deny(args: argparse.Namespace) -> int:
    _require_daemon().reply_permission(args.permission, "reject", args.message)
    return _print_result(args, {"id": args.permission, "reply": "reject"}, "denied")


def _answer(args: argparse.Namespace) -> int:
    if args.reject == bool(args.answers):
        raise UsageError("give one ANSWER per question, or --reject")
    if args.message is not None and not args.reject:
        raise UsageError("--message goes with --reject")
    client = _require_daemon()
    if args.reject:
        client.reject_question(args.question, args.message)
        return _print_result(args, {"id": args.question, "rejected": True}, "dismissed")
    pending = {q["id"]: q for q in client.questions()}
    request = pending.get(args.question)
    if request is None:
        raise UsageError(f"no pending question {args.question}")
    answers = shape_answers(request["questions"], args.answers)
    client.answer_question(args.question, answers)
    return _print_result(args, {"id": args.question, "answers": answers}, "answered")


def shape_answers(questions: list[dict[str, Any]], texts: Sequence[str]) -> list[list[str]]:
    """Typed answers, one per question, as the labels the API takes.

    A number picks that option; a label is matched without regard to case; a question
    that allows several answers takes them separated by commas; anything else is the
    user's own answer, kept as typed.
    """
    if len(texts) != len(questions):
        raise UsageError(
            f"{len(questions)} question(s) asked and {len(texts)} answer(s) given: "
            "give one ANSWER per question, in order (quote an answer that has spaces)"
        )
    shaped: list[list[str]] = []
    for info, text in zip(questions, texts, strict=True):
        labels = [str(o["label"]) for o in info.get("options") or []]
        pieces = text.split(",") if info.get("multiple") else [text]
        chosen: list[str] = []
        for piece in (p.strip() for p in pieces):
            if not piece:
                continue
            if piece.isdigit() and 1 <= int(piece) <= len(labels):
                piece = labels[int(piece) - 1]
            else:
                piece = next((label for label in labels if label.lower() == piece.lower()), piece)
            chosen.append(piece)
        shaped.append(chosen)
    return shaped


def question_prompt(data: dict[str, Any], index: int, child: str | None) -> str:
    """One question of a ``question.asked`` event, as the terminal shows it."""
    info = data["questions"][index]
    count = len(data["questions"])
    head = f"[{info['header']}] " if info.get("header") else ""
    where = f" (session {child})" if child else ""
    number = f" ({index + 1}/{count})" if count > 1 else ""
    lines = [f"\n? {head}{info['question']}{number}{where}"]
    for n, option in enumerate(info.get("options") or [], 1):
        detail = f" — {option['description']}" if option.get("description") else ""
        lines.append(f"  {n}. {option['label']}{detail}")
    several = "numbers or labels, comma-separated" if info.get("multiple") else "a number or label"
    lines.append(f"  answer with {several}, or your own words (empty line dismisses): ")
    return "\n".join(lines)
