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
import errno
import functools
import logging
import sys
import threading
import weakref
from collections.abc import MutableMapping
from pathlib import Path
from typing import IO, Any

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


# --- where lines go -----------------------------------------------------------------------


class _LossySink:
    """Where structlog writes a rendered line, where a failed write drops the line.

    A log line that cannot be written (a full disk, a read-only filesystem, a closed
    pipe) must never take a session down: the line is counted as dropped, one warning
    goes to stderr the first time, and the work goes on. The sink is structlog's wrapped
    logger itself (it has ``WriteLogger``'s methods), so a line goes straight to it.
    """

    def __init__(self, target: IO[Any]) -> None:
        self.target = target
        self.dropped = 0

    def write_line(self, line: str) -> None:
        raise NotImplementedError

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


class _LossyFile(_LossySink):
    """A log file, unbuffered and opened to append: a line is one ``write(2)``, which the
    kernel keeps whole among other threads' and processes' lines (no lock, no text and
    buffer layers: ~0.5 µs of the 1 µs a line-buffered text file took)."""

    def write_line(self, line: str) -> None:
        data = (line + "\n").encode("utf-8", "backslashreplace")
        try:
            written = self.target.write(data)
            if written != len(data):  # a signal, a disk filling up: the rest, or an error
                self._write_rest(data[written:])
        except (OSError, ValueError) as error:  # ValueError: the file was closed
            self._drop(error)

    def _write_rest(self, data: bytes) -> None:
        while data:
            written = self.target.write(data)
            if not written:
                raise OSError(errno.EIO, "the log file takes no more bytes")
            data = data[written:]

    # The methods structlog calls on the logger it wraps: WriteLogger's.
    log = debug = info = warn = warning = msg = write_line
    fatal = failure = err = error = critical = exception = write_line


class _LossyStream(_LossySink):
    """A text stream (stderr), whose buffer others write to as well."""

    def __init__(self, target: IO[Any]) -> None:
        super().__init__(target)
        self._lock = threading.Lock()  # a line from a worker thread stays whole
        # A line-buffered stream (stderr) has flushed at the newline already.
        self._flush = not getattr(target, "line_buffering", False)

    def write_line(self, line: str) -> None:
        with self._lock:
            try:
                self.target.write(line + "\n")
                if self._flush:
                    self.target.flush()
            except (OSError, ValueError) as error:
                self._drop(error)

    log = debug = info = warn = warning = msg = write_line
    fatal = failure = err = error = critical = exception = write_line


_sink: _LossySink | None = None
# The loggers get_logger made, forgetting their methods at each configuration.
_loggers: weakref.WeakSet[Logger] = weakref.WeakSet()


class Logger:
    """A module's logger, ``structlog.get_logger(name)``, bound once per configuration.

    structlog's lazy proxy binds a new logger on every call (~2 µs, six Python calls,
    also for a line below the level); its ``cache_logger_on_first_use`` would keep a
    logger made before a later ``configure_logging`` (another file, another level). This
    one keeps the bound logger's methods as its own attributes (``log.info`` is one
    lookup) until logging is configured again. For the hot callers: a step logs three
    lines, one of them below the usual level.
    """

    __slots__ = ("__dict__", "__weakref__", "_bound", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._bound: Any = None
        _loggers.add(self)

    def __getattr__(self, method: str) -> Any:
        if self._bound is None:
            self._bound = structlog.get_logger(self._name).bind()
        found = getattr(self._bound, method)
        self.__dict__[method] = found
        return found

    def _forget(self) -> None:
        self._bound = None
        self.__dict__.clear()


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
    global _sink
    if isinstance(_sink, _LossyFile):
        _sink.close()
    if file is not None:
        if not file.parent.exists():
            private_dir(file.parent)
        _sink = _LossyFile(open_private(file, "ab", buffering=0))
    else:
        _sink = _LossyStream(sys.stderr)
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if format == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    numeric_level = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    _route_stdlib_logging(numeric_level)
    sink = _sink
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
        # new WriteLogger each time was a fifth of a line's cost. The sink is the writer.
        logger_factory=lambda *args: sink,
        cache_logger_on_first_use=False,
    )
    for logger in list(_loggers):
        logger._forget()
