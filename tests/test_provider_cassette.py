"""Record and replay: ``--record FILE`` writes a cassette, ``--model replay:FILE`` plays it.

Recording runs against the local wire server through the real providers; replay runs
with the server gone, through the same provider code over a replay transport.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from wire_server import Reply, chunk, wire_server

from harness import Config, open_harness
from harness.messages.provider import Finish, ProviderRequest, TextDelta, UserTurn
from harness.providers import create_provider, split_model
from harness.providers.cassette import CassetteError, ReplayProvider, first_difference
from harness.providers.errors import AuthError, RetryableError

USAGE = {"prompt_tokens": 1000, "completion_tokens": 200, "total_tokens": 1200}
KEY = "sk-secret-9f8e7d6c5b4a"


def _read_call(call_id: str, path: str) -> Reply:
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": "read", "arguments": json.dumps({"path": path})},
        "index": 0,
    }
    return Reply(events=[chunk(tool_calls=[call]), chunk(finish="tool_calls", usage=USAGE)])


def _answer(text: str) -> Reply:
    return Reply(events=[chunk(text[:5]), chunk(text[5:]), chunk(finish="stop", usage=USAGE)])


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("MISTRAL_API_KEY", None)
    env.pop("OPENAI_API_KEY", None)
    return env | {"HARNESS_HOME": str(home)} | extra


async def _harness(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[bytes]:
    return await trio.run_process(
        [sys.executable, "-m", "harness", *args],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        env=env,
    )


_VOLATILE = {"id", "session_id", "message_id", "parent_id", "created", "updated", "completed"}
_VOLATILE |= {"start", "end", "model"}
# The recording session keeps the --base-url it ran against (issue 12: a session setting);
# the replay has none: like the model string, the server is where the bytes came from.
_VOLATILE |= {"base_url"}


def _stable(value: Any) -> Any:
    """A transcript without ids, timestamps and the model string (replay:… vs mistral/…)."""
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in _VOLATILE}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def _transcript(home: Path) -> Any:
    env = _env(home)
    listed = subprocess.run(
        [sys.executable, "-m", "harness", "sessions", "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    (session,) = json.loads(listed.stdout)
    shown = subprocess.run(
        [sys.executable, "-m", "harness", "show", session["id"], "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(shown.stdout)


async def test_cli_records_a_session_and_replays_it_offline(tmp_path: Path, project: Path) -> None:
    cassette = tmp_path / "session.jsonl"
    async with wire_server(_read_call("AbC123xYz", "package.json"), _answer("It uses pnpm.")) as (
        server
    ):
        recorded = await _harness(
            _env(tmp_path / "home1", MISTRAL_API_KEY=KEY),
            "run",
            "--record",
            str(cassette),
            "--model",
            "mistral/devstral-medium-latest",
            "--base-url",
            server.url,
            "--dir",
            str(project),
            "which package manager?",
        )
    assert recorded.returncode == 0, recorded.stderr.decode()
    assert recorded.stdout.decode().strip() == "It uses pnpm."

    text = cassette.read_text()
    assert KEY not in text and "authorization" not in text.lower()
    lines = [json.loads(line) for line in text.splitlines()]
    assert [(e["provider"], e["model"], e["status"]) for e in lines] == [
        ("mistral", "devstral-medium-latest", 200),
        ("mistral", "devstral-medium-latest", 200),
    ]
    assert lines[0]["base_url"] == server.url
    assert lines[0]["headers"]["content-type"] == "text/event-stream"
    assert lines[1]["request"]["messages"][-1]["tool_call_id"] == "AbC123xYz"
    assert lines[1]["body"].endswith("data: [DONE]\n\n")

    # The server is gone and there is no key: replay needs neither.
    replayed = await _harness(
        _env(tmp_path / "home2"),
        "run",
        "--model",
        f"replay:{cassette}",
        "--dir",
        str(project),
        "which package manager?",
    )
    assert replayed.returncode == 0, replayed.stderr.decode()
    assert replayed.stdout == recorded.stdout
    assert replayed.stderr == recorded.stderr  # the same steps and tool calls shown
    first, second = _transcript(tmp_path / "home1"), _transcript(tmp_path / "home2")
    assert first["messages"][-1]["info"]["cost"] > 0
    assert _stable(second) == _stable(first)


async def test_openai_session_with_a_retry_replays_in_process(
    tmp_path: Path, project: Path
) -> None:
    cassette = tmp_path / "openai.jsonl"
    limited = Reply(status=429, headers=[("Retry-After", "0.05")], body={"message": "slow down"})
    async with wire_server(
        _read_call("call_1", "notes.txt"), limited, _answer("Found the marker.")
    ) as server:
        config = Config(
            home=tmp_path / "home1",
            model="openai/qwen2.5-coder",
            base_url=server.url + "/v1",
            retry_initial_delay=0.01,
            record=cassette,
        )
        async with open_harness(config) as h:
            session = await h.create_session(project)
            first = await h.run(session.id, "find the marker")
            recorded = await h.messages(session.id)
    assert first.answer == "Found the marker."
    lines = [json.loads(line) for line in cassette.read_text().splitlines()]
    assert [e["status"] for e in lines] == [200, 429, 200]
    assert lines[1]["headers"]["retry-after"] == "0.05"

    config = Config(home=tmp_path / "home2", model=f"replay:{cassette}", retry_initial_delay=0.01)
    async with open_harness(config) as h:
        session = await h.create_session(project)
        seen: list[str] = []
        async with h.subscribe(session.id) as events:
            again = None

            async def run() -> None:
                nonlocal again
                again = await h.run(session.id, "find the marker")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(run)
                async for event in events:
                    seen.append(event.type)
                    if event.type == "turn.finished":
                        break
        replayed = await h.messages(session.id)
    assert again is not None and again.answer == "Found the marker."
    assert "session.retry" in seen  # the recorded 429 is retried the same way
    assert _stable([m.model_dump() for m in replayed]) == _stable(
        [m.model_dump() for m in recorded]
    )


async def test_replay_past_the_end_is_a_clear_error(tmp_path: Path, project: Path) -> None:
    cassette = tmp_path / "short.jsonl"
    async with wire_server(_read_call("call_1", "notes.txt"), _answer("done")) as server:
        config = Config(
            home=tmp_path / "home1",
            model="openai/m",
            base_url=server.url + "/v1",
            record=cassette,
        )
        async with open_harness(config) as h:
            session = await h.create_session(project)
            await h.run(session.id, "go")
    # Keep only the first exchange: the replayed run will ask for a second.
    cassette.write_text(cassette.read_text().splitlines()[0] + "\n")
    replayed = await _harness(
        _env(tmp_path / "home2"),
        "run",
        "--model",
        f"replay:{cassette}",
        "--dir",
        str(project),
        "go",
    )
    assert replayed.returncode == 1
    stderr = replayed.stderr.decode()
    assert "more than the 1 exchange(s) recorded" in stderr and str(cassette) in stderr
    assert "Traceback" not in stderr


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no cassette at"),
        ("", "holds no exchange"),
        ("{not json\n", "line 1: not JSON"),
        ('{"v": 1, "provider": "mistral"}\n', "line 1: missing or invalid 'model'"),
        ('{"v": 1, "provider": "gemini", "model": "m"}\n', "unknown provider 'gemini'"),
        ('{"v": 9}\n', "unsupported cassette version 9"),
        ("[1, 2]\n", "not a cassette entry"),
    ],
)
def test_a_missing_or_corrupt_cassette_is_a_clear_error(
    tmp_path: Path, project: Path, content: str | None, message: str
) -> None:
    cassette = tmp_path / "bad.jsonl"
    if content is not None:
        cassette.write_text(content)
    with pytest.raises(CassetteError, match=message):
        create_provider(f"replay:{cassette}")
    if content in (None, "{not json\n"):  # and through the CLI: no traceback
        args = ["run", "--model", f"replay:{cassette}", "--dir", str(project), "hi"]
        result = subprocess.run(
            [sys.executable, "-m", "harness", *args],
            capture_output=True,
            text=True,
            env=_env(tmp_path / "home"),
            timeout=30,
        )
        assert result.returncode == 1
        assert message in result.stderr and "Traceback" not in result.stderr


def _line(**fields: Any) -> str:
    entry = {
        "v": 1,
        "provider": "mistral",
        "model": "m",
        "base_url": None,
        "method": "POST",
        "url": "https://api.mistral.ai/v1/chat/completions",
        "request": {},
        "status": 200,
        "headers": {"content-type": "text/event-stream"},
        "body": "",
    }
    return json.dumps(entry | fields) + "\n"


async def _collect(provider: Any, text: str = "hi") -> list[Any]:
    request = ProviderRequest("ignored", ("sys",), (UserTurn(text),), ())
    async with provider.stream(request) as events:
        return [event async for event in events]


def _sse(*items: dict[str, Any]) -> str:
    return "".join(f"data: {json.dumps(item)}\n\n" for item in items) + "data: [DONE]\n\n"


async def test_a_differing_request_takes_the_next_exchange_and_a_matching_one_wins(
    tmp_path: Path,
) -> None:
    cassette = tmp_path / "c.jsonl"
    one = _sse(chunk("one"), chunk(finish="stop"))
    two = _sse(chunk("two"), chunk(finish="stop"))
    body_two = {
        "model": "m",
        "stream": True,
        "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "b"}],
    }
    cassette.write_text(_line(body=one) + _line(body=two, request=body_two))
    replay = ReplayProvider(cassette)
    try:
        # "b" was recorded second; its identical request body finds it first.
        events = await _collect(replay, "b")
        assert events[0] == TextDelta("two")
        events = await _collect(replay, "anything")
        assert events[0] == TextDelta("one") and isinstance(events[-1], Finish)
        with pytest.raises(CassetteError, match="more than the 2 exchange"):
            await _collect(replay)
    finally:
        await replay.aclose()


async def test_replayed_errors_map_like_the_real_ones(tmp_path: Path) -> None:
    cassette = tmp_path / "c.jsonl"
    cassette.write_text(
        _line(status=401, headers={"content-type": "application/json"}, body='{"message":"no"}')
        + _line(status=None, error={"type": "ConnectError", "message": "refused"})
        + _line(
            body=f"data: {json.dumps(chunk('par'))}\n\n",
            error={"type": "ReadError", "message": "reset"},
        )
    )
    replay = ReplayProvider(cassette)
    try:
        with pytest.raises(AuthError, match="MISTRAL_API_KEY"):
            await _collect(replay)
        with pytest.raises(RetryableError, match="connection failed: refused"):
            await _collect(replay)
        with pytest.raises(RetryableError, match="reset"):
            await _collect(replay)
    finally:
        await replay.aclose()


def test_model_strings_and_first_difference() -> None:
    assert split_model("replay:/tmp/x.jsonl") == ("replay", "/tmp/x.jsonl")
    assert first_difference({"a": 1, "m": [{"c": "x"}]}, {"a": 1, "m": [{"c": "y"}]}) == "m[0].c"
    assert first_difference({"m": [1]}, {"m": [1, 2]}) == "m[1]"


def test_record_keeps_run_embedded() -> None:
    from harness.cli import _parser
    from harness.commands.run import _daemon_can_take

    assert _daemon_can_take(_parser().parse_args(["run", "hi"]))
    assert not _daemon_can_take(_parser().parse_args(["run", "--record", "c.jsonl", "hi"]))
