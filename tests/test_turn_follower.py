"""TurnFollower: the one follower of a turn, for the daemon's stream and the embedded feed.

The command-level behaviour is covered end to end (test_cli, test_yes, test_todo_question,
test_daemon_answers); these pin the decisions themselves, with a recording ``Replies``.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import trio

from harness.client import WireEvent
from harness.commands.base import EXIT_LIMIT, EXIT_OK
from harness.commands.display import Display
from harness.commands.follow import HarnessReplies, TurnFollower
from harness.config import Config
from harness.providers.scripted import ScriptedProvider
from harness.runtime import open_harness

SID = "ses_1"


def wire(kind: str, data: dict[str, Any], session_id: str = SID) -> WireEvent:
    body = {"seq": 1, "ts": 0.0, "type": kind, "session_id": session_id, "data": data}
    return WireEvent(1, 0.0, kind, session_id, data, json.dumps(body))


ASK = {"id": "per_1", "call_id": "call_1", "tool": "bash", "permission": "bash"}
ASK |= {"pattern": "ls", "always": "ls *"}
QUESTION = {"id": "que_1", "call_id": "call_2", "questions": [{"question": "which?"}]}


class Recorded:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def reply_permission(
        self, request_id: str, reply: str, message: str | None, *, no_terminal: bool
    ) -> None:
        self.calls.append(("permission", request_id, reply, message, no_terminal))

    def answer_question(self, request_id: str, answers: list[list[str]]) -> None:
        self.calls.append(("answer", request_id, answers))

    def reject_question(self, request_id: str, message: str | None = None) -> None:
        self.calls.append(("reject", request_id, message))


def follower(replies: Recorded, **options: Any) -> TurnFollower:
    return TurnFollower(Display(SID, json_mode=False), replies, "msg_1", **options)


def test_unattended_rejects_each_ask_once_and_prints_its_line_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    replies = Recorded()
    follow = follower(replies, interactive=False, unattended=True)
    for event in (wire("permission.asked", ASK), wire("permission.asked", ASK)):  # a replay
        if follow.needs_answer(event):
            follow.answer(event)
    assert replies.calls == [("permission", "per_1", "reject", None, True)]
    failed = {"call_id": "call_1", "type": "tool", "tool": "bash"}
    failed["state"] = {"status": "error", "error": "rejected"}
    assert follow.see(wire("part.updated", failed)) is None
    err = capsys.readouterr().err
    assert err.count("✗ bash") == 1 and "the call was rejected" in err


def test_yes_answers_once_and_a_question_without_terminal_is_rejected() -> None:
    replies = Recorded()
    follow = follower(replies, interactive=False, yes=True, unattended=True)
    for event in (wire("permission.asked", ASK), wire("question.asked", QUESTION)):
        assert follow.needs_answer(event)
        follow.answer(event)
    assert replies.calls[0] == ("permission", "per_1", "once", None, False)
    assert replies.calls[1][:2] == ("reject", "que_1") and replies.calls[1][2]


def test_embedded_and_not_interactive_leaves_asks_to_the_harness() -> None:
    follow = follower(Recorded(), interactive=False)
    assert not follow.needs_answer(wire("permission.asked", ASK))
    assert not follow.needs_answer(wire("question.asked", QUESTION))


def test_interactive_reads_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("a\nred\n"))
    replies = Recorded()
    follow = follower(replies, interactive=True)
    for event in (wire("permission.asked", ASK), wire("question.asked", QUESTION)):
        assert follow.needs_answer(event)
        follow.answer(event)
    assert replies.calls == [
        ("permission", "per_1", "always", None, False),
        ("answer", "que_1", [["red"]]),
    ]


def test_only_this_turns_end_ends_it(capsys: pytest.CaptureFixture[str]) -> None:
    follow = follower(Recorded(), interactive=False)
    other = {"message_id": "msg_0", "reason": "answered", "answer": "old"}
    assert follow.see(wire("turn.finished", other)) is None
    mine = {"message_id": "msg_1", "reason": "max_steps", "answer": "partial"}
    assert follow.see(wire("turn.finished", mine)) == EXIT_LIMIT
    out = capsys.readouterr()
    assert out.out == "partial\n" and "stopped (max_steps)" in out.err


async def test_the_feed_answers_in_a_thread_while_events_keep_coming(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("o\n"))
    replies = Recorded()
    follow = follower(replies, interactive=True)
    send, receive = trio.open_memory_channel[WireEvent](10)
    async with trio.open_nursery() as nursery:
        await send.send(wire("permission.asked", ASK))

        async def finish_after_the_answer() -> None:
            while not replies.calls:
                await trio.sleep(0.01)
            await send.send(wire("turn.finished", {"message_id": "msg_1", "reason": "answered"}))

        nursery.start_soon(finish_after_the_answer)
        code = await follow.follow_feed(receive, nursery)  # type: ignore[arg-type]
    assert code == EXIT_OK
    assert replies.calls == [("permission", "per_1", "once", None, False)]


async def test_an_embedded_turn_is_answered_at_the_terminal_through_the_harness(
    tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The reply goes from the follower's thread into the harness's Trio run: the edit runs.
    typed = io.StringIO("o\n")
    monkeypatch.setattr("sys.stdin", typed)
    edit = {"path": "notes.txt", "old_string": "line one", "new_string": "line 1"}
    provider = ScriptedProvider.from_turns(
        [{"tool_calls": [{"name": "edit", "arguments": edit}]}, {"text": "edited"}]
    )
    config = Config(
        home=tmp_path / "home",
        model="scripted:unused",
        provider_factory=lambda model: provider,
        interactive=True,
    )
    async with open_harness(config) as h:
        session = await h.create_session(project)
        async with h.subscribe(session.id) as events, trio.open_nursery() as nursery:
            message_id = await h.prompt(session.id, "edit it")
            view = Display(session.id, json_mode=False)
            follow = TurnFollower(view, HarnessReplies(h), message_id, interactive=True)
            code = await follow.follow_feed(events, nursery)
            nursery.cancel_scope.cancel()
    assert code == EXIT_OK
    assert typed.read() == ""  # the ask was put to the terminal, and answered "once"
    assert (project / "notes.txt").read_text().startswith("line 1\n")


async def test_the_feed_reads_queued_events_in_one_round(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A step publishes a dozen events or more: those already queued cost no trip through
    # the scheduler each (issue 14); a feed that ends still says so.
    from test_scheduler_trips import scheduled_rounds

    follow = follower(Recorded(), interactive=False)
    send, receive = trio.open_memory_channel[WireEvent](1000)
    for index in range(300):
        send.send_nowait(wire("session.updated", {"title": f"t{index}"}))
    send.send_nowait(wire("turn.finished", {"message_id": "msg_1", "reason": "answered"}))
    async with trio.open_nursery() as nursery:
        with scheduled_rounds() as rounds:
            code = await follow.follow_feed(receive, nursery)  # type: ignore[arg-type]
    assert code == EXIT_OK and rounds.count <= 2  # before: 301
    send.send_nowait(wire("session.updated", {"title": "late"}))
    send.close()
    async with trio.open_nursery() as nursery:
        assert await follow.follow_feed(receive, nursery) != EXIT_OK  # type: ignore[arg-type]
    assert "event stream ended" in capsys.readouterr().err
