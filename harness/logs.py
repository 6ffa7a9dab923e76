"""Structured logs: one JSON object per line, with the session context bound (DESIGN §9).

Context (``session_id``, ``turn``, ``step``, ``message_id``) lives in structlog's
contextvars, which Trio copies into every task a task starts, so a line logged deep in a
tool call still says which session and step it belongs to. Secrets never reach a line:
keys that look like credentials are masked, and on the rendered line every known secret's
value and anything shaped like a credential (harness/secrets.py). Log files are created
0600.

Every tool step logs two lines (issue 14), so the pipeline is one structlog processor
(``_json_line``) instead of a chain of seven: the context, level and time added in one
pass, then a line whose values are all plain (strings, numbers, booleans, null: nearly
every line) joined from kept texts (``_plain_line``), each string encoded and checked
for credential markers once. The line is ``json.dumps``'s, byte for byte; any other
line (a name to mask, an exception, a nested value) takes structlog's own processors
and ``JSONRenderer`` as before. ~4.5 µs a line instead of ~14.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import functools
import logging
import math
import sys
import threading
import time
import weakref
from collections.abc import MutableMapping
from datetime import UTC, datetime
from json.encoder import encode_basestring_ascii
from pathlib import Path
from typing import IO, Any, cast

import structlog
from structlog.contextvars import STRUCTLOG_KEY_PREFIX

from harness.private import open_private, private_dir
from harness.secrets import _SHAPES, redact, redact_log_text

# --- what a line carries ------------------------------------------------------------------

_SECRET_WORDS = ("key", "token", "secret", "password", "authorization")


@functools.lru_cache(maxsize=1024)
def _is_secret(name: str) -> bool:
    # Names repeat from line to line, so each is judged once.
    lowered = name.lower()
    return any(word in lowered for word in _SECRET_WORDS) and not lowered.endswith("tokens")


def _mask_secrets(event: MutableMapping[str, Any]) -> None:
    for name in event:
        if _is_secret(name):
            event[name] = "***"


# A context variable -> the key it binds (structlog's, "structlog_<key>"), None for
# another library's. Variables are few and made once, so each name is read once.
_context_keys: dict[contextvars.ContextVar[Any], str | None] = {}


def _context_key(var: contextvars.ContextVar[Any]) -> str | None:
    name = var.name
    key = name[len(STRUCTLOG_KEY_PREFIX) :] if name.startswith(STRUCTLOG_KEY_PREFIX) else None
    if len(_context_keys) >= 1024:
        _context_keys.clear()
    _context_keys[var] = key
    return key


def _merge_context(event: MutableMapping[str, Any]) -> None:
    # structlog's merge_contextvars, in the same order (the context's), the line's own
    # keys winning; what it does per variable is done here once per variable.
    for var, value in contextvars.copy_context().items():
        try:
            key = _context_keys[var]
        except KeyError:
            key = _context_key(var)
        if key is not None and value is not Ellipsis and key not in event:
            event[key] = value


# The start of the current second (ns) and its date and time, one tuple so that a thread
# never reads one second's text with another's start.
_second: tuple[int, str] = (0, "")


def _timestamp() -> str:
    """Now as structlog's ``TimeStamper(fmt="iso", utc=True)`` writes it.

    ``datetime.now(UTC).isoformat()`` is ~1 µs; the date and time change once a second,
    so only the microseconds are formatted per line. The clock and the rounding (down, to
    the microsecond) are ``datetime.now``'s.
    """
    global _second
    now = time.time_ns()
    start, text = _second
    if not 0 <= now - start < 1_000_000_000:
        start = now - now % 1_000_000_000
        iso = datetime.fromtimestamp(start // 1_000_000_000, UTC).isoformat()
        text = iso.removesuffix("+00:00")
        _second = (start, text)
    microseconds = (now - start) // 1000
    if not microseconds:
        return text + "Z"  # isoformat leaves out a fraction of zero
    # Six digits, zero-padded: cheaper than a format spec.
    return text + "." + str(1_000_000 + microseconds)[1:] + "Z"


_LEVELS = {"warn": "warning", "exception": "error"}  # structlog's add_log_level


def _complete(
    logger: Any, method: str, event: MutableMapping[str, Any], level: str, stamp: str
) -> Any:
    event["level"] = level
    event["timestamp"] = stamp
    _mask_secrets(event)
    if "exc_info" in event:
        return structlog.processors.format_exc_info(logger, method, event)
    return event


def _prepare(logger: Any, method: str, event: MutableMapping[str, Any]) -> Any:
    """What structlog's processors did before rendering, in their order: merge_contextvars,
    add_log_level, TimeStamper(iso, utc), the secret names masked, format_exc_info."""
    _merge_context(event)
    return _complete(logger, method, event, _LEVELS.get(method, method), _timestamp())


# --- rendering ----------------------------------------------------------------------------

# Each credential shape of harness/secrets.py needs its literal marker on the line; no
# marker can span two strings of a JSON line (none holds a quote, a colon or a comma).
_MARKERS = tuple(marker for marker, _ in _SHAPES)
# The JSON text of strings seen on lines, as json.dumps writes them (ensure_ascii), for
# those whose text holds no marker: names, events and ids repeat from line to line.
_texts: dict[str, str] = {}
# The names a line is made of here, each with the texts of its items seen with a string
# value: {name: {value: '"name": "value"'}}. Only strings are kept as values: a string
# equals nothing but a string (or a str subclass, which json writes as the string),
# where 1 == True == 1.0.
_items: dict[str, dict[str, str]] = {}
# Names whose lines take the whole chain: added by it (the level and the time replace a
# line's own where it stands, not at the end), or for format_exc_info. Names to mask too.
_CHAIN_NAMES = frozenset({"exc_info", "level", "timestamp"})
_KEPT_LENGTH = 128
_KEPT_COUNT = 1024


def _string_text(value: str) -> str | None:
    """A string's JSON text, kept; None when it holds a marker."""
    text = encode_basestring_ascii(value)
    for marker in _MARKERS:
        if marker in text:
            return None
    if len(value) <= _KEPT_LENGTH:
        if len(_texts) >= _KEPT_COUNT:  # ids made per step must not grow it forever
            _texts.clear()
        _texts[value] = text
    return text


