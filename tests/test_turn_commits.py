"""A one-step turn's transactions (issue 18, turn start): the prompt's, the claim's with
the session made busy in it, the step's, the end's; no commit of the busy status alone,
and on a shared ledger no empty transaction for the runner's first flush.

Counted at the backend's ``_commit`` (one call a transaction) around a real turn of a
scripted model, on SQLite and, when there is a test database, on PostgreSQL.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from harness.config import Config
from harness.runtime import Harness, open_harness

if TYPE_CHECKING:
    from conftest import ScriptedHarness


def _counted(h: Harness) -> list[list[list[str]]]:
    """Each transaction from now on, as the event types of each request in it."""
    commits: list[list[list[str]]] = []
    ledger: Any = h.ledger
    real = ledger._commit

    def commit(batch: Any) -> Any:
        commits.append([[event.type for event in request.events] for request in batch])
        return real(batch)

    ledger._commit = commit
    return commits


def _check(commits: list[list[list[str]]]) -> None:
    assert len(commits) == 4, commits
    prompt, claim, _step, end = commits
    assert prompt == [["inbox.added"]]
    # The turn's claim and the session's busy status, one commit, in this order.
    assert claim == [
        ["inbox.taken", "message.created", "part.created", "turn.started", "session.updated"]
    ]
    assert ["turn.finished"] in end
    assert all(any(request for request in commit) for commit in commits)  # none empty


async def test_a_one_step_turn_is_four_transactions(
    project: Path, scripted_harness: ScriptedHarness
) -> None:
    async with scripted_harness([{"text": "one"}, {"text": "two"}], sandbox="off") as (h, _):
        session = await h.create_session(project)
        await h.run(session.id, "warm")  # the harness's first turn opens what it keeps
        commits = _counted(h)
        result = await h.run(session.id, "go")
        assert result.answer == "two"
        _check(commits)
        busy = [s.status for s in [h.ledger.session(session.id)] if s is not None]
        assert busy == ["idle"]


async def test_a_one_step_turn_on_a_shared_ledger_makes_no_empty_transaction(
    postgres_schema: str, tmp_path: Path
) -> None:
    (tmp_path / "model.json").write_text(json.dumps([{"text": "one"}, {"text": "two"}]))
    config = Config(
        home=tmp_path / "home",
        model=f"scripted:{tmp_path / 'model.json'}",
        ledger=postgres_schema,
        interactive=False,
        sandbox="off",
    )
    async with open_harness(config) as h:
        session = await h.create_session(tmp_path)
        await h.run(session.id, "warm")
        await trio.sleep(0.2)  # the warm turn's release and late writes are in
        commits = _counted(h)
        result = await h.run(session.id, "go")
        assert result.answer == "two"
        _check(commits)
