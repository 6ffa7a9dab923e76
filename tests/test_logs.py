"""What the log pipeline writes, and what it leaves out to keep a step cheap (issue 14)."""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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


# --- where lines go, and what a line keeps (issue 14) ----------------------------------------

KEY = "mk-4f9a2c7e1b3d5a6c8e0f2a4b6c8d0e1f"


@pytest.fixture
def known_secret() -> Iterator[None]:
    secrets.refresh_secrets(environ={"MISTRAL_API_KEY": KEY})
    yield
    secrets.refresh_secrets(environ={})


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
