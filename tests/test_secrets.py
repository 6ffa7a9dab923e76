"""The provider key never lands in anything harness keeps or prints, whatever route it took."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio
from wire_server import Reply, chunk, wire_server

from harness import Config, open_harness, secrets
from harness.logs import configure_logging
from harness.providers.scripted import ScriptedProvider

KEY = "mk-4f9a2c7e1b3d5a6c8e0f2a4b6c8d0e1f"  # no credential shape: found only as a value
LABEL = "[REDACTED:MISTRAL_API_KEY]"
USAGE = {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}


@pytest.fixture(autouse=True)
def _fresh_secrets() -> Any:
    yield
    secrets.refresh_secrets()  # what the next test's environment says


def test_known_secrets_are_credential_variables_of_a_useful_length() -> None:
    env = {
        "MISTRAL_API_KEY": KEY,
        "OPENAI_API_KEY": "short",  # under 8 characters: never redacted
        "GITHUB_TOKEN": "ghp_" + "a" * 36,
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG",
        "LAB_KEY_VAR": "lab-value-123456",
        "PATH": "/usr/bin:/bin",
        "KEYBOARD": "us-international",
        "MAX_TOKENS": "1000000000",
    }
    found = secrets.known_secrets(env, extra_names=["LAB_KEY_VAR"])
    assert set(found) == {"MISTRAL_API_KEY", "GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "LAB_KEY_VAR"}


def test_redact_replaces_every_occurrence_and_its_json_form() -> None:
    weird = 'pa"ss\\word-12345'
    secrets.refresh_secrets(environ={"MISTRAL_API_KEY": KEY, "DB_PASSWORD": weird})
    assert secrets.redact(f"a {KEY} b {KEY}") == f"a {LABEL} b {LABEL}"
    serialized = json.dumps({"out": f"x{weird}y"})
    assert weird not in json.loads(secrets.redact(serialized))["out"]
    assert "[REDACTED:DB_PASSWORD]" in secrets.redact(serialized)
    assert secrets.redact("nothing here") == "nothing here"
    data = secrets.redact_data({"a": [KEY, 1, {"b": f"-{KEY}-"}]})
    assert data == {"a": [LABEL, 1, {"b": f"-{LABEL}-"}]}
    secrets.refresh_secrets(environ={})
    assert secrets.redact(KEY) == KEY and not secrets.has_secrets()


def test_a_non_ascii_secret_is_redacted_from_log_lines(tmp_path: Path) -> None:
    """A JSON log line escapes non-ASCII (\\u00e4): the secret's escaped form is known too."""
    value = "pässwörd-ünd-mehr-1234"
    secrets.refresh_secrets(environ={"DB_PASSWORD": value})
    log_file = tmp_path / "logs" / "x.jsonl"
    configure_logging(file=log_file)
    structlog.get_logger("t").info("connected", dsn=f"postgres://u:{value}@db/x")
    text = log_file.read_text()
    assert "[REDACTED:DB_PASSWORD]" in text
    assert json.dumps(value)[1:-1] not in text and value not in json.loads(text)["dsn"]


def test_redact_file_finds_a_key_cut_by_the_block_edge(tmp_path: Path, monkeypatch: Any) -> None:
    secrets.refresh_secrets(environ={"MISTRAL_API_KEY": KEY})
    monkeypatch.setattr(secrets, "_FILE_BLOCK", 16)
    path = tmp_path / "out.log"
    body = "".join(f"line {i} {KEY}\n" for i in range(50))
    path.write_text(body)
    path.chmod(0o600)
    assert secrets.redact_file(path)
    assert path.read_text() == body.replace(KEY, LABEL)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    clean = tmp_path / "clean.log"
    clean.write_text("no key\n" * 100)
    assert not secrets.redact_file(clean)


def test_log_lines_mask_known_values_and_credential_shapes(tmp_path: Path) -> None:
    secrets.refresh_secrets(environ={"MISTRAL_API_KEY": KEY})
    log_file = tmp_path / "logs" / "x.jsonl"
    configure_logging(file=log_file)
    shapes = [
        "sk-" + "A1b2C3d4" * 4,
        "ghp_" + "Z" * 36,
        "github_pat_" + "11AAAA" * 6,
        "xoxb-1234567890-abcdefghij",
        "AKIAIOSFODNN7EXAMPLE",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    ]
    log = structlog.get_logger("t")
    log.info("said", text=f"the key is {KEY}", nested={"deep": [KEY]})
    for shape in shapes:
        log.info("shape", value=f"x {shape} y")
    log.info("header", header="Authorization: Bearer abcdefghijklmnopqrstuvwxyz012345")
    log.info("fine", tokens=1234, path="/usr/lib/python3")
    text = log_file.read_text()
    assert KEY not in text and LABEL in text
    for shape in shapes:
        assert shape not in text, shape
    assert "abcdefghijklmnopqrstuvwxyz012345" not in text
    assert '"tokens": 1234' in text and "/usr/lib/python3" in text
    assert oct(log_file.stat().st_mode & 0o777) == "0o600"


