"""Configuration files (issue 15, items 1–3; DESIGN §11), through the real CLI.

Real files in temporary directories, real ``harness`` subprocesses: the precedence of
every layer, each error path as one line and exit 1, ``harness config --json`` and its
sources, a named provider answering through a local wire server, file permission rules.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from cli_runs import isolated_env as _env
from cli_runs import run_harness as _harness
from wire_server import Reply, chunk, wire_server

USAGE = {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}


def _script(path: Path, *turns: dict[str, Any]) -> str:
    path.write_text(json.dumps(list(turns)))
    return f"scripted:{path}"


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _repo(tmp_path: Path) -> tuple[Path, Path]:
    """A repository with its config at the root and a session directory two levels down."""
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    work = repo / "src" / "pkg"
    work.mkdir(parents=True)
    return repo, work


def test_precedence_global_project_env_flag(tmp_path: Path) -> None:
    repo, work = _repo(tmp_path)
    models = {
        name: _script(tmp_path / f"{name}.json", {"text": f"from {name}"})
        for name in ("global", "project", "env", "flag")
    }
    global_file = _write(
        tmp_path / "xdg" / "harness" / "config.toml",
        f'model = "{models["global"]}"\nagent = "plan"\nmax_steps = 7\n',
    )
    project_file = _write(repo / ".harness" / "config.toml", f'model = "{models["project"]}"\n')

    def answer(env: dict[str, str], *flags: str) -> str:
        done = _harness(env, "run", "--embedded", "--dir", str(work), *flags, "hi")
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    only_global = _env(tmp_path)
    project_file.rename(tmp_path / "aside.toml")
    assert answer(only_global) == "from global"
    (tmp_path / "aside.toml").rename(project_file)
    assert answer(only_global) == "from project"
    with_env = _env(tmp_path, HARNESS_MODEL=models["env"])
    assert answer(with_env) == "from env"
    assert answer(with_env, "--model", models["flag"]) == "from flag"

    shown = _harness(with_env, "config", "--dir", str(work), "--json")
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    assert report["config"]["model"] == models["env"]
    assert report["config"]["agent"] == "plan"
    assert report["sources"] == {
        "model": "env:HARNESS_MODEL",
        "agent": str(global_file.resolve()),
        "max_steps": str(global_file.resolve()),
        "sandbox": "default",
    }
    # HARNESS_CONFIG names another global file; outside a repository only the session
    # directory's own project file counts.
    other = _write(tmp_path / "other.toml", 'sandbox = "read-only"\n')
    loose = tmp_path / "loose" / "deeper"
    loose.mkdir(parents=True)
    _write(tmp_path / "loose" / ".harness" / "config.toml", 'agent = "plan"\n')
    shown = _harness(
        _env(tmp_path, HARNESS_CONFIG=str(other)), "config", "--dir", str(loose), "--json"
    )
    report = json.loads(shown.stdout)
    assert report["sources"]["sandbox"] == str(other.resolve())
    assert report["sources"]["agent"] == "default", "a parent's file outside a repo is not read"


def test_every_error_is_one_line_naming_the_file_and_key(tmp_path: Path) -> None:
    repo, work = _repo(tmp_path)
    project_file = repo / ".harness" / "config.toml"
    model = _script(tmp_path / "s.json", {"text": "never"})
    cases = {
        'modle = "x"\n': "modle: unknown key",
        "max_steps = \"5\"\n": "max_steps:",
        '[budget]\ncost = "a lot"\n': "budget.cost:",
        '[providers.lab]\nkind = "openai"\nbase = "http://x"\n': "providers.lab.base: unknown key",
        '[permission]\nbash = { "rm *" = "maybe" }\n': "permission.bash",
        "model = \n": "not valid TOML",
    }
    for text, expected in cases.items():
        _write(project_file, text)
        for args in (("config", "--dir", str(work)), ("run", "--embedded", "--model", model,
                                                      "--dir", str(work), "hi")):
            done = _harness(_env(tmp_path), *args)
            assert done.returncode == 1, (text, done.stderr)
            assert "Traceback" not in done.stderr
            lines = done.stderr.strip().splitlines()
            assert len(lines) == 1, (text, done.stderr)
            assert str(project_file.resolve()) in lines[0] and expected in lines[0], lines[0]
    missing = _harness(_env(tmp_path, HARNESS_CONFIG=str(tmp_path / "nope.toml")), "config")
    assert missing.returncode == 1 and "nope.toml" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1


def test_project_rule_denying_bash_stops_the_run_and_a_flag_wins(tmp_path: Path) -> None:
    repo, work = _repo(tmp_path)
    _write(
        repo / ".harness" / "config.toml",
        '[permission]\nbash = { "*" = "allow", "git status*" = "allow", "rm *" = "deny" }\n',
    )
    victim = _write(work / "keep.txt", "data")
    rm = {"tool_calls": [{"name": "bash", "arguments": {"command": "rm keep.txt"}}]}
    model = _script(tmp_path / "rm.json", rm, {"text": "removed"})
    denied = _harness(_env(tmp_path), "run", "--embedded", "--model", model, "--dir", str(work),
                      "clean up")
    assert denied.returncode == 4, denied.stderr
    assert victim.exists()
    # The file's rules are the config layer; a flag's rule comes after and wins.
    allowed = _harness(_env(tmp_path), "run", "--embedded", "--model", model, "--dir", str(work),
                       "--allow", "bash:rm *", "clean up")
    assert allowed.returncode == 0, allowed.stderr
    assert not victim.exists()
    shown = json.loads(_harness(_env(tmp_path), "config", "--dir", str(work), "--json").stdout)
    assert list(shown["config"]["permission"]["bash"]) == ["*", "git status*", "rm *"]
    project_file = (repo / ".harness" / "config.toml").resolve()
    assert shown["sources"]["permission.bash.rm *"] == str(project_file)


def _call(command: str) -> Reply:
    call = {
        "id": "call1",
        "type": "function",
        "function": {"name": "bash", "arguments": json.dumps({"command": command})},
        "index": 0,
    }
    return Reply(events=[chunk(tool_calls=[call]), chunk(finish="tool_calls", usage=USAGE)])


async def test_named_provider_through_a_wire_server_key_from_its_variable(
    tmp_path: Path,
) -> None:
    repo, work = _repo(tmp_path)
    key = "lab-key-5d1f0c9e7b"
    # The key, as a hostile server or model would echo it back into the ledger.
    answer = Reply(events=[chunk(f"the key is {key}"), chunk(finish="stop", usage=USAGE)])
    async with wire_server(_call("echo tool-saw:$LAB_SERVICE_KEY:"), answer) as server:
        _write(
            repo / ".harness" / "config.toml",
            'model = "lab/qwen3-coder"\n'
            "[providers.lab]\n"
            'kind = "openai"\n'
            f'base_url = "{server.url}/v1"\n'
            'api_key_env = "LAB_SERVICE_KEY"\n'
            'headers = { "X-Team" = "infra" }\n'
            'models = { "qwen3-coder" = { context = 32000, output = 4000, input_price = 1.0 } }\n',
        )
        env = _env(tmp_path, LAB_SERVICE_KEY=key)
        done = await trio.run_process(
            [sys.executable, "-m", "harness", "run", "--embedded", "--allow", "bash",
             "--sandbox", "off", "--dir", str(work), "go"],
            capture_stdout=True, capture_stderr=True, check=False, env=env,
            stdin=subprocess.DEVNULL,
        )
    assert done.returncode == 0, done.stderr.decode()
    first, second = server.requests
    assert first.path == "/v1/chat/completions"
    assert first.headers["authorization"] == f"Bearer {key}"
    assert first.headers["x-team"] == "infra"
    assert first.json()["model"] == "qwen3-coder"
    tool_output = second.json()["messages"][-1]["content"]
    assert "tool-saw::" in tool_output, "a command never gets the provider key"
    assert key not in done.stdout.decode() and "[REDACTED:LAB_SERVICE_KEY]" in done.stdout.decode()
    for path in (tmp_path / "home").rglob("*"):
        if path.is_file():
            assert key.encode() not in path.read_bytes(), path
    shown = _harness(env, "config", "--dir", str(work), "--json")
    assert key not in shown.stdout
    report = json.loads(shown.stdout)
    assert report["config"]["providers"]["lab"]["api_key_env"] == "LAB_SERVICE_KEY"
    # Unset, the variable is named in one line, not a traceback.
    missing = _harness(_env(tmp_path), "run", "--embedded", "--dir", str(work), "go")
    assert missing.returncode != 0 and "LAB_SERVICE_KEY" in missing.stderr
    assert "Traceback" not in missing.stderr


async def test_embedded_config_from_files_applies_the_project_file(
    tmp_path: Path, monkeypatch: Any
) -> None:
    import pytest

    import harness

    repo, work = _repo(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    rm = {"tool_calls": [{"name": "bash", "arguments": {"command": "rm keep.txt"}}]}
    model = _script(tmp_path / "rm.json", rm, {"text": "removed"})
    project_file = _write(
        repo / ".harness" / "config.toml",
        f'model = "{model}"\n[permission]\nbash = {{ "*" = "allow", "rm *" = "deny" }}\n',
    )
    victim = _write(work / "keep.txt", "data")
    config = harness.config_from_files(work, home=tmp_path / "home", interactive=False)
    assert config.model == model
    async with harness.open_harness(config) as h:
        session = await h.create_session(work)
        result = await h.run(session.id, "clean up")
    assert result.reason == "denied", result
    assert victim.exists(), "the project file's deny held"
    _write(project_file, "max_steps = 0\n")
    with pytest.raises(harness.ConfigError, match=r"config\.toml: max_steps"):
        harness.config_from_files(work)


def test_daemon_reads_global_at_start_and_project_at_session_creation(
    tmp_path: Path, socket_dir: Path
) -> None:
    import pytest
    from test_client import start_daemon, stop

    from harness.client import ApiError, Client

    repo, work = _repo(tmp_path)
    rm = {"tool_calls": [{"name": "bash", "arguments": {"command": "rm keep.txt"}}]}
    global_model = _script(tmp_path / "g.json", {"text": "from global"})
    _write(tmp_path / "xdg" / "harness" / "config.toml", f'model = "{global_model}"\n')
    env = _env(tmp_path, HARNESS_SOCKET=str(socket_dir / "h.sock"))
    daemon = start_daemon(env, tmp_path / "daemon.log")
    try:
        client = Client(Path(env["HARNESS_SOCKET"]))
        plain = tmp_path / "plain"
        plain.mkdir()
        done = _harness(env, "run", "--dir", str(plain), "hi")
        assert done.returncode == 0 and done.stdout.strip() == "from global", done.stderr
        # A project file written after the daemon started applies to the next session.
        project_model = _script(tmp_path / "p.json", rm, {"text": "removed"})
        _write(
            repo / ".harness" / "config.toml",
            f'model = "{project_model}"\n[permission]\nbash = {{ "rm *" = "deny" }}\n',
        )
        victim = _write(work / "keep.txt", "data")
        denied = _harness(env, "run", "--dir", str(work), "clean up")
        assert denied.returncode == 4, denied.stderr
        assert victim.exists()
        assert len(client.sessions()) == 2, "both runs went through the daemon"
        # What the daemon cannot apply per session is refused, by name, not ignored.
        _write(repo / ".harness" / "config.toml", "[budget]\ncost = 1.0\n")
        with pytest.raises(ApiError) as refused:
            client.create_session(directory=str(work))
        assert refused.value.status == 422 and "budget" in refused.value.message
        _write(repo / ".harness" / "config.toml", "bogus = 1\n")
        with pytest.raises(ApiError) as bad:
            client.create_session(directory=str(work))
        assert bad.value.status == 422 and "bogus: unknown key" in bad.value.message
    finally:
        assert stop(daemon) == 0


def test_daemon_refuses_to_start_on_a_bad_global_file(tmp_path: Path, socket_dir: Path) -> None:
    bad = _write(tmp_path / "xdg" / "harness" / "config.toml", "max_steps = -1\n")
    env = _env(tmp_path, HARNESS_SOCKET=str(socket_dir / "h.sock"))
    done = _harness(env, "serve")
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert str(bad.resolve()) in done.stderr and "max_steps" in done.stderr
    assert "Traceback" not in done.stderr


async def test_named_providers_belong_to_one_harness() -> None:
    from harness.providers.table import kind_of, named_kind, named_providers

    lab = named_kind("lab", "openai", base_url="http://x/v1", key_env=None, headers={}, models={})
    seen: dict[str, bool] = {}

    async def look(name: str, with_lab: bool) -> None:
        if with_lab:
            with named_providers({"lab": lab}):
                await trio.sleep(0.01)  # the other task looks meanwhile
                seen[name] = kind_of("lab/m") is not None
        else:
            await trio.sleep(0.005)
            seen[name] = kind_of("lab/m") is not None

    async with trio.open_nursery() as nursery:
        nursery.start_soon(look, "with", True)
        nursery.start_soon(look, "without", False)
    assert seen == {"with": True, "without": False}
    assert kind_of("lab/m") is None and kind_of("openai/m") is not None


def test_the_ledger_is_named_by_the_global_file_or_the_environment_never_a_project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DESIGN §14: a shared ledger; a repository's own file cannot redirect it."""
    from harness.config_files import ConfigFileError, config_from_files

    global_file = tmp_path / "global.toml"
    global_file.write_text('ledger = "postgresql://db.internal/harness"\nlease_seconds = 4\n')
    monkeypatch.setenv("HARNESS_CONFIG", str(global_file))
    project = tmp_path / "repo"
    (project / ".harness").mkdir(parents=True)
    config = config_from_files(project)
    assert (config.ledger, config.lease_seconds) == ("postgresql://db.internal/harness", 4)
    monkeypatch.setenv("HARNESS_LEDGER", "postgresql://other/h")
    assert config_from_files(project).ledger == "postgresql://other/h"
    assert config_from_files(project, ledger="postgresql://flag/h").ledger == "postgresql://flag/h"
    (project / ".harness" / "config.toml").write_text('ledger = "postgresql://evil/h"\n')
    with pytest.raises(ConfigFileError, match="only the global config file may name the ledger"):
        config_from_files(project)
    global_file.write_text('ledger = "postgresql://u:pw@db/h"\n')
    (project / ".harness" / "config.toml").unlink()
    monkeypatch.delenv("HARNESS_LEDGER")
    with pytest.raises(ValueError, match="holds a password"):
        config_from_files(project)
