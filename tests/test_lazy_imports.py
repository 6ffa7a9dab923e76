"""Commands that call no model import neither the mistralai SDK nor the providers' httpx path.

Each command runs in a fresh interpreter (the real ``harness.cli.main``, no daemon), and
``sys.modules`` is read after it finished.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROVIDER_MODULES = (
    "mistralai",
    "httpx",
    "httpcore",
    "harness.providers.sse",
    "harness.providers.mistral",
    "harness.providers.openai",
    "harness.providers.cassette",
)

_PROBE = """
import json, sys
from harness.cli import main
try:
    main(sys.argv[2:])
except SystemExit as exit:
    code = exit.code
watched = json.loads(sys.argv[1])
print(json.dumps({"code": code, "loaded": [m for m in watched if m in sys.modules]}))
"""


def _imports(tmp_path: Path, *args: str, watched: tuple[str, ...] = PROVIDER_MODULES) -> list[str]:
    env = dict(os.environ)
    env |= {"HARNESS_HOME": str(tmp_path / "home"), "HARNESS_SOCKET": str(tmp_path / "no.sock")}
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(list(watched)), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["code"] in (0, None), result.stderr
    loaded: list[str] = report["loaded"]
    return loaded


def _script(tmp_path: Path) -> str:
    path = tmp_path / "script.json"
    path.write_text(
        json.dumps(
            [{"tool_calls": [{"name": "read", "arguments": {"path": "notes.txt"}}]}, {"text": "ok"}]
        )
    )
    return f"scripted:{path}"


def test_help_imports_nothing_heavy(tmp_path: Path) -> None:
    heavy = (*PROVIDER_MODULES, "trio", "pydantic", "apsw", "psycopg")
    assert _imports(tmp_path, "--help", watched=heavy) == []


def test_a_scripted_run_and_the_ledger_commands_import_no_provider_code(
    tmp_path: Path, project: Path
) -> None:
    run = ["run", "--embedded", "--model", _script(tmp_path), "--dir", str(project), "hi"]
    assert _imports(tmp_path, *run) == []
    assert _imports(tmp_path, "sessions") == []  # no daemon: read from the ledger
    assert _imports(tmp_path, "sessions", "--json") == []


def test_a_sqlite_run_never_imports_psycopg(tmp_path: Path, project: Path) -> None:
    """psycopg is for a PostgreSQL ledger only (DESIGN §14): the default never loads it."""
    run = ["run", "--embedded", "--model", _script(tmp_path), "--dir", str(project), "hi"]
    assert _imports(tmp_path, *run, watched=("psycopg",)) == []


@pytest.mark.parametrize(("provider", "loads_sdk"), [("openai", False), ("mistral", True)])
def test_a_real_provider_loads_httpx_and_only_mistral_loads_the_sdk(
    tmp_path: Path, project: Path, provider: str, loads_sdk: bool
) -> None:
    # A replayed session runs the real provider code without a network or a key.
    body = 'data: {"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}],'
    body += ' "id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}\n\n'
    entry = {
        "v": 1,
        "provider": provider,
        "model": "m",
        "base_url": None,
        "request": {},
        "status": 200,
        "headers": {"content-type": "text/event-stream"},
        "body": body + "data: [DONE]\n\n",
    }
    cassette = tmp_path / "c.jsonl"
    cassette.write_text(json.dumps(entry) + "\n")
    run = ["run", "--embedded", "--model", f"replay:{cassette}", "--dir", str(project), "hi"]
    loaded = _imports(tmp_path, *run)
    assert "httpx" in loaded and f"harness.providers.{provider}" in loaded
    assert ("mistralai" in loaded) is loads_sdk


def test_the_bash_parser_is_imported_only_when_a_command_is_checked(
    tmp_path: Path, project: Path
) -> None:
    parser = ("tree_sitter", "tree_sitter_bash")
    assert _imports(tmp_path, "--help", watched=parser) == []
    run = ["run", "--embedded", "--model", _script(tmp_path), "--dir", str(project), "hi"]
    assert _imports(tmp_path, *run, watched=parser) == []  # a read only: no bash to check
    bash = tmp_path / "bash.json"
    call = {"name": "bash", "arguments": {"command": "ls"}}
    bash.write_text(json.dumps([{"tool_calls": [call]}, {"text": "ok"}]))
    run = ["run", "--embedded", "--yes", "--model", f"scripted:{bash}", "--dir", str(project), "hi"]
    assert _imports(tmp_path, *run, watched=parser) == list(parser)


def test_the_toml_parser_is_imported_only_when_there_is_a_config_file(
    tmp_path: Path, project: Path
) -> None:
    run = ["run", "--model", _script(tmp_path), "--dir", str(project), "--yes", "hi"]
    assert _imports(tmp_path, *run, watched=("tomllib",)) == []
    (project / ".harness").mkdir(exist_ok=True)
    (project / ".harness" / "config.toml").write_text("max_steps = 5\n")
    assert _imports(tmp_path, *run, watched=("tomllib",)) == ["tomllib"]


# What a `harness run` on the Mistral wire path must not have loaded when it sends its
# first request (issue 14, start-up): each was measured on that path and is not used there.
NOT_BEFORE_THE_FIRST_REQUEST = (
    # Optional extras structlog and httpx load for other programs (harness.lean_imports).
    "rich",
    "pygments",
    "click",
    "httpx._main",
    "asyncio",  # structlog's and the SDK's async helpers; harness runs on Trio
    "importlib.metadata",  # pydantic's plugin scan
    "harness.messages.api",  # the daemon API's 25 request and answer models
    "ssl",  # OpenSSL's TLS: the server is plain http:// (Trio and httpcore defer it)
    "_hashlib",  # OpenSSL's digests (libcrypto, 3.4 MB): hashlib uses its builtin ones
    "ctypes",  # Trio names its worker threads through /proc instead
    "pickle",  # structlog's PicklingError is _pickle's
    "certifi",  # httpcore's CA bundle, for TLS only
    "anyio",  # httpcore's locks under asyncio; harness runs on Trio
    "difflib",  # diffs and close spellings: when a file changed or was not found
    "mistralai.client.models.completionchunk",  # the reply's model: after the request
)

# harness's models that a run validates only after its first request (or never, without a
# config file): built on first use (``defer_build``), not at import.
NOT_BUILT_BEFORE_THE_FIRST_REQUEST = (
    "harness.messages.model.ReasoningPart",
    "harness.messages.model.CompactionPart",
    "harness.messages.model.MessageWithParts",
    "harness.messages.model.PatchPart",
    "harness.messages.todo.TodoList",
    "harness.messages.question.QuestionRequest",
    "harness.messages.permission.PermissionRequest",
    "harness.config_files.ConfigFile",
    "harness.mcp.spec.McpServerSpec",
)

_FIRST_REQUEST_PROBE = """
import json, sys
from harness import install_lean_imports
install_lean_imports()  # as harness.cli.main does first; idempotent, so main's is a no-op
# Where every provider request is sent (AsyncClient.send is skipped for the providers'
# own client): h11, httpx and Trio, which it imports, are loaded by then in any case.
from harness.providers.http11 import H11Transport
send = H11Transport.handle_async_request
async def first_send(self, *args, **kwargs):
    if not hasattr(first_send, "seen"):
        first_send.seen = sorted(m for m in sys.modules if sys.modules[m] is not None)
        import pydantic
        models, found = [pydantic.BaseModel], []
        while models:
            model = models.pop()
            models.extend(model.__subclasses__())
            if model.__module__.startswith("harness.") and model.__pydantic_complete__:
                found.append(f"{model.__module__}.{model.__qualname__}")
        first_send.built = sorted(found)
    return await send(self, *args, **kwargs)
