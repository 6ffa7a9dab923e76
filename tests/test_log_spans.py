"""Log spans: each line carries the span it was written in, and a span ends with its scope.

The session actor, the runner and the tool executor bind their spans (session → step →
tool call) with structlog's contextvars; what one turn bound must not show up on the
lines of the next, and a tool call's keys must not outlive the call.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness import Config, open_harness
from harness.providers.scripted import ScriptedProvider


async def test_a_span_ends_with_its_turn_step_and_call(tmp_path: Path, project: Path) -> None:
    read = {"name": "read", "arguments": {"path": "notes.txt"}, "id": "callSpan1"}
    provider = ScriptedProvider.from_turns(
        [{"tool_calls": [read]}, {"text": "first done"}, {"text": "second done"}]
    )
    log_file = tmp_path / "home" / "logs" / "spans.jsonl"
    config = Config(
        home=tmp_path / "home",
        model="scripted:spans",
        provider_factory=lambda model: provider,
        interactive=False,
        log_file=log_file,
    )
    async with open_harness(config) as h:
        session = await h.create_session(project)
        first = await h.run(session.id, "read the notes")
        second = await h.run(session.id, "and now?")
    assert (first.reason, second.reason) == ("answered", "answered")
    lines: list[dict[str, Any]] = [json.loads(line) for line in log_file.read_text().splitlines()]
    mine = [line for line in lines if line.get("session_id") == session.id]

    def one(event: str, **match: Any) -> dict[str, Any]:
        [found] = [
            line
            for line in mine
            if line["event"] == event and all(line.get(k) == v for k, v in match.items())
        ]
        return found

    [first_id, second_id] = [
        line["turn"] for line in mine if line["event"] == "turn started"
    ]
    tool = one("tool completed")
    assert tool["call_id"] == "callSpan1" and tool["span_id"] == "callSpan1"
    assert tool["parent_span_id"].startswith("msg_") and tool["turn"] == first_id
    for turn_id in (first_id, second_id):
        for event in ("turn started", "turn finished"):
            line = one(event, turn=turn_id)
            # The session's own span: no step, message or call of an earlier one.
            assert line["span_id"] == session.id and line["parent_span_id"] is None
            assert not {"step", "message_id", "call_id"} & line.keys(), line
    steps = [line for line in mine if "step" in line]
    assert steps and all(line.get("turn") in (first_id, second_id) for line in steps)
