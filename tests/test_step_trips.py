"""A tool step's trips between actors, counted (issue 14, ninth pass).

Each message between two tasks is a scheduler round (an epoll wait and a batch of task
steps, ~12 µs): a step that need not make one should not. Counted with Trio
instruments, which see every task step and every I/O wait deterministically, where CPU
time on shared cores cannot.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from task_steps import TaskSteps

from harness.actors.admission import LoopLoad, TurnGate
from harness.config import Config
from harness.history import History
from harness.messages.events import NewEvent
from harness.messages.model import Rule, TextPart
from harness.providers.scripted import ScriptedProvider
from harness.runtime import open_harness
from harness.storage.ledger import Ledger


def _read(path: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "read", "arguments": {"path": path}}]}


async def _turn(
    home: Path, project: Path, turns: list[dict[str, Any]], **config: Any
) -> tuple[str, int, list[dict[str, Any]]]:
    """Run one turn; how it ended, the Permission actor's task steps during it, and the
    turn's ``permission.decided`` records."""
    provider = ScriptedProvider.from_turns(turns)
    cfg = Config(
        home=home,
        model=f"scripted:{home / 'unused.json'}",
        provider_factory=lambda model: provider,
        interactive=False,
        **config,
    )
    steps = TaskSteps("Permission.run")
    async with open_harness(cfg) as h:
        session = await h.create_session(project)
        await trio.testing.wait_all_tasks_blocked()
        trio.lowlevel.add_instrument(steps)
        try:
            with trio.fail_after(20):
                result = await h.run(session.id, "go")
        finally:
            trio.lowlevel.remove_instrument(steps)
        events = h.ledger.events_after(0, limit=100_000)
    decided = [e.data for e in events if e.type == "permission.decided"]
    return result.reason, steps.count, decided


async def test_a_need_the_rules_allow_or_deny_is_answered_without_the_permission_actor(
    tmp_path: Path, project: Path
) -> None:
    reads = [_read("notes.txt"), _read("package.json")] * 3
    reason, permission_steps, decided = await _turn(
        tmp_path / "home", project, [*reads, {"text": "read"}]
    )
    assert reason == "answered"
    assert permission_steps == 0  # before: a round trip through its task for each call
    # Recorded as the actor records a rule's decision: the rule that matched, each call.
    assert len(decided) == len(reads)
    allow = {"permission": "read", "pattern": "*", "action": "allow"}
    assert all(d["allowed"] and d["source"] == "rule" and d["rule"] == allow for d in decided)
    assert all(d["reply"] is None and d["request_id"] is None for d in decided)

    # A deny is the rules' too, and ends the turn as a denial did.
    deny = [Rule(permission="read", pattern="*notes.txt", action="deny")]
    reason, permission_steps, decided = await _turn(
        tmp_path / "home2", project, [_read("notes.txt"), {"text": "no"}], rules=deny
    )
    assert reason == "denied" and permission_steps == 0
    assert [(d["allowed"], d["source"], d["rule"]["action"]) for d in decided] == [
        (False, "rule", "deny")
    ]


async def test_a_need_that_asks_still_goes_to_the_permission_actor(
    tmp_path: Path, project: Path
) -> None:
    (project / ".env").write_text("TOKEN=x\n")  # the defaults ask before reading it
    reason, permission_steps, decided = await _turn(
        tmp_path / "home", project, [_read(".env"), {"text": "no"}]
    )
    assert reason == "denied"  # nobody to ask: rejected with the hint
    assert permission_steps >= 1
    assert [(d["allowed"], d["source"]) for d in decided] == [(False, "no-terminal")]
    # And --yes, which answers asks, is the actor's answer too.
    reason, permission_steps, decided = await _turn(
        tmp_path / "home2", project, [_read(".env"), {"text": "ok"}], yes=True
    )
    assert reason == "answered" and permission_steps >= 1
    assert [(d["allowed"], d["source"]) for d in decided] == [(True, "yes")]


