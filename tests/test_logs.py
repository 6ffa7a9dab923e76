"""What the log pipeline writes, and what it leaves out to keep a step cheap (issue 14)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import structlog

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
