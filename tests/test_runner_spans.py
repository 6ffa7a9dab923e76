"""The runner's log spans: each model reply's lines carry that message, and no line after it.

A step's and a compaction's fields (``step``, ``message_id``, ``span_id``) are scoped to
the message they belong to, so a line logged later in the turn never claims a message
that already ended.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness import Config, open_harness
from harness.context.compaction import SECTIONS
from harness.messages.model import AssistantMessage
from harness.providers.scripted import ScriptedProvider

SUMMARY = "\n".join(f"## {section}\nnotes about {section.lower()}" for section in SECTIONS)


def read(path: str, **extra: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": "read", "arguments": {"path": path}}], **extra}


async def test_each_reply_logs_under_its_own_message_and_nothing_after_it(
    tmp_path: Path, project: Path
) -> None:
    (project / "a.txt").write_text("alpha\n" * 20)
    (project / "b.txt").write_text("beta\n" * 20)
    turns = [
        read("a.txt", usage={"input": 1_000, "output": 10}),
        read("b.txt", usage={"input": 19_500, "output": 10}),  # nearly fills 20k
        {"text": SUMMARY, "usage": {"input": 19_600, "output": 200}},
        {"text": "finished after the summary", "usage": {"input": 900, "output": 10}},
    ]
    provider = ScriptedProvider.from_turns(turns, record=True)
    log_file = tmp_path / "harness.jsonl"
    config = Config(
        home=tmp_path / "home",
        model="scripted:spans",
        provider_factory=lambda model: provider,
        interactive=False,
        log_file=log_file,
        model_limits={"scripted": (20_000, 1_000)},
        compaction_keep_tokens=300,
    )
    async with open_harness(config) as h:
        session = await h.create_session(project)
        result = await h.run(session.id, "read both files")
        messages = [m.info for m in h.ledger.messages(session.id)]
    assert result.reason == "answered"
    lines = [json.loads(line) for line in log_file.read_text().splitlines()]
    mode_of = {m.id: m.mode for m in messages if isinstance(m, AssistantMessage)}
    step_of = {m.id: m.step for m in messages if isinstance(m, AssistantMessage)}

    def logged(event: str) -> list[dict[str, Any]]:
        return [line for line in lines if line["event"] == event]

    started = logged("step started")
    assert [mode_of[line["message_id"]] for line in started] == ["step"] * 3
    for line in logged("compacting") + logged("compacted"):
        assert mode_of[line["message_id"]] == "compaction"
        assert line["span_id"] == line["message_id"]
        assert line["parent_span_id"] == session.id
        assert line["step"] == step_of[line["message_id"]]
    [finished] = logged("turn finished")
    assert "step" not in finished and "message_id" not in finished
    assert finished["span_id"] == session.id
