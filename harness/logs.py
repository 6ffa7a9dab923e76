"""Structured logs: one JSON object per line, with the session context bound (DESIGN §9).

A pipeline of small structlog processors. Context (``session_id``, ``turn``, ``step``,
``message_id``) lives in contextvars, which Trio copies into every task a task starts,
so a line logged deep in a tool call still says which session and step it belongs to.
Secrets never reach a line: keys that look like credentials are masked, and on the
rendered line every known secret's value and anything shaped like a credential
(harness/secrets.py). Log files are created 0600.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any, TextIO, cast

import structlog

from harness.private import open_private, private_dir
from harness.secrets import redact_log_text

_SECRET_WORDS = ("key", "token", "secret", "password", "authorization")


@functools.lru_cache(maxsize=1024)
def _is_secret(name: str) -> bool:
    # Names repeat from line to line, so each is judged once.
    lowered = name.lower()
    return any(word in lowered for word in _SECRET_WORDS) and not lowered.endswith("tokens")


def _mask_secrets(
    logger: Any, method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    for name in event:
        if _is_secret(name):
            event[name] = "***"
    return event


def _redact_line(logger: Any, method: str, line: Any) -> Any:
    # On the rendered line, so values nested anywhere and exception text are covered.
    return redact_log_text(line) if isinstance(line, str) else line


_stream: TextIO | None = None


class _LossyStream:
    """The log file as structlog writes to it, where a failed write drops the line.

    A log line that cannot be written (a full disk, a read-only filesystem, a closed
    pipe) must never take a session down: the line is counted as dropped, one warning
    goes to stderr the first time, and the work goes on.
    """

    def __init__(self, target: TextIO) -> None:
        self.target = target
        self.dropped = 0

    def write(self, text: str) -> int:
        try:
            return self.target.write(text)
        except (OSError, ValueError) as error:  # ValueError: the file was closed
            self._drop(error)
            return 0

    def flush(self) -> None:
        try:
            self.target.flush()
        except (OSError, ValueError) as error:
            self._drop(error)

    def _drop(self, error: Exception) -> None:
        self.dropped += 1
        if self.dropped == 1 and self.target is not sys.stderr:
            with contextlib.suppress(OSError, ValueError):
                print(
                    f"harness: log lines are being dropped: {error}",
                    file=sys.stderr,
                    flush=True,
                )

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.target.close()


_sink: _LossyStream | None = None
# How many times logging was configured: a ``Logger`` binds again after each.
_configurations = 0


class Logger:
    """A module's logger, ``structlog.get_logger(name)``, bound once per configuration.

    structlog's lazy proxy binds a new logger on every call (~2 µs, six Python calls,
    also for a line below the level); its ``cache_logger_on_first_use`` would keep a
    logger made before a later ``configure_logging`` (another file, another level). This
    one keeps its bound logger until logging is configured again. For the hot callers:
    a step logs three lines, one of them below the usual level.
    """

    __slots__ = ("_bound", "_configured_at", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._bound: Any = None
        self._configured_at = -1

    def __getattr__(self, method: str) -> Any:
        if self._configured_at != _configurations:
            self._configured_at = _configurations
            self._bound = structlog.get_logger(self._name).bind()
        return getattr(self._bound, method)


def get_logger(name: str) -> Logger:
    return Logger(name)


def dropped_lines() -> int:
    """How many log lines could not be written since logging was configured."""
    return _sink.dropped if _sink is not None else 0


class _ToStructlog(logging.Handler):
    """Standard-library records (libraries, ``warnings``) as lines of the same JSON stream.

    Without it, a library warning would reach stderr as plain text through logging's
    last-resort handler and break "one JSON object per line".
    """

    def emit(self, record: logging.LogRecord) -> None:
        try:
            extra: dict[str, Any] = {"logger": record.name}
            if record.exc_info:
                extra["exc_info"] = record.exc_info
            # A warning's text carries its source line after a newline: keep one line.
            message = " ".join(record.getMessage().split())
            structlog.get_logger(record.name).log(record.levelno, message, **extra)
        except Exception:
            self.handleError(record)


def _route_stdlib_logging(level: int) -> None:
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, _ToStructlog):
            root.removeHandler(handler)
    root.addHandler(_ToStructlog())
    root.setLevel(level)
    logging.captureWarnings(True)
    # httpx logs each request at INFO ("HTTP Request: POST … 200 OK"), ~40 µs a line on
    # every provider step, which already has its "step started" line (and its failure a
    # "provider error" one). Kept at debug; its warnings and errors always.
    httpx_level = logging.WARNING if level > logging.DEBUG else logging.NOTSET
    logging.getLogger("httpx").setLevel(httpx_level)


def configure_logging(
    *, level: str = "info", format: str = "json", file: Path | None = None
) -> None:
    """Send harness logs to ``file`` (appending) or stderr, as JSON lines or for people."""
    global _stream, _sink, _configurations
    if _stream is not None and _stream is not sys.stderr:
        with contextlib.suppress(OSError):
            _stream.close()
    if file is not None:
        if not file.parent.exists():
            private_dir(file.parent)
        _stream = cast(TextIO, open_private(file, "a", encoding="utf-8", buffering=1))
    else:
        _stream = sys.stderr
    _sink = _LossyStream(_stream)
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if format == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    numeric_level = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    _route_stdlib_logging(numeric_level)
    writer = structlog.WriteLogger(_sink)  # type: ignore[arg-type]
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _mask_secrets,
            structlog.processors.format_exc_info,
            renderer,
            _redact_line,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric_level),
        # One writer for every logger: structlog makes a logger per call (loggers are not
        # cached, so a configuration made later still applies), and a factory making a
        # new WriteLogger each time was a fifth of a line's cost.
        logger_factory=lambda *args: writer,
        cache_logger_on_first_use=False,
    )
    _configurations += 1
