"""The whole loop against a local server speaking Mistral's and OpenAI's wire formats.

Only the wire is fake: the real CLI or the embedded harness, the real provider code and
SDK models, real HTTP on 127.0.0.1, real tools on real files.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import trio
from wire_server import Reply, chunk, wire_server

from harness import Config, open_harness
from harness.messages.model import AssistantMessage, StepFinishPart, ToolPart

USAGE = {"prompt_tokens": 1000, "completion_tokens": 200, "total_tokens": 1200}


def _read_call(call_id: str, path: str) -> Reply:
    return Reply(
        events=[
            chunk(
                tool_calls=[
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "read", "arguments": json.dumps({"path": path})},
                        "index": 0,
                    }
                ]
            ),
            chunk(finish="tool_calls", usage=USAGE),
        ]
    )


def _answer(text: str) -> Reply:
    return Reply(events=[chunk(text[:5]), chunk(text[5:]), chunk(finish="stop", usage=USAGE)])


async def test_cli_run_against_a_mistral_wire_server(tmp_path: Path, project: Path) -> None:
    async with wire_server(_read_call("AbC123xYz", "package.json"), _answer("It uses pnpm.")) as (
        server
    ):
        env = dict(os.environ)
        env |= {"HARNESS_HOME": str(tmp_path / "home"), "MISTRAL_API_KEY": "test-key"}
        result = await trio.run_process(
            [
                sys.executable,
                "-m",
                "harness",
                "run",
                "--json",
                "--model",
                "mistral/devstral-medium-latest",
                "--base-url",
                server.url,
                "--dir",
                str(project),
                "which package manager?",
            ],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=env,
        )
    assert result.returncode == 0, result.stderr.decode()
    events = [json.loads(line) for line in result.stdout.decode().splitlines()]
    assert events[-1]["data"]["answer"] == "It uses pnpm."
    finishes = [
        e["data"]
        for e in events
        if e["type"] == "part.created" and e["data"]["type"] == "step-finish"
    ]
    assert [f["tokens"]["input"] for f in finishes] == [1000, 1000]
    assert all(f["cost"] > 0 for f in finishes)

    first, second = (r.json() for r in server.requests)
    assert server.requests[0].headers["authorization"] == "Bearer test-key"
    assert first["model"] == "devstral-medium-latest"
    assert first["parallel_tool_calls"] is True
    assert {t["function"]["name"] for t in first["tools"]} >= {"read", "bash", "edit"}
    # The tool result goes back bound to the call id the model made.
    tool_message = second["messages"][-1]
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "AbC123xYz"
    assert "pnpm@9" in tool_message["content"]


async def test_rate_limit_is_retried_and_visible_as_retry_status(
    tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MISTRAL_API_KEY", "test-key")
    limited = Reply(status=429, headers=[("Retry-After", "0.05")], body={"message": "slow down"})
    async with wire_server(limited, _answer("hello there")) as server:
        config = Config(
            home=tmp_path / "home",
            model="mistral/mistral-small-latest",
            base_url=server.url,
            retry_initial_delay=0.01,
        )
        async with open_harness(config) as h:
            session = await h.create_session(project)
            seen: list[str] = []
            async with h.subscribe(session.id) as events:
                result_box: list[str] = []

                async def run() -> None:
                    result = await h.run(session.id, "hi")
                    result_box.append(result.answer)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(run)
                    async for event in events:
                        seen.append(event.type)
                        if event.type == "session.updated" and event.data["status"] == "retry":
                            seen.append("status:retry")
                        if event.type == "turn.finished":
                            break
            assert result_box == ["hello there"]
            assert "session.retry" in seen and "status:retry" in seen
            assert len(server.requests) == 2
            final = h.session(session.id)
            assert final.status == "idle" and final.tokens.input == 1000


async def test_openai_compatible_server_runs_tools_between_turns(
    tmp_path: Path, project: Path
) -> None:
    async with wire_server(_read_call("call_1", "notes.txt"), _answer("Found the marker.")) as (
        server
    ):
        config = Config(home=tmp_path / "home", model="openai/qwen2.5-coder", base_url=server.url)
        async with open_harness(config) as h:
            session = await h.create_session(project)
            result = await h.run(session.id, "find the marker")
            transcript = await h.messages(session.id)
    assert result.reason == "answered" and result.answer == "Found the marker."
    tools = [p for m in transcript for p in m.parts if isinstance(p, ToolPart)]
    assert [(t.call_id, t.state.status) for t in tools] == [("call_1", "completed")]
    steps = [m.info for m in transcript if isinstance(m.info, AssistantMessage)]
    assert [s.finish for s in steps] == ["tool_calls", "stop"]
    finishes = [p for m in transcript for p in m.parts if isinstance(p, StepFinishPart)]
    assert all(f.tokens.input == 1000 for f in finishes)
    second = server.requests[1].json()
    assert second["messages"][-1]["role"] == "tool"
    assert second["messages"][-1]["tool_call_id"] == "call_1"
    assert "marker-7f3a" in second["messages"][-1]["content"]


async def test_authentication_failure_is_a_clear_error(
    tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MISTRAL_API_KEY", "wrong")
    async with wire_server(Reply(status=401, body={"message": "Unauthorized"})) as server:
        config = Config(home=tmp_path / "home", model="mistral/m", base_url=server.url)
        async with open_harness(config) as h:
            session = await h.create_session(project)
            result = await h.run(session.id, "hi")
    assert result.reason == "error"
    assert result.error is not None and "MISTRAL_API_KEY" in result.error
    assert len(server.requests) == 1  # never retried


async def test_two_parallel_calls_are_both_executed_and_answered(
    tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MISTRAL_API_KEY", "test-key")
    calls = [
        {"id": "aaaaaaaa1", "function": {"name": "read", "arguments": '{"path": "notes.txt"}'}},
        {"id": "bbbbbbbb2", "function": {"name": "read", "arguments": '{"path": "package.json"}'}},
    ]
    both = Reply(events=[chunk(tool_calls=calls), chunk(finish="tool_calls", usage=USAGE)])
    async with wire_server(both, _answer("Read both files.")) as server:
        config = Config(home=tmp_path / "home", model="mistral/m", base_url=server.url)
        async with open_harness(config) as h:
            session = await h.create_session(project)
            result = await h.run(session.id, "read both")
    assert result.answer == "Read both files."
    second = server.requests[1].json()
    (assistant,) = [m for m in second["messages"] if m["role"] == "assistant"]
    assert [c["id"] for c in assistant["tool_calls"]] == ["aaaaaaaa1", "bbbbbbbb2"]
    results = {m["tool_call_id"]: m for m in second["messages"] if m["role"] == "tool"}
    assert "marker-7f3a" in results["aaaaaaaa1"]["content"]
    assert "pnpm@9" in results["bbbbbbbb2"]["content"]
    assert {m["name"] for m in results.values()} == {"read"}
