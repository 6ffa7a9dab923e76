"""Fixtures shared by the test files.

- Every test runs without the caller's ``HARNESS_*`` variables (autouse), so neither an
  in-process harness nor a subprocess of the CLI picks up a developer's home, socket or
  log level; a subprocess's environment is then simply ``dict(os.environ)``.
- ``socket_dir``: a short directory for Unix sockets.
- ``scripted_harness``: open a harness whose model is a ``ScriptedProvider``.
- ``tool_parts``: the tool parts of a session, from the ledger.
- ``tool_context``: the ``ToolContext`` of a tool called directly, without a session.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

import pytest

from harness.config import Config
from harness.messages.model import ToolPart
from harness.providers.scripted import ScriptedProvider
from harness.runtime import Harness, open_harness
from harness.tools.base import ToolContext

Turns = list[dict[str, Any]]
ToolParts = Callable[[Harness, str], list[ToolPart]]
ToolContextFactory = Callable[..., ToolContext]


@pytest.fixture(autouse=True)
def _no_harness_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in os.environ if name.startswith("HARNESS_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A real project directory for a session: a couple of files to read."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "package.json").write_text('{\n  "name": "demo",\n  "packageManager": "pnpm@9"\n}\n')
    (root / "notes.txt").write_text("line one\nmarker-7f3a line two\n")
    return root


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A directory for sockets: pytest's tmp_path can be longer than a socket path may
    be (107 bytes), so this one is short, under /tmp."""
    path = Path(tempfile.mkdtemp(prefix="hs", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


class ScriptedHarness(Protocol):
    def __call__(
        self, turns: Turns, subtasks: dict[str, Turns] | None = None, **config: Any
    ) -> AbstractAsyncContextManager[tuple[Harness, ScriptedProvider]]: ...


@pytest.fixture
def scripted_harness(tmp_path: Path) -> ScriptedHarness:
    """``async with scripted_harness(turns) as (h, provider)``: a harness under
    ``tmp_path/home`` whose every model call is answered by one ``ScriptedProvider``
    playing ``turns`` (child sessions play ``subtasks``), recording the requests it gets.
    Nobody can be asked (``interactive=False``); ``config`` overrides any setting."""

    @asynccontextmanager
    async def open_scripted(
        turns: Turns, subtasks: dict[str, Turns] | None = None, **config: Any
    ) -> AsyncIterator[tuple[Harness, ScriptedProvider]]:
        provider = ScriptedProvider.from_turns(turns, subtasks=subtasks or {}, record=True)
        settings: dict[str, Any] = {
            "home": tmp_path / "home",
            "model": "scripted:test",
            "provider_factory": lambda model: provider,
            "interactive": False,
            "log_file": tmp_path / "home" / "logs" / "test.jsonl",
        }
        settings.update(config)
        async with open_harness(Config(**settings)) as h:
            yield h, provider

    return open_scripted


def _tool_parts(h: Harness, session_id: str) -> list[ToolPart]:
    return [p for m in h.ledger.messages(session_id) for p in m.parts if isinstance(p, ToolPart)]


@pytest.fixture
def tool_parts() -> ToolParts:
    """``tool_parts(h, session_id)``: the session's tool parts, in order, as stored."""
    return _tool_parts


@pytest.fixture
def tool_context(tmp_path: Path) -> ToolContextFactory:
    """``tool_context(directory, **fields)``: a tool's context without a session (ids
    ses_x/msg_x/cal_x, saved outputs under ``tmp_path/out``); ``fields`` override."""

    def make(directory: Path, **fields: Any) -> ToolContext:
        fields = {"output_dir": tmp_path / "out", **fields}
        return ToolContext(
            session_id="ses_x", message_id="msg_x", call_id="cal_x", directory=directory, **fields
        )

    return make


# --- PostgreSQL (DESIGN §14) ------------------------------------------------------------------

POSTGRES_ENV = "HARNESS_TEST_POSTGRES"
_POSTGRES_SKIPPED: list[str] = []
# Read at import, before the autouse fixture above removes every HARNESS_* variable.
_SAVED_POSTGRES = os.environ.get(POSTGRES_ENV, "")


def postgres_url() -> str:
    """The test database's URL, from $HARNESS_TEST_POSTGRES (.ci/run starts one).

    Without it the PostgreSQL-backed tests are skipped, and the run says so at its end;
    under CI=true they fail instead: CI always runs them.
    """
    url = os.environ.get(POSTGRES_ENV) or _SAVED_POSTGRES
    if url:
        return url
    reason = f"${POSTGRES_ENV} is not set: no PostgreSQL to test against (.ci/run starts one)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; under CI=true the PostgreSQL tests must run")
    pytest.skip(reason)


def with_schema(url: str, schema: str) -> str:
    """``url`` with its connections' search_path set to ``schema``: a test's own tables."""
    joiner = "&" if "?" in url else "?"
    return f"{url}{joiner}options=-csearch_path%3D{schema}"


@pytest.fixture
def postgres_schema() -> Iterator[str]:
    """A fresh, empty schema in the test database, dropped afterwards: the URL naming it."""
    import uuid

    import psycopg

    url = postgres_url()
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield with_schema(url, schema)
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # Counted from the reports, which reach the process that prints the summary whether
    # the tests ran in it or in pytest-xdist's workers.
    if report.skipped and POSTGRES_ENV in str(report.longrepr):
        _POSTGRES_SKIPPED.append(
            f"${POSTGRES_ENV} is not set: no PostgreSQL to test against (.ci/run starts one)"
        )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _POSTGRES_SKIPPED:
        terminalreporter.write_line(
            f"{len(_POSTGRES_SKIPPED)} PostgreSQL-backed tests skipped: {_POSTGRES_SKIPPED[0]}"
        )
