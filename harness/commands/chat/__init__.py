"""``harness chat`` (and plain ``harness`` on a terminal): a conversation at the terminal,
through the daemon when one answers, else embedded (DESIGN §13).

A package of the command line, one job per module:

- ``backend``: the daemon or an embedded harness, behind the same blocking calls;
- ``conversation``: what events show and what typed lines and Ctrl-C do;
- ``render``: streamed text cut into Markdown blocks, rendered with rich; tool lines;
- ``screen``: the prompt_toolkit input line, live answer tail and status line;
- ``lines``: plain lines instead, where nothing can be drawn (``TERM=dumb``);
- ``slash``: the slash commands.

Only this module is imported by ``harness --help``, and it imports the standard library
only: prompt_toolkit and rich load when a chat starts.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.commands.base import EXIT_USAGE, UsageError, client

if TYPE_CHECKING:
    from harness.commands.chat.backend import Backend


def register(commands: Any) -> None:
    chat = commands.add_parser(
        "chat", help="talk with the model at the terminal (plain `harness` on a terminal)"
    )
    chat.set_defaults(handler=handle)
    add_arguments(chat)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--session", help="continue this session (ses_…)")
    parser.add_argument(
        "--model", help="mistral/<model>, openai/<model>, scripted:<file> or replay:<cassette>"
    )
    parser.add_argument("--agent", help="build (default) or plan")
    parser.add_argument("--dir", default=".", help="the session's working directory")


def is_terminal() -> bool:
    """Both ends on a terminal: what plain ``harness`` needs to start a chat."""
    return sys.stdin.isatty() and sys.stdout.isatty()


def handle(args: argparse.Namespace) -> int:
    if not is_terminal():
        print("harness chat: needs a terminal (use `harness run` in scripts)", file=sys.stderr)
        return EXIT_USAGE
    directory = Path(args.dir).expanduser()
    if not directory.is_dir():
        raise UsageError(f"--dir {args.dir}: no such directory")
    directory = directory.resolve()
    backend = _daemon_backend() or _embedded_backend(args, directory)
    try:
        session = _open_session(backend, args, directory)
    except _EmbeddedOnly:
        backend.close()
        backend = _embedded_backend(args, directory)
        session = _open_session(backend, args, directory)
    try:
        return _chat(backend, session, directory)
    finally:
        backend.close()


class _EmbeddedOnly(Exception):
    """The project's file holds settings only an embedded harness applies."""


def _daemon_backend() -> Backend | None:
    """The daemon when one answers. Whether it can apply the project's file is its own
    answer to the session's creation (422 ``invalid_config``), so this path never loads
    the configuration models: ``harness chat`` is ready sooner."""
    daemon = client()
    if daemon is None or not daemon.alive():
        return None
    from harness.commands.chat.backend import DaemonBackend

    return DaemonBackend(daemon)


def _embedded_backend(args: argparse.Namespace, directory: Path) -> Backend:
    import time

    from harness import Config, config_overrides, load_settings
    from harness.commands.chat.backend import EmbeddedBackend

    settings = load_settings(directory)
    values = config_overrides(settings)
    values.update({k: v for k, v in {"model": args.model, "agent": args.agent}.items() if v})
    config = Config.from_env(rules=list(settings.rules), interactive=True, **values)
    config.log_file = config.home / "logs" / f"chat-{time.strftime('%Y%m%d')}.jsonl"
    return EmbeddedBackend(config)


def _open_session(backend: Backend, args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    from harness.commands.chat.backend import BackendError

    try:
        if args.session:
            session = backend.session(args.session)
            if args.model or args.agent:  # as /model and /agent would, from the next turn
                session = backend.update_session(
                    session["id"], model=args.model, agent=args.agent
                )
            return session
        model = args.model or os.environ.get("HARNESS_MODEL") or None
        if model is not None and backend.mode == "daemon" and "/" not in model.split(":")[0]:
            # A `kind:FILE` model (scripted:, replay:): the file is ours, relative to our
            # directory, not the daemon's. `mistral/…`, `openai/qwen:7b` skip the
            # provider table's import (~0.1 s of start-up).
            from harness import resolve_model

            model = resolve_model(model)
        return backend.create_session(str(directory), model, args.agent)
    except BackendError as error:
        if error.code == "invalid_config" and "embedded" in str(error):
            raise _EmbeddedOnly(str(error)) from error
        raise UsageError(str(error)) from error


def history_file(directory: Path) -> Path:
    """The input history of the chats in ``directory``: one file per project, 0600, in
    ``$HARNESS_HOME/chat-history/`` (what was typed may hold secrets)."""
    # Imported here: every command imports this module, and hashlib must wait for
    # harness.lean_imports (it loads without OpenSSL then).
    import hashlib

    from harness import default_home, open_private, private_dir

    folder = private_dir(private_dir(default_home()) / "chat-history")
    path = folder / f"{hashlib.sha256(os.fsencode(directory)).hexdigest()[:24]}.history"
    open_private(path, "a").close()  # created 0600, or tightened: prompt_toolkit appends
    return path


def _chat(backend: Backend, session: dict[str, Any], directory: Path) -> int:
    import asyncio

    return asyncio.run(_main(backend, session, directory))


async def _main(backend: Backend, session: dict[str, Any], directory: Path) -> int:
    import asyncio
    import threading

    from harness.commands.chat.conversation import Chat
    from harness.commands.chat.lines import LineScreen
    from harness.commands.chat.render import Renderer, wants_plain
    from harness.commands.chat.screen import PromptScreen

    plain = wants_plain(tty=sys.stdout.isatty())
    screen: PromptScreen | LineScreen
    if os.environ.get("TERM", "") in ("", "dumb"):
        screen = LineScreen()  # nothing can be drawn: plain lines, the kernel's editing
    else:
        from harness.commands.chat.slash import COMMANDS

        screen = PromptScreen(history_file(directory), plain=plain, commands=list(COMMANDS))
    chat = Chat(backend, screen, Renderer(plain=plain), session, loop=asyncio.get_running_loop())
    screen.on_line = chat.submit
    screen.on_interrupt = chat.interrupt
    screen.on_eof = chat.quit
    await chat.switch(session)
    chat.say(
        f"harness chat · {session['id']} in {session.get('directory')} · /help for commands"
    )
    # rich takes ~0.1 s to import: done while the user types the first prompt, once the
    # screen is drawn (before, it would hold the GIL the first drawing needs).
    start = threading.Thread(target=_warm_up, args=(plain,), daemon=True).start
    asyncio.get_running_loop().call_later(0.3, start)
    return await screen.run()


def _warm_up(plain: bool) -> None:
    import gc

    if not plain:
        import rich.markdown  # noqa: F401

    # Everything loaded so far lives as long as the chat: out of the collector's full
    # passes, which would otherwise walk it all (tens of ms) in the middle of a keypress.
    gc.freeze()
