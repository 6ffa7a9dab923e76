"""What the log pipeline writes, and what it leaves out to keep a step cheap (issue 14)."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from enum import IntEnum, StrEnum
from pathlib import Path
from typing import Any, cast

import pytest
import structlog

from harness import logs, secrets
from harness.logs import configure_logging, get_logger


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_httpx_request_lines_only_at_debug(tmp_path: Path) -> None:
    # httpx logs every request it sends at INFO; a provider step already says so in
    # "step started". Its warnings are kept at any level, its request lines at debug.
    httpx_log = logging.getLogger("httpx")
    info_file = tmp_path / "info.jsonl"
    configure_logging(level="info", file=info_file)
    httpx_log.info('HTTP Request: %s %s "%s %d %s"', "POST", "http://h/v1", "HTTP/1.1", 200, "OK")
    httpx_log.warning("something odd")
    structlog.get_logger("harness.runner").info("step started", messages=3)
    events = [line["event"] for line in _lines(info_file)]
    assert events == ["something odd", "step started"]

    debug_file = tmp_path / "debug.jsonl"
    configure_logging(level="debug", file=debug_file)
    httpx_log.info('HTTP Request: %s %s "%s %d %s"', "POST", "http://h/v1", "HTTP/1.1", 200, "OK")
    (line,) = _lines(debug_file)
    assert line["event"] == 'HTTP Request: POST http://h/v1 "HTTP/1.1 200 OK"'
    assert line["logger"] == "httpx" and line["level"] == "info"


def test_a_logger_made_before_a_configuration_writes_where_it_says(tmp_path: Path) -> None:
    # Loggers share one writer per configuration: a module's logger, made at import, must
    # still follow each later configure_logging (a daemon, a test, a new log file).
    log = structlog.get_logger("harness.test")
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    configure_logging(level="info", file=first)
    log.info("one", n=1)
    log.debug("not at info")
    configure_logging(level="debug", file=second)
    log.info("two", n=2)
    log.debug("at debug")
    assert [(x["event"], x["level"]) for x in _lines(first)] == [("one", "info")]
    assert [x["event"] for x in _lines(second)] == ["two", "at debug"]
    assert all("timestamp" in x for x in _lines(first) + _lines(second))


def test_a_harness_logger_binds_once_per_configuration(tmp_path: Path) -> None:
    # get_logger's logger keeps what it bound until logging is configured again (structlog's
    # proxy binds anew on every call); its lines are the proxy's, context and all.
    log = get_logger("harness.test")
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    configure_logging(level="info", file=first)
    with structlog.contextvars.bound_contextvars(step=3, message_id="msg_x"):
        log.info("one", n=1)
        structlog.get_logger("harness.test").info("one", n=1)
    bound = log._bound
    log.debug("not at info")
    assert log._bound is bound
    configure_logging(level="debug", file=second)
    log.info("two", n=2)
    log.debug("at debug")
    assert log._bound is not bound
    mine, theirs = _lines(first)
    assert mine.pop("timestamp") and theirs.pop("timestamp")
    assert list(mine.items()) == list(theirs.items())
    assert mine == {"n": 1, "event": "one", "step": 3, "message_id": "msg_x", "level": "info"}
    shown = [(x["event"], x["level"]) for x in _lines(second)]
    assert shown == [("two", "info"), ("at debug", "debug")]


# --- the line, byte for byte (issue 14's one-processor pipeline) ----------------------------

STAMP = "2026-12-06T00:24:27.618716Z"
KEY = "mk-4f9a2c7e1b3d5a6c8e0f2a4b6c8d0e1f"


def _fixed_stamp(logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
    event["timestamp"] = STAMP
    return event


def _mask(logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
    for name in event:
        if logs._is_secret(name):
            event[name] = "***"
    return event


# The chain harness ran before issue 14, with a fixed time: what a line must still be.
_BEFORE: list[Any] = [
    structlog.contextvars.merge_contextvars,
    structlog.processors.add_log_level,
    _fixed_stamp,
    _mask,
    structlog.processors.format_exc_info,
    structlog.processors.JSONRenderer(),
    lambda logger, method, line: secrets.redact_log_text(line),
]


def _before(method: str, event: dict[str, Any]) -> str:
    for processor in _BEFORE:
        event = processor(None, method, event)
    return cast(str, event)


class Tool(StrEnum):
    READ = "read"


class Count(IntEnum):
    ONE = 1


class Odd:
    def __repr__(self) -> str:
        return "<odd ☃>"


def _error() -> ValueError:
    try:
        raise ValueError("bad ünïcode")
    except ValueError as error:
        return error


# Each is logged as ``value=...``; the plain ones take the fast path, the others the old
# renderer: the line must be the same either way.
VALUES: list[Any] = [
    "read",
    "",
    "ünïcode ☃ and 𝄞 (a surrogate pair)",
    'a "quote", a \\ backslash, a tab\t, a newline\n, a nul \x00, a del \x7f',
    "a lone surrogate \ud800",
    "/usr/lib/python3",
    0,
    -3,
    10**30,
    True,
    False,
    None,
    1.5,
    -0.0,
    1e-05,
    1e16,
    123456789.123456789,
    float("nan"),
    float("inf"),
    -float("inf"),
    Tool.READ,
    Count.ONE,
    ["a", 1, None],
    ("a", 2),
    {"nested": {"deeper": [1, "ü"]}, "api_key": "not masked when nested"},
    Path("/tmp/x y"),
    datetime(2026, 12, 6, 0, 24, 27, 618716, tzinfo=UTC),
    _error(),
    Odd(),
    b"bytes",
    # Credential markers: the shapes, and strings that only look like them.
    "high and through",  # "gh"
    "sk-" + "A1b2C3d4" * 4,
    "ghp_" + "Z" * 36,
    "Authorization: Bearer abcdefghijklmnopqrstuvwxyz012345",
    # ensure_ascii writes "¾" as \u00be: the line then reads "...bearer <token>".
    "\u00bearer abcdefghijklmnopqrstuvwxyz012345",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    # A known secret, alone, inside a sentence, and nested.
    KEY,
    f"the key is {KEY}.",
    {"deep": [KEY]},
]


@pytest.fixture
def fixed_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs, "_timestamp", lambda: STAMP)


@pytest.fixture
def known_secret() -> Iterator[None]:
    secrets.refresh_secrets(environ={"MISTRAL_API_KEY": KEY})
    yield
    secrets.refresh_secrets(environ={})


@pytest.mark.parametrize("value", VALUES, ids=lambda value: type(value).__name__)
def test_a_line_is_the_old_chains_byte_for_byte(
    value: Any, fixed_time: None, known_secret: None
) -> None:
    with structlog.contextvars.bound_contextvars(session_id="ses_1", step=3, value=0):
        for method in ("info", "warning", "warn", "error", "exception", "debug"):
            # Twice: the second line is made from kept texts.
            for _ in range(2):
                event = {"call_id": "cal_0123456789", "value": value, "event": "tool completed"}
                line = logs._json_line(None, method, dict(event))
                assert line == _before(method, dict(event)), (method, value)


@pytest.mark.parametrize(
    "event",
    [
        # A name to mask, at the top (nested ones are values, and only redacted).
        {"event": "e", "api_key": "sk-not-shaped", "Authorization": "x", "input_tokens": 5},
        # The line's own level and time are replaced where they stand.
        {"event": "e", "level": "mine", "timestamp": "mine", "n": 1},
        # The line's own names win over the context's.
        {"event": "e", "step": "mine", "session_id": None},
        {"event": "e", "exc_info": True},
        {"event": "e", "exc_info": _error()},
        {"event": "e", "stack_info": False},
        {"message": "no event at all"},
        {"event": "e", "ключ": "значение", 'key with "quote"': 1},
    ],
    ids=lambda event: "-".join(str(name) for name in event),
)
def test_names_the_fast_path_leaves_to_the_old_chain(
    event: dict[str, Any], fixed_time: None, known_secret: None
) -> None:
    with structlog.contextvars.bound_contextvars(session_id="ses_1", step=3):
        for _ in range(2):
            assert logs._json_line(None, "info", dict(event)) == _before("info", dict(event))


def test_a_usual_line_takes_the_fast_path(fixed_time: None) -> None:
    event: dict[str, Any] = {"call_id": "cal_1", "tool": "read", "event": "tool completed"}
    with structlog.contextvars.bound_contextvars(session_id="ses_1", step=3, parent_span_id=None):
        logs._merge_context(event)
    line = logs._plain_line(event, "info", STAMP)
    assert line == json.dumps({**event, "level": "info", "timestamp": STAMP})
    # Not for what it cannot write as json.dumps would, or must leave to the old chain.
    for name, value in [("n", float("nan")), ("p", Path("/")), ("api_key", "x"), ("d", {})]:
        assert logs._plain_line({**event, name: value}, "info", STAMP) is None, name
    assert logs._plain_line(event, "notset", STAMP) is None


def test_every_credential_shape_needs_its_marker() -> None:
    # A line with no marker is left alone by the shapes (logs._MARKERS): true while each
    # shape's pattern holds its marker literally, outside any alternative.
    for marker, shape in secrets._SHAPES:
        assert marker in shape.pattern.split("(?:")[0], shape.pattern
        assert not {'"', ":", ",", "{", "}"} & set(marker)


def test_a_known_secret_found_later_is_redacted_from_kept_texts(fixed_time: None) -> None:
    # Kept texts are checked for shapes, never for known secrets: those are looked for on
    # every line, so a secret known only after a value was first logged is still caught.
    secrets.refresh_secrets(environ={})
    event = {"event": "said", "text": KEY}
    assert KEY in logs._json_line(None, "info", dict(event))
    try:
        secrets.refresh_secrets(environ={"MISTRAL_API_KEY": KEY})
        line = logs._json_line(None, "info", dict(event))
    finally:
        secrets.refresh_secrets(environ={})
    assert KEY not in line and "[REDACTED:MISTRAL_API_KEY]" in line
    assert line == _before("info", dict(event)).replace(KEY, "[REDACTED:MISTRAL_API_KEY]")


def test_kept_texts_stay_bounded(fixed_time: None) -> None:
    # Ids are new every step: what is kept is cleared now and then, never grown forever.
    for n in range(3 * logs._KEPT_COUNT):
        event = {"event": "tool completed", "call_id": f"call{n:08d}", "step": n}
        assert logs._json_line(None, "info", dict(event)) == _before("info", dict(event))
    assert len(logs._texts) <= logs._KEPT_COUNT
    assert all(len(kept) <= logs._KEPT_COUNT for kept in logs._items.values())


def _iso(nanoseconds: int) -> str:
    # What TimeStamper(fmt="iso", utc=True) writes at that instant: datetime.now's
    # microsecond (rounded down), isoformat, "+00:00" as "Z".
    instant = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=nanoseconds // 1000)
    return instant.isoformat().replace("+00:00", "Z")


def test_the_timestamp_is_timestampers_across_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    second = 1_796_517_867 * 1_000_000_000  # 2026-12-06T00:44:27Z
    instants = [
        second - 1,  # .999999, the last microsecond of the second before
        second,  # .000000: isoformat leaves the fraction out
        second + 999,  # still .000000
        second + 1_000,  # .000001
        second + 618_716_999,
        second + 999_999_999,
        second + 1_000_000_000 + 500_000,  # the next second
        second - 86_400 * 1_000_000_000,  # a day back: the date is made again
        second,
    ]
    for instant in instants:
        monkeypatch.setattr(time, "time_ns", lambda instant=instant: instant)
        assert logs._timestamp() == _iso(instant), instant
    assert _iso(second) == "2026-12-06T00:44:27Z"
    assert _iso(second - 1) == "2026-12-06T00:44:26.999999Z"


def test_the_timestamp_is_now(tmp_path: Path) -> None:
    log_file = tmp_path / "now.jsonl"
    configure_logging(file=log_file)
    before = datetime.now(UTC)
    structlog.get_logger("t").info("now")
    after = datetime.now(UTC)
    (line,) = _lines(log_file)
    stamp = line["timestamp"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?Z", stamp), stamp
    assert before <= datetime.fromisoformat(stamp) <= after


def test_lines_from_a_file_end_to_end(tmp_path: Path) -> None:
    # Through configure_logging and structlog: context, non-ASCII, an exception, masking,
    # one JSON object a line.
    log_file = tmp_path / "e2e.jsonl"
    configure_logging(file=log_file)
    log = get_logger("harness.test")
    with structlog.contextvars.bound_contextvars(session_id="ses_e2e", step=7):
        log.info("tool completed", call_id="cal_1", tool="read", text="héllo\nworld")
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            log.exception("tool failed", password="hunter22")
        log.warning("odd", path=Path("/x"), data={"a": [1, 2]})
    first, failed, odd = _lines(log_file)
    # The call's names, the event, the context's (in the context's order), level, time.
    assert list(first)[:4] == ["call_id", "tool", "text", "event"]
    assert sorted(list(first)[4:6]) == ["session_id", "step"]
    assert list(first)[6:] == ["level", "timestamp"]
    assert first["text"] == "héllo\nworld" and first["step"] == 7
    assert failed["level"] == "error" and failed["password"] == "***"
    assert "RuntimeError: boom" in failed["exception"] and "exc_info" not in failed
    assert odd["level"] == "warning" and odd["path"] == "PosixPath('/x')"
    assert odd["data"] == {"a": [1, 2]}
    raw = log_file.read_text()
    assert raw.isascii() and raw.count("\n") == 3


def test_a_stdlib_exception_is_one_json_line(tmp_path: Path) -> None:
    log_file = tmp_path / "stdlib.jsonl"
    configure_logging(file=log_file)
    try:
        dict[str, int]()["missing"]
    except KeyError:
        logging.getLogger("some.library").exception("lookup failed")
    (line,) = _lines(log_file)
    assert line["logger"] == "some.library" and line["level"] == "error"
    assert "KeyError: 'missing'" in line["exception"]


def test_console_lines_are_masked_and_redacted(tmp_path: Path, known_secret: None) -> None:
    log_file = tmp_path / "console.log"
    configure_logging(format="console", file=log_file)
    with structlog.contextvars.bound_contextvars(session_id="ses_console"):
        get_logger("harness.test").info("said", api_key="abc", text=f"key {KEY}")
    text = log_file.read_text()
    assert "said" in text and "session_id=ses_console" in text and "[info" in text
    assert "abc" not in text and KEY not in text and "[REDACTED:MISTRAL_API_KEY]" in text


def test_a_line_that_cannot_be_written_is_dropped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log_file = tmp_path / "dropped.jsonl"
    configure_logging(file=log_file)
    log = get_logger("harness.test")
    log.info("kept")
    assert logs._sink is not None
    logs._sink.target.close()  # as a full disk or a vanished file would fail a write
    log.info("lost")
    log.info("lost too")
    assert logs.dropped_lines() == 2
    assert capsys.readouterr().err.count("log lines are being dropped") == 1
    assert [line["event"] for line in _lines(log_file)] == ["kept"]


def test_lines_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging()
    get_logger("harness.test").info("to stderr", n=1)
    (line,) = capsys.readouterr().err.splitlines()
    assert json.loads(line)["event"] == "to stderr"


def test_a_debug_line_below_the_level_is_a_no_op(tmp_path: Path) -> None:
    log_file = tmp_path / "quiet.jsonl"
    configure_logging(level="info", file=log_file)
    log = get_logger("harness.test")
    log.debug("quiet", n=1)
    # The level's methods are the logger's own attributes now: one lookup, then a call.
    assert "debug" in vars(log)
    assert log_file.read_text() == ""


def test_lines_from_threads_stay_whole(tmp_path: Path) -> None:
    log_file = tmp_path / "threads.jsonl"
    configure_logging(file=log_file)
    log = get_logger("harness.test")
    text = "x" * 5000

    def write(n: int) -> None:
        for i in range(200):
            log.info("threaded", n=n, i=i, text=text)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = _lines(log_file)
    assert len(lines) == 800 and all(line["text"] == text for line in lines)
