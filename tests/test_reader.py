"""harness.open_reader: a ledger read without starting anything, never changing it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import harness
from harness.config import Config
from harness.messages.model import Rule
from harness.providers.scripted import ScriptedProvider
from harness.runtime import open_harness


def _config(tmp_path: Path) -> Config:
    return Config(home=tmp_path / "home", model="scripted:unused", interactive=False)


def test_no_ledger_is_said_and_nothing_is_created(tmp_path: Path) -> None:
    config = _config(tmp_path)
    with pytest.raises(harness.NoLedgerError, match="no ledger at"):
        harness.open_reader(config)
    assert not config.home.exists()


async def test_the_reader_sees_what_the_harness_wrote_on_a_read_only_file(
    tmp_path: Path, project: Path
) -> None:
    provider = ScriptedProvider.from_turns(
        [
            {"tool_calls": [{"name": "write", "arguments": {"path": "new.txt", "content": "x\n"}}]},
            {"text": "done"},
        ]
    )
    config = _config(tmp_path)
    config.provider_factory = lambda model: provider
    config.rules = [Rule(permission="edit", pattern="*", action="allow")]
    async with open_harness(config) as h:
        session = await h.create_session(project)
        result = await h.run(session.id, "write it")
        assert result.reason == "answered"
    ledger = config.ledger_path
    before = (ledger.stat().st_mtime_ns, ledger.read_bytes())
    os.chmod(config.ledger_path, 0o400)  # a reader must work on a file it cannot write
    try:
        reader = harness.open_reader(config)
        try:
            assert [s.id for s in reader.sessions()] == [session.id]
            assert reader.session(session.id) is not None
            assert reader.session("ses_nope") is None
            roles = [m.info.role for m in reader.messages(session.id)]
            assert roles[0] == "user" and roles[-1] == "assistant"
            assert reader.todos(session.id) == []
            assert reader.trace(session.id)["session_id"] == session.id
            text, changed = reader.diff(session.id)
            assert "+x" in text and [f["path"] for f in changed] == ["new.txt"]
            with pytest.raises(LookupError):
                reader.trace("ses_nope")
        finally:
            reader.close()
    finally:
        os.chmod(config.ledger_path, 0o600)
    assert (ledger.stat().st_mtime_ns, ledger.read_bytes()) == before  # not even migrated