def _item_text(name: Any, value: Any) -> str | None:
    """An item as json.dumps writes it in a dict, when its name is made here and its value
    is a string, an int, a finite float, a bool or None, with no marker; else None."""
    kept = _items.get(name)
    if kept is None:
        if type(name) is not str or name in _CHAIN_NAMES or _is_secret(name):
            return None
        if len(_items) >= _KEPT_COUNT:
            _items.clear()
        kept = _items[name] = {}
    key = _texts.get(name) or _string_text(name)
    if key is None:
        return None
    kind = type(value)
    if kind is str:
        text = _texts.get(value) or _string_text(value)
        if text is None:
            return None
        item = f"{key}: {text}"
        if len(value) <= _KEPT_LENGTH:
            if len(kept) >= _KEPT_COUNT:
                kept.clear()
            kept[value] = item
        return item
    if kind is int:
        return f"{key}: {int.__repr__(value)}"
    if value is None:
        return f"{key}: null"
    if kind is bool:
        return f"{key}: {'true' if value else 'false'}"
    if kind is float and math.isfinite(value):
        return f"{key}: {float.__repr__(value)}"
    return None


_NOTHING: dict[str, str] = {}
_LEVEL_TEXTS = {
    level: f'"level": "{level}"' for level in ("debug", "info", "warning", "error", "critical")
}


def _plain_line(event: MutableMapping[str, Any], level: str, stamp: str) -> str | None:
    """The line json.dumps would write for ``event`` with its level and time added, made
    from the kept texts of its items; None when an item is not made here.

    The texts are those of json's C encoder: ``encode_basestring_ascii``,
    ``int.__repr__``, ``float.__repr__``, separators ``", "`` and ``": "``.
    """
    level_text = _LEVEL_TEXTS.get(level)
    if level_text is None:
        return None
    items = _items
    parts = []
    try:
        for name, value in event.items():
            text = items.get(name, _NOTHING).get(value)
            if text is None and (text := _item_text(name, value)) is None:
                return None
            parts.append(text)
    except TypeError:  # an unhashable value: a list, a dict
        return None
    parts.append(level_text)
    parts.append(f'"timestamp": "{stamp}"')  # nothing in it to escape, and no marker
    return "{" + ", ".join(parts) + "}"


_json_renderer = structlog.processors.JSONRenderer()


def _json_line(logger: Any, method: str, event: MutableMapping[str, Any]) -> str:
    """The whole pipeline of a JSON line, as one processor: what the old chain wrote."""
    _merge_context(event)
    level = _LEVELS.get(method, method)
    stamp = _timestamp()
    line = _plain_line(event, level, stamp)
    if line is None:
        event = _complete(logger, method, event, level, stamp)
        return cast(str, _redact_line(logger, method, _json_renderer(logger, method, event)))
    # No credential marker on the line: only known secrets' values can be on it (redact
    # returns the very string when it replaced nothing).
    if redact(line) is line:
        return line
    return redact_log_text(line)


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
    processors: list[Any] = (
        [_json_line]
        if format == "json"
        else [_prepare, structlog.dev.ConsoleRenderer(colors=False), _redact_line]
    )
    numeric_level = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    _route_stdlib_logging(numeric_level)
    sink = _sink
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(numeric_level),
        # One writer for every logger: structlog makes a logger per call (loggers are not
        # cached, so a configuration made later still applies), and a factory making a
        # new WriteLogger each time was a fifth of a line's cost. The sink is the writer.
        logger_factory=lambda *args: sink,
        cache_logger_on_first_use=False,
    )
    for logger in list(_loggers):
        logger._forget()