H11Transport.handle_async_request = first_send
from harness.cli import main
try:
    main(sys.argv[2:])
except SystemExit as exit:
    code = exit.code
with open(sys.argv[1], "w") as out:
    seen = {key: getattr(first_send, key, None) for key in ("seen", "built")}
    json.dump({"code": code, "loaded": seen["seen"], "built": seen["built"]}, out)
"""


async def _at_first_request(tmp_path: Path, project: Path) -> dict[str, list[str]]:
    """What a `harness run --model mistral/…` had loaded (modules) and built (harness's
    pydantic models) when it sent its request."""
    import trio
    from wire_server import Reply, chunk, wire_server

    answer = Reply(events=[chunk("ok", finish="stop")])
    report = tmp_path / "report.json"
    async with wire_server(answer) as server:
        env = dict(os.environ)
        env |= {
            "HARNESS_HOME": str(tmp_path / "home"),
            "HARNESS_SOCKET": str(tmp_path / "no.sock"),
            "MISTRAL_API_KEY": "test-key",
        }
        command = [sys.executable, "-c", _FIRST_REQUEST_PROBE, str(report), "run", "--embedded"]
        command += ["--model", "mistral/devstral-medium-latest", "--base-url", server.url]
        command += ["--dir", str(project), "hi"]
        done = await trio.run_process(command, env=env, capture_stdout=True, capture_stderr=True)
        assert len(server.requests) == 1, done.stderr
    result = json.loads(report.read_text())
    assert result["code"] in (0, None), done.stderr
    assert done.stdout.decode().strip() == "ok"
    return {"loaded": result["loaded"], "built": result["built"]}


async def test_a_wire_run_sends_its_first_request_without_what_it_does_not_use(
    tmp_path: Path, project: Path
) -> None:
    found = await _at_first_request(tmp_path, project)
    loaded, built = found["loaded"], found["built"]
    assert "harness.providers.mistral" in loaded and "structlog" in loaded  # the probe works
    assert [m for m in NOT_BEFORE_THE_FIRST_REQUEST if m in loaded] == []
    assert "harness.messages.model.UserMessage" in built  # written before the request
    assert [m for m in NOT_BUILT_BEFORE_THE_FIRST_REQUEST if m in built] == []