# --- the whole route ---------------------------------------------------------------------


def _calls(*calls: tuple[str, str, dict[str, Any]]) -> Reply:
    tool_calls = [
        {
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)},
            "index": index,
        }
        for index, (call_id, name, arguments) in enumerate(calls)
    ]
    return Reply(events=[chunk(tool_calls=tool_calls), chunk(finish="tool_calls", usage=USAGE)])


def _leaky_script() -> list[Reply]:
    return [
        _calls(
            ("Env000001", "bash", {"command": "echo key=$MISTRAL_API_KEY"}),
            ("Cat000001", "bash", {"command": "cat .env"}),
            ("Read00001", "read", {"path": ".env"}),
        ),
        # Big enough to be cut: the full copies under tool-output/ must be clean as well.
        _calls(
            ("Big000001", "bash", {"command": "for i in $(seq 4000); do cat .env; done"}),
            ("Big000002", "grep", {"pattern": "TOKEN|line", "path": "big.txt"}),
        ),
        Reply(events=[chunk("All done."), chunk(finish="stop", usage=USAGE)]),
    ]


def _project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    (project / ".env").write_text(f"MISTRAL_API_KEY={KEY}\nOTHER=1\n")
    (project / "big.txt").write_text("".join(f"line {i} TOKEN={KEY}\n" for i in range(3000)))
    return project


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.pop("OPENAI_API_KEY", None)
    return env | {"HARNESS_HOME": str(home), "MISTRAL_API_KEY": KEY, "HARNESS_LOG_LEVEL": "debug"}


def _files_holding(root: Path, needle: bytes) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and needle in path.read_bytes():
            found.append(str(path))
    return found


async def _run(home: Path, project: Path, url: str, *flags: str) -> Any:
    argv = ["run", "--model", "mistral/devstral-medium-latest", "--base-url", url]
    argv += ["--dir", str(project), "--allow", "bash", "--allow", "read", *flags]
    return await trio.run_process(
        [sys.executable, "-m", "harness", *argv, "show me the key"],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        env=_env(home),
        stdin=subprocess.DEVNULL,
    )


async def test_the_key_reaches_no_file_and_no_output_by_either_route(tmp_path: Path) -> None:
    project = _project(tmp_path)
    home = tmp_path / "home"
    cassette = tmp_path / "cassette.jsonl"
    async with wire_server(*_leaky_script()) as server:
        shown = await _run(home, project, server.url, "--show-request", "--record", str(cassette))
    assert shown.returncode == 0, shown.stderr.decode()
    assert shown.stdout.decode().strip() == "All done."
    # The model heard the tool results, redacted: the key never went back to the provider.
    second = server.requests[1].body.decode()
    assert LABEL in second and KEY not in second
    assert b'"source": "environment"' in shown.stderr  # --show-request printed requests

    async with wire_server(*_leaky_script()) as server:
        as_json = await _run(home, project, server.url, "--json")
    assert as_json.returncode == 0, as_json.stderr.decode()
    assert LABEL.encode() in as_json.stdout

    needle = KEY.encode()
    for output in (shown.stdout, shown.stderr, as_json.stdout, as_json.stderr):
        assert needle not in output
    assert (home / "tool-output").is_dir() and any((home / "tool-output").iterdir())
    assert list(home.glob("logs/*.jsonl"))
    assert _files_holding(home, needle) == []
    assert needle not in cassette.read_bytes() and cassette.stat().st_size > 0


async def test_the_ledger_and_its_wal_hold_no_key_while_open(
    tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setenv("MISTRAL_API_KEY", KEY)
    project = _project(tmp_path)
    turns = [
        {
            "tool_calls": [
                {"name": "read", "arguments": {"path": ".env"}},
                {"name": "bash", "arguments": {"command": "cat .env; echo $MISTRAL_API_KEY"}},
            ]
        },
        {"text": f"the key is {KEY}"},  # even a model that knows it cannot store it
    ]
    provider = ScriptedProvider.from_turns(turns, record=True)
    home = tmp_path / "home"
    config = Config(
        home=home,
        model="scripted:x",
        provider_factory=lambda model: provider,
        interactive=False,
        yes=True,
        show_request=True,
    )
    async with open_harness(config) as h:
        session = await h.create_session(project)
        seen: list[str] = []
        async with h.subscribe(session.id) as events:
            await h.prompt(session.id, f"my key is {KEY}")
            async for event in events:
                seen.append(event.to_json())
                if event.type == "turn.finished":
                    break
        assert (home / "ledger.db-wal").exists()
        assert _files_holding(home, KEY.encode()) == []
        answer = h.ledger.messages(session.id)[-1].parts
        texts = [getattr(p, "text", "") for p in answer]
        assert f"the key is {LABEL}" in texts
    assert all(KEY not in line for line in seen)
    assert any(LABEL in line for line in seen)
    # What the model was sent from the second step on is the redacted history.
    assert KEY not in json.dumps([str(r.messages) for r in provider.requests[1:]])
