"""The two session settings chat needs from the API: a compaction on request
(``Harness.compact``, ``POST /v1/sessions/{id}/compact``) and a change of model or agent
(``update_session``, ``PATCH /v1/sessions/{id}``)."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import ScriptedHarness

from harness import server
from harness.client import ApiError, Client
from harness.config import Config
from harness.history import SUMMARY_HEADER
from harness.messages.provider import UserTurn
from harness.runtime import COMPACT_REQUEST, HarnessError


async def test_a_compaction_on_request_summarizes_and_the_model_never_sees_the_request(
    scripted_harness: ScriptedHarness, project: Path
) -> None:
    turns = [
        {"text": "a long first answer " * 40},
        {"text": "## Goal\nthe summary", "usage": {"input": 10, "output": 5}},
        {"text": "answered from the summary"},
    ]
    async with scripted_harness(turns) as (h, provider):
        session = await h.create_session(project)
        await h.run(session.id, "first question")
        async with h.subscribe(session.id) as events:
            message_id = await h.compact(session.id)
            with trio.fail_after(10):
                async for event in events:
                    if event.type == "turn.finished":
                        break
        assert event.data["message_id"] == message_id
        assert event.data["reason"] == "answered"
        assert event.data["answer"].startswith("compacted: about ")
        # The compaction request was a text-only request; the next turn sees the summary.
        assert provider.requests[1].tools == ()
        result = await h.run(session.id, "what now?")
        assert result.answer == "answered from the summary"
        last = provider.requests[-1]
        texts = [m.text for m in last.messages if isinstance(m, UserTurn)]
        assert texts[0].startswith(SUMMARY_HEADER) and "the summary" in texts[0]
        assert not any(t == COMPACT_REQUEST or "a long first answer" in t for t in texts)
        assert texts[-1] == "what now?"
        messages = await h.messages(session.id)
        compact_user = [m for m in messages if m.info.id == message_id]
        assert compact_user and compact_user[0].info.compact is True  # type: ignore[union-attr]


async def test_update_session_changes_model_and_agent_and_checks_them(
    scripted_harness: ScriptedHarness, project: Path, tmp_path: Path
) -> None:
    async with scripted_harness([{"text": "ok"}]) as (h, _):
        session = await h.create_session(project)
        other = tmp_path / "other.json"
        other.write_text(json.dumps([{"text": "from the other script"}]))
        updated = await h.update_session(session.id, model=f"scripted:{other}", agent="plan")
        assert updated.agent == "plan" and updated.model == f"scripted:{other}"
        assert h.session(session.id).agent == "plan"
        with pytest.raises(Exception, match="nobody"):
            await h.update_session(session.id, agent="nobody")
        with pytest.raises(Exception, match="nowhere"):
            await h.update_session(session.id, model="nowhere/x")
        assert h.session(session.id).model == f"scripted:{other}"
        with pytest.raises(HarnessError):
            await h.compact("ses_missing")


async def test_the_daemon_patches_model_and_agent_and_queues_a_compaction(
    tmp_path: Path, project: Path, socket_dir: Path, nursery: trio.Nursery
) -> None:
    config = Config(home=tmp_path / "home", log_file=tmp_path / "daemon.jsonl")
    _, path = await nursery.start(server.serve, config, socket_dir / "d.sock")
    client = Client(path)

    async def call(name: str, *args: Any, **kwargs: Any) -> Any:
        return await trio.to_thread.run_sync(partial(getattr(client, name), *args, **kwargs))

    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"text": "hi"}, {"text": "## Goal\nsummary"}]))
    session = await call("create_session", directory=str(project), model=f"scripted:{script}")
    patched = await call("update_session", session["id"], agent="plan")
    assert patched["agent"] == "plan"
    with pytest.raises(ApiError) as bad:
        await call("update_session", session["id"], agent="nobody")
    assert bad.value.status == 422
    with pytest.raises(ApiError) as bad_model:
        await call("update_session", session["id"], model="nowhere/x")
    assert bad_model.value.status == 422
    await call("prompt", session["id"], "hello")
    stream = client.events(session["id"], after=0)
    message_id = await call("compact", session["id"])
    with trio.fail_after(10):
        while True:
            event = await trio.to_thread.run_sync(next, iter(stream))
            if event.type == "turn.finished" and event.data["message_id"] == message_id:
                break
    stream.close()
    assert event.data["answer"].startswith("compacted: about")
    with pytest.raises(ApiError) as missing:
        await call("compact", "ses_missing")
    assert missing.value.status == 404
