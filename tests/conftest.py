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