async def test_a_read_step_makes_no_reply_channel_for_its_executor_or_its_gate(
    tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = 0
    new = trio.open_memory_channel.__new__

    def counted(cls: Any, size: float) -> Any:
        nonlocal made
        made += 1
        return new(cls, size)

    monkeypatch.setattr(trio.open_memory_channel, "__new__", counted)
    counts = []
    for steps in (2, 8):
        made = 0
        reads = [_read("notes.txt"), _read("package.json")] * (steps // 2)
        reason, _, _ = await _turn(tmp_path / f"home{steps}", project, [*reads, {"text": "ok"}])
        assert reason == "answered"
        counts.append(made)
    # Per step: the ledger flush's reply alone. Before: an ``ask`` channel for the
    # ToolExecutor and another for the Permission actor as well (3 a step).
    assert (counts[1] - counts[0]) / 6 <= 1


async def test_a_step_applies_its_own_commits_to_the_history_without_reading_them_back(
    tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = 0
    histories: list[History] = []
    changes, close = Ledger.changes, History.close

    def counted(self: Ledger, session_id: str, after_seq: int) -> Any:
        nonlocal reads
        reads += 1
        return changes(self, session_id, after_seq)

    def kept(self: History) -> None:
        histories.append(self)
        close(self)

    monkeypatch.setattr(Ledger, "changes", counted)
    monkeypatch.setattr(History, "close", kept)
    turns = [_read("notes.txt"), _read("package.json")] * 4
    provider = ScriptedProvider.from_turns([*turns, {"text": "read"}])
    home = tmp_path / "home"
    cfg = Config(
        home=home,
        model=f"scripted:{home / 'unused.json'}",
        provider_factory=lambda model: provider,
        interactive=False,
    )
    async with open_harness(cfg) as h:
        session = await h.create_session(project)
        result = await h.run(session.id, "go")
        assert result.reason == "answered"
        # The turn's first catch-up reads; every step after it applies the events its
        # writer committed. Before: a read of the changed rows at each of the 9 steps.
        assert reads <= 1
        [history] = histories
        fresh = History(h.ledger, session.id)
        fresh.sync()  # what a read of the whole session gives
        assert history.mark == fresh.mark
        assert history.chat() == fresh.chat() and history.estimate() == fresh.estimate()
        steps = [m for m in h.ledger.messages(session.id) if m.info.role == "assistant"]
        for message in steps:
            assert history.parts_of(message.info.id) == fresh.parts_of(message.info.id)
            assert history.parts_of(message.info.id) == message.parts

        # Another history of the session follows it the same way; once the writer cannot
        # vouch for what changed (a failed or refused commit: ``_lost_written``), it reads.
        follower = History(h.ledger, session.id)
        await follower.catch_up()
        before = reads
        text = next(p for m in steps for p in m.parts if isinstance(p, TextPart))
        for version, lost in (("edited once", False), ("edited twice", True)):
            if lost:
                h.ledger._lost_written(session.id)
            edited = text.model_copy(update={"text": version})
            await h.ledger.write([NewEvent.of("part.updated", session.id, edited)])
            await follower.catch_up()
            assert edited in follower.parts_of(text.message_id)
        assert reads == before + 1  # the second catch-up alone
        follower.close()


async def test_the_turn_gate_measures_the_loop_only_when_it_is_on() -> None:
    added: list[trio.abc.Instrument] = []
    real_add = trio.lowlevel.add_instrument

    def add(instrument: trio.abc.Instrument) -> None:
        added.append(instrument)
        real_add(instrument)

    trio.lowlevel.add_instrument = add  # type: ignore[assignment]
    try:
        for bound, measured in ((0.0, False), (30.0, True)):
            added.clear()
            gate = TurnGate(bound)
            async with trio.open_nursery() as nursery:
                await nursery.start(gate.run)
                # Off (the default), nothing measures the load: before, two hooks ran on
                # every round of the event loop for nobody.
                assert any(isinstance(i, LoopLoad) for i in added) == measured
                assert gate.room() > 0 and gate.accepting()
                admission = await gate.admit()  # at once either way, with no load
                admission.release()
                nursery.cancel_scope.cancel()
    finally:
        trio.lowlevel.add_instrument = real_add  # type: ignore[assignment]


# How a hostile model may spell a path the rules deny: each must stay denied now that
# the executor answers the rules' own decisions, with --yes on (it answers asks only).
_DENIED_SPELLINGS = [
    "notes.txt",
    "./notes.txt",
    "sub/../notes.txt",
    "sub/.//../notes.txt",
    "{project}/notes.txt",
    "{project}/sub/../notes.txt",
    "alias.txt",  # a symlink to notes.txt: the rule is on the file it names
]


@pytest.mark.parametrize("spelling", _DENIED_SPELLINGS)
async def test_a_path_the_rules_deny_stays_denied_in_the_executor_whatever_its_spelling(
    tmp_path: Path, project: Path, spelling: str
) -> None:
    (project / "sub").mkdir(exist_ok=True)
    alias = project / "alias.txt"
    if not alias.exists():
        alias.symlink_to(project / "notes.txt")
    deny = [Rule(permission="read", pattern="*/notes.txt", action="deny")]
    path = spelling.format(project=project)
    reason, permission_steps, decided = await _turn(
        tmp_path / "home", project, [_read(path), {"text": "no"}], rules=deny, yes=True
    )
    assert reason == "denied" and permission_steps == 0
    assert [(d["allowed"], d["source"]) for d in decided] == [(False, "rule")]
