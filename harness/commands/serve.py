"""``harness serve``: run the daemon, the HTTP API on a Unix socket, until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from harness.commands.base import (
    DURABILITY_HELP,
    EXIT_ERROR,
    EXIT_OK,
    LEDGER_HELP,
    SANDBOX_HELP,
    SANDBOX_MODES,
    leaves,
)


def register(commands: Any) -> None:
    serve = commands.add_parser("serve", help="run the daemon: the HTTP API on a Unix socket")
    serve.set_defaults(handler=_serve)
    serve.add_argument(
        "--socket", help="the socket path (default $HARNESS_SOCKET or $HARNESS_HOME/harness.sock)"
    )
    serve.add_argument("--log-file", help="write the JSON log lines to this file, not stderr")
    serve.add_argument("--durability", choices=("normal", "full"), help=DURABILITY_HELP)
    serve.add_argument("--sandbox", choices=SANDBOX_MODES, help=SANDBOX_HELP)
    serve.add_argument("--ledger", help=LEDGER_HELP)


def _serve(args: argparse.Namespace) -> int:
    import signal

    import structlog
    import trio

    from harness import (
        DaemonRunning,
        LedgerError,
        SocketPathError,
        config_from_files,
        configure_logging,
        global_catalog,
        serve,
        usable_socket_path,
    )

    # An unavailable sandbox is a warning in the log (stderr, one JSON object a line).
    # The global configuration file, read once now; a session's project file is read when
    # the session is created (harness/server.py).
    config = config_from_files(
        Path.cwd(),
        project=False,
        durability=args.durability,
        sandbox=args.sandbox,
        ledger=args.ledger,
    )
    global_catalog()  # the global agent files, checked before the daemon starts
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
        refused = [leaf for leaf in leaves(error) if isinstance(leaf, refusals)]
        if not refused:
            raise
        log.error("cannot start", error=str(refused[0]))
        return EXIT_ERROR
    return EXIT_OK

