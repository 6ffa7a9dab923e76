"""The sandbox for commands (DESIGN §8, Sandbox): real bwrap, real bash, real files.

Every write the sandbox must refuse goes to a directory this test made (under /var/tmp, which
the sandbox keeps read-only, or next to the session directory under /tmp, which the
private tmpfs hides), never to a system file.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from daemons import wait_for_daemon
from procs import live_processes

from harness.config import Config, ConfigError
from harness.messages.model import PermissionAction, Rule, ToolCompleted, ToolPart
from harness.providers.scripted import ScriptedProvider
from harness.runtime import Harness, open_harness
from harness.secrets import credential_names, tool_environment
from harness.tools.base import ToolContext
from harness.tools.bash import BashParams, BashTool
from harness.tools.process import group_alive
from harness.tools.sandbox import Sandbox, SandboxMode, parse_sandbox_mode, probe

SECRETS = {
    "MISTRAL_API_KEY": "sk-mistral-7c1e9d",
    "OPENAI_API_KEY": "sk-openai-44b2aa",
    "GITHUB_TOKEN": "ghp_token_5f0e11",
    "DB_PASSWORD": "hunter2-9a8b",
    "MY_CUSTOM_CRED": "custom-cred-3d3d",  # a credential only config knows about
}


@pytest.fixture(scope="session")
def bwrap() -> str:
    """bwrap, working: skipped where it is not, except in CI, where that is a failure."""
    path, reason = probe()
    if reason is not None or path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the sandbox tests, but {reason}")
        pytest.skip(f"no working bubblewrap: {reason}")
    return path


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "kept.txt").write_text("kept\n")
    return root.resolve()


@pytest.fixture
def outside() -> Iterator[Path]:
    """A directory outside the workspace and outside /tmp: read-only in the sandbox."""
    path = Path(tempfile.mkdtemp(prefix="harness-sandbox-test-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def context(
    directory: Path, sandbox: Sandbox | None, *, network: bool = False
) -> ToolContext:
    def check(permission: str, pattern: str) -> PermissionAction:
        return "allow" if network and permission == "bash_network" else "ask"

    return ToolContext(
        session_id="ses_x",
        message_id="msg_x",
        call_id="cal_x",
        directory=directory,
        output_dir=directory.parent / "out",
        check=check,
        sandbox=sandbox,
    )


def sandbox(mode: SandboxMode = "workspace-write", **kwargs: Any) -> Sandbox:
    box = Sandbox.open(mode, **kwargs)
    assert box.mode == mode, box.unavailable
    return box


async def run(ctx: ToolContext, command: str, **kwargs: Any) -> tuple[str, dict[str, Any]]:
    result = await BashTool().execute(BashParams(command=command, **kwargs), ctx)
    return result.output, result.metadata


# --- the filesystem ---------------------------------------------------------------------


async def test_a_write_inside_the_workspace_works(bwrap: str, workspace: Path) -> None:
    output, meta = await run(context(workspace, sandbox()), "echo new > made.txt && cat kept.txt")
    assert output == "kept"
    assert (workspace / "made.txt").read_text() == "new\n"
    assert meta["sandbox"] == "workspace-write" and meta["network"] is False


async def test_a_write_outside_the_workspace_is_refused_and_says_why(
    bwrap: str, workspace: Path, outside: Path
) -> None:
    target = outside / "escaped.txt"
    output, meta = await run(context(workspace, sandbox()), f"echo x > {target}")
    assert not target.exists()
    assert "Read-only file system" in output
    assert f"the filesystem outside {workspace} is read-only" in output
    assert "--sandbox off" in output
    assert meta["exit"] == 1

    # The same command with the sandbox off writes the file.
    output, _ = await run(context(workspace, Sandbox()), f"echo x > {target}")
    assert output == "(no output)"
    assert target.read_text() == "x\n"


async def test_a_sibling_under_tmp_is_out_of_reach(bwrap: str, workspace: Path) -> None:
    sibling = workspace.parent / "sibling"
    sibling.mkdir()
    output, _ = await run(context(workspace, sandbox()), f"ls {sibling}; echo x > {sibling}/f")
    assert not (sibling / "f").exists()
    assert "No such file or directory" in output


async def test_root_gets_no_capabilities_to_undo_the_sandbox(
    bwrap: str, workspace: Path, outside: Path
) -> None:
    # As root, bwrap keeps every capability by default: `mount -o remount,rw /` worked and
    # the write after it reached the host. /proc/sys is only probed (`test -w`), never
    # written: were it writable, a write would change the host's kernel settings.
    command = (
        "grep CapEff /proc/self/status; mount -o remount,rw / 2>/dev/null; "
        f"echo x > {outside}/after-remount; "
        "test -w /proc/sys/kernel/core_pattern && echo sysctl-writable; "
        "unshare -Urm sh -c 'mount -o remount,rw /' 2>/dev/null; "
        f"echo y > {outside}/after-userns"
    )
    output, _ = await run(context(workspace, sandbox()), command)
    assert output.splitlines()[0].split() == ["CapEff:", "0000000000000000"]
    assert "sysctl-writable" not in output
    assert not (outside / "after-remount").exists()
    assert not (outside / "after-userns").exists()


async def test_git_stays_read_only_in_workspace_write(bwrap: str, workspace: Path) -> None:
    await trio.run_process(["git", "init", "-q", str(workspace)])
    config = workspace / ".git" / "config"
    before = config.read_text()
    command = (
        "printf '[core]\\n\\tfsmonitor = echo pwned > PWNED\\n' >> .git/config; "
        "echo hook > .git/hooks/post-checkout; rm -rf .git; echo fine > ok.txt"
    )
    output, _ = await run(context(workspace, sandbox()), command)
    assert config.read_text() == before
    assert not (workspace / ".git" / "hooks" / "post-checkout").exists()
    assert (workspace / ".git").is_dir()
    assert (workspace / "ok.txt").read_text() == "fine\n"
    assert "Read-only file system" in output
    assert f"and so is {workspace / '.git'}" in output


async def test_read_only_mode_refuses_a_workspace_write(bwrap: str, workspace: Path) -> None:
    ctx = context(workspace, sandbox("read-only"))
    command = "cat kept.txt; echo x > made.txt; echo y > /tmp/scratch && cat /tmp/scratch"
    output, meta = await run(ctx, command)
    assert not (workspace / "made.txt").exists()
    assert output.startswith("kept\n")
    assert "y" in output.splitlines()  # the private tmp stays writable
    assert "read-only mode" in output and "--sandbox workspace-write" in output
    assert meta["sandbox"] == "read-only"


async def test_the_private_tmp_is_not_the_hosts(bwrap: str, workspace: Path) -> None:
    host_marker = Path(tempfile.mkstemp(prefix="harness-host-marker-", dir="/tmp")[1])
    inside_name = f"inside-{os.getpid()}"
    try:
        command = (
            f"echo $TMPDIR; test -e {host_marker} && echo host-visible; "
            f"echo made > /tmp/{inside_name} && cat /tmp/{inside_name}; "
            "python3 -c 'import tempfile; print(tempfile.gettempdir())'"
        )
        output, _ = await run(context(workspace, sandbox()), command)
    finally:
        host_marker.unlink()
    assert output.splitlines() == ["/tmp", "made", "/tmp"]
    assert not (Path("/tmp") / inside_name).exists()


# --- the network ------------------------------------------------------------------------


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP listener on the host's loopback: its port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock.getsockname()[1]


async def test_the_network_is_off_unless_bash_network_allows_it(
    bwrap: str, workspace: Path, listener: int
) -> None:
    command = f"exec 3<>/dev/tcp/127.0.0.1/{listener} && echo connected"
    output, meta = await run(context(workspace, sandbox()), command)
    assert "connected" not in output
    assert "Connection refused" in output
    assert "--allow bash_network" in output
    assert meta["network"] is False

    output, meta = await run(context(workspace, sandbox(), network=True), command)
    assert output == "connected"
    assert meta["network"] is True

    # And with the sandbox off there is no network namespace at all.
    output, _ = await run(context(workspace, Sandbox()), command)
    assert output == "connected"


# --- harness's own home and socket, and the machine's service sockets ---------------------


async def test_unix_sockets_that_give_control_are_hidden_without_network(
    bwrap: str, workspace: Path, outside: Path
) -> None:
    home = outside / "home"
    home.mkdir()
    (home / "ledger.db").write_text("every session's history")
    path = outside / "harness.sock"
    connect = (
        "python3 -c 'import socket, sys; s = socket.socket(socket.AF_UNIX); "
        "s.connect(sys.argv[1]); print(\"connected\")' "
    )
    command = f"{connect} {path}; cat {home}/ledger.db"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        server.listen(1)
        # A Unix socket is a file: the network namespace alone does not cut it.
        output, _ = await run(context(workspace, sandbox()), command)
        assert output.startswith("connected\n")
        assert "every session's history" in output

        hiding = sandbox(hidden=[home, path])
        for network in (False, True):
            output, _ = await run(context(workspace, hiding, network=network), command)
            assert "connected" not in output and "Connection refused" in output
            assert "every session's history" not in output and "No such file" in output


async def test_the_runtime_directory_is_hidden(
    bwrap: str, workspace: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = outside / "run-user"
    (runtime / "bus").mkdir(parents=True)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    output, _ = await run(context(workspace, sandbox()), f"ls -A {runtime}; echo end")
    assert output == "end"


def test_the_harness_hides_its_home_and_its_socket_wherever_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.runtime import _own_paths

    monkeypatch.setenv("HARNESS_SOCKET", "/var/tmp/elsewhere/h.sock")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    paths = _own_paths(Config(home=tmp_path / "home"))
    assert tmp_path / "home" in paths
    assert Path("/var/tmp/elsewhere/h.sock") in paths
    assert tmp_path / "data" / "harness" in paths  # the default home, where a daemon may be


async def test_the_loop_hides_its_home_from_commands(
    bwrap: str, tmp_path: Path, workspace: Path, outside: Path
) -> None:
    home = outside / "home"
    turns = bash_turns(f"ls -A {home}; test -e {home}/ledger.db && echo visible")
    async with loop(tmp_path, workspace, turns, home=home) as (h, sid):
        [output] = await outputs(h, sid)
        assert (home / "ledger.db").exists()
    assert "visible" not in output and "ledger.db" not in output


# --- killing ----------------------------------------------------------------------------


async def test_cancel_kills_the_whole_tree_inside_the_sandbox(bwrap: str, workspace: Path) -> None:
    marker = "300.611"
    ctx = context(workspace, sandbox())
    pgids: set[int] = set()

    async def watch() -> None:
        while len(live_processes(f"sleep {marker}")) < 3:
            await trio.sleep(0.01)
        pgids.update(live_processes(marker).values())

    # One sleep in the group, one that ignores SIGTERM, one that left the group.
    command = f"(trap '' TERM; sleep {marker}) & setsid sleep {marker} & sleep {marker}; wait"
    with trio.move_on_after(2) as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            await run(ctx, command)
    assert scope.cancelled_caught
    assert pgids, "the command never started"
    assert not any(group_alive(pgid) for pgid in pgids)
    assert live_processes(marker) == {}


async def test_timeout_kills_the_whole_tree_inside_the_sandbox(bwrap: str, workspace: Path) -> None:
    marker = "300.622"
    ctx = context(workspace, sandbox())
    with trio.fail_after(5):
        output, meta = await run(
            ctx, f"setsid sleep {marker} & sleep {marker} & echo started; wait", timeout=500
        )
    assert meta["timed_out"] is True
    assert output.startswith("started")
    assert live_processes(marker) == {}


async def test_background_jobs_end_with_the_command(bwrap: str, workspace: Path) -> None:
    marker = "300.633"
    with trio.fail_after(5):
        output, _ = await run(context(workspace, sandbox()), f"setsid sleep {marker} & echo ok")
    assert output == "ok"
    assert live_processes(marker) == {}


async def test_a_long_command_outlives_the_worker_thread_that_could_have_started_it(
    bwrap: str, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # --die-with-parent ties the command to the thread that forked bwrap. Trio retires an
    # idle worker thread after 10 s (here 0.2 s), so a command started from one died then.
    import trio._core._thread_cache as thread_cache

    monkeypatch.setattr(thread_cache, "IDLE_TIMEOUT", 0.2)
    await trio.to_thread.run_sync(lambda: None)  # a worker thread, now idling out fast
    output, meta = await run(context(workspace, sandbox()), "sleep 1.5; echo survived")
    assert output == "survived"
    assert meta["exit"] == 0


async def test_the_command_inherits_no_descriptor_but_its_three(
    bwrap: str, workspace: Path
) -> None:
    # bwrap's status pipe included: a command that could write to it could lie about the
    # sandbox's init. (fd 3 is ls's own, the directory it lists.)
    output, _ = await run(context(workspace, sandbox()), "ls /proc/self/fd")
    assert output.split() == ["0", "1", "2", "3"]


async def test_a_signal_death_is_named(bwrap: str, workspace: Path) -> None:
    output, meta = await run(context(workspace, sandbox()), "kill -9 $$")
    assert meta["exit"] == 137
    assert output == "(no output)\n\n[exit code 137, which usually means killed by SIGKILL]"


# --- credentials ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["workspace-write", "off"])
async def test_no_credential_reaches_a_command(
    bwrap: str, workspace: Path, monkeypatch: pytest.MonkeyPatch, mode: SandboxMode
) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HARMLESS_SETTING", "plain-value")
    box = sandbox(mode, secret_env=["MY_CUSTOM_CRED"])
    output, _ = await run(context(workspace, box), "env")
    for name, value in SECRETS.items():
        assert value not in output and f"{name}=" not in output
    assert "HARMLESS_SETTING=plain-value" in output


def test_credential_names_cover_the_keys_the_shapes_and_config() -> None:
    env = {
        "GH_TOKEN": "a",
        "AWS_SECRET_ACCESS_KEY": "b",
        "PGPASSWORD": "c",
        "PATH": "/bin",
        "TOKENIZERS_PARALLELISM": "false",
        "EXTRA": "d",
    }
    names = credential_names(["EXTRA"], env)
    assert {"MISTRAL_API_KEY", "OPENAI_API_KEY", "GH_TOKEN", "PGPASSWORD", "EXTRA"} <= set(names)
    assert "AWS_SECRET_ACCESS_KEY" in names
    assert tool_environment(["EXTRA"], env) == {"PATH": "/bin", "TOKENIZERS_PARALLELISM": "false"}


# --- availability and configuration -----------------------------------------------------


def test_a_missing_bwrap_falls_back_to_off_with_a_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = Sandbox.open("workspace-write", bwrap=str(tmp_path / "no-such-bwrap"))
    assert missing.mode == "off" and missing.requested == "workspace-write"
    assert missing.unavailable is not None and "not found" in missing.unavailable
    assert missing.notice is not None and "commands run without a sandbox" in missing.notice

    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH without bwrap on it
    assert Sandbox.open("read-only").mode == "off"

    broken = tmp_path / "bwrap"
    broken.write_text("#!/bin/sh\necho 'bwrap: No permissions to create namespace' >&2\nexit 1\n")
    broken.chmod(0o755)
    failing = Sandbox.open("workspace-write", bwrap=str(broken))
    assert failing.mode == "off"
    assert failing.unavailable is not None and "No permissions" in failing.unavailable
    assert Sandbox.open("off", bwrap=str(broken)).notice is None  # asked for none: no notice


def test_a_probe_started_ahead_gives_the_probe_s_answer(tmp_path: Path) -> None:
    """``start_probe`` (what ``harness run`` calls before its imports) runs the probe in
    the background; ``Sandbox.open`` then takes its answer, with no second bwrap."""
    import time

    from harness.tools import sandbox

    starts = tmp_path / "starts"
    fake = {}
    for name, ending in (("ok", "exit 0"), ("broken", "echo 'bwrap: no namespaces' >&2; exit 1")):
        path = tmp_path / name / "bwrap"
        path.parent.mkdir()
        path.write_text(f"#!/bin/sh\necho started >> {starts}\nsleep 0.3\n{ending}\n")
        path.chmod(0o755)
        fake[name] = path
    begun = time.monotonic()
    for path in fake.values():
        sandbox.start_probe(str(path))
    assert time.monotonic() - begun < 0.25  # started, not waited for
    time.sleep(0.1)
    assert starts.read_text().count("started") == 2  # running while we went on
    working = Sandbox.open("workspace-write", bwrap=str(fake["ok"]))
    assert working.mode == "workspace-write" and working.unavailable is None
    failing = Sandbox.open("workspace-write", bwrap=str(fake["broken"]))
    assert failing.mode == "off"
    assert failing.unavailable is not None and "no namespaces" in failing.unavailable
    sandbox.start_probe(str(fake["ok"]))  # answered already: nothing more is started
    assert Sandbox.open("read-only", bwrap=str(fake["ok"])).mode == "read-only"
    assert starts.read_text().count("started") == 2


def test_modes_parse_and_bad_values_are_config_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_sandbox_mode(" Read-Only ") == "read-only"
    with pytest.raises(ValueError, match="expected one of workspace-write, read-only, off"):
        parse_sandbox_mode("on")
    with pytest.raises(ConfigError, match=r"Config\.sandbox"):
        Config(sandbox="strict")  # type: ignore[arg-type]
    monkeypatch.setenv("HARNESS_SANDBOX", "off")
    assert Config.from_env().sandbox == "off"
    assert Config.from_env(sandbox="read-only").sandbox == "read-only"  # the flag wins
    monkeypatch.setenv("HARNESS_SANDBOX", "yes")
    with pytest.raises(ConfigError, match="HARNESS_SANDBOX='yes'"):
        Config.from_env()


# --- through the real loop ----------------------------------------------------------------


def bash_turns(*commands: str) -> list[dict[str, Any]]:
    calls = [{"tool_calls": [{"name": "bash", "arguments": {"command": c}}]} for c in commands]
    return [*calls, {"text": "done"}]


@asynccontextmanager
async def loop(
    tmp_path: Path, workspace: Path, turns: list[dict[str, Any]], **config: Any
) -> AsyncIterator[tuple[Harness, str]]:
    provider = ScriptedProvider.from_turns(turns)
    # The rules let every command through (its redirections included: `>` is an edit, and
    # outside the workspace an external_directory): what stops it here is the sandbox.
    rules = [
        *(
            Rule(permission=name, pattern="*", action="allow")
            for name in ("bash", "edit", "external_directory")
        ),
        *config.pop("rules", []),
    ]
    config.setdefault("home", tmp_path / "home")
    cfg = Config(
        model=f"scripted:{tmp_path / 'unused.json'}",
        provider_factory=lambda model: provider,
        interactive=False,
        rules=rules,
        **config,
    )
    async with open_harness(cfg) as h:
        session = await h.create_session(workspace)
        with trio.fail_after(15):
            result = await h.run(session.id, "go")
        assert result.reason == "answered", result
        yield h, session.id


async def outputs(h: Harness, session_id: str) -> list[str]:
    return [
        p.state.output
        for m in await h.messages(session_id)
        for p in m.parts
        if isinstance(p, ToolPart) and isinstance(p.state, ToolCompleted)
    ]


async def test_the_loop_sandboxes_by_default_and_off_turns_it_off(
    bwrap: str, tmp_path: Path, workspace: Path, outside: Path, listener: int
) -> None:
    write = f"echo x > {outside}/a.txt"
    connect = f"exec 3<>/dev/tcp/127.0.0.1/{listener} && echo connected"
    async with loop(tmp_path, workspace, bash_turns(write, connect)) as (h, sid):
        assert h.sandbox.mode == "workspace-write"
        wrote, connected = await outputs(h, sid)
    assert not (outside / "a.txt").exists()
    assert "read-only" in wrote and "--sandbox off" in wrote
    assert "connected" not in connected and "bash_network" in connected

    network = [Rule(permission="bash_network", pattern="exec 3<>*", action="allow")]
    async with loop(tmp_path, workspace, bash_turns(connect), rules=network) as (h, sid):
        assert await outputs(h, sid) == ["connected"]

    async with loop(tmp_path, workspace, bash_turns(write), sandbox="off") as (h, sid):
        assert h.sandbox.mode == "off"
        assert await outputs(h, sid) == ["(no output)"]
    assert (outside / "a.txt").read_text() == "x\n"


@pytest.mark.parametrize("mode", ["workspace-write", "off"])
async def test_the_key_never_reaches_a_command_nor_the_home(
    bwrap: str, tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    turns = bash_turns('echo "key=[$MISTRAL_API_KEY]"; env')
    async with loop(
        tmp_path, workspace, turns, sandbox=mode, secret_env=["MY_CUSTOM_CRED"]
    ) as (h, sid):
        [output] = await outputs(h, sid)
    assert output.startswith("key=[]\n")
    for value in SECRETS.values():
        assert value not in output
    for path in (tmp_path / "home").rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert not any(value.encode() in data for value in SECRETS.values()), path


async def test_an_unavailable_sandbox_is_an_event_in_each_turn(
    tmp_path: Path, workspace: Path
) -> None:
    missing = str(tmp_path / "no-such-bwrap")
    async with loop(tmp_path, workspace, bash_turns("echo ran"), sandbox_bwrap=missing) as (h, sid):
        assert h.sandbox.mode == "off"
        assert await outputs(h, sid) == ["ran"]
        events = h.ledger.events_after(0, session_ids=[sid])
    [event] = [e for e in events if e.type == "sandbox.unavailable"]
    assert event.data["requested"] == "workspace-write"
    assert "not found" in event.data["reason"]


async def test_no_event_when_the_sandbox_works_or_is_off(
    tmp_path: Path, workspace: Path
) -> None:
    async with loop(tmp_path, workspace, bash_turns("true"), sandbox="off") as (h, sid):
        types = {e.type for e in h.ledger.events_after(0, session_ids=[sid])}
    assert "sandbox.unavailable" not in types


# --- the command line -------------------------------------------------------------------


def cli(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = dict(os.environ)
    base.pop("MISTRAL_API_KEY", None)
    base["HARNESS_HOME"] = str(tmp_path / "home")
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        capture_output=True,
        text=True,
        env={**base, **env},
        timeout=30,
        stdin=subprocess.DEVNULL,
    )


def test_run_says_on_stderr_when_the_sandbox_is_unavailable(
    tmp_path: Path, workspace: Path
) -> None:
    answer = Path(__file__).parent.parent / "examples" / "answer.json"
    args = ("run", "--embedded", "--model", f"scripted:{answer}", "--dir", str(workspace), "hi")
    empty = tmp_path / "empty-path"
    empty.mkdir()
    unavailable = cli(tmp_path, *args, PATH=str(empty))
    assert unavailable.returncode == 0, unavailable.stderr
    [line] = [x for x in unavailable.stderr.splitlines() if "sandbox" in x]
    assert line.startswith("harness: sandbox unavailable (bubblewrap (bwrap) was not found)")
    quiet = cli(tmp_path, *args, "--sandbox", "off", PATH=str(empty))
    assert quiet.returncode == 0 and "sandbox" not in quiet.stderr


def test_serve_logs_an_unavailable_sandbox_and_run_through_it_says_so(
    tmp_path: Path, workspace: Path
) -> None:
    import json


    socket_dir = Path(tempfile.mkdtemp(prefix="hs", dir="/tmp"))
    empty = tmp_path / "empty-path"
    empty.mkdir()
    base = dict(os.environ)
    env = {
        **base,
        "PATH": str(empty),
        "HARNESS_HOME": str(tmp_path / "home"),
        "HARNESS_SOCKET": str(socket_dir / "h.sock"),
    }
    with (tmp_path / "daemon.log").open("wb") as log:
        daemon = subprocess.Popen([sys.executable, "-m", "harness", "serve"], env=env, stderr=log)
    try:
        client = wait_for_daemon(daemon, socket_dir / "h.sock", tmp_path / "daemon.log")
        assert client.health()["sandbox"] == "off"
        answer = Path(__file__).parent.parent / "examples" / "answer.json"
        args = ("run", "--model", f"scripted:{answer}", "--dir", str(workspace), "hi")
        through = cli(tmp_path, *args, PATH=str(empty), HARNESS_SOCKET=env["HARNESS_SOCKET"])
        assert through.returncode == 0, through.stderr
        assert len(client.sessions()) == 1  # it went through the daemon
        [line] = [x for x in through.stderr.splitlines() if "sandbox" in x]
        assert line.startswith("harness: sandbox unavailable (bubblewrap (bwrap) was not found)")
    finally:
        daemon.terminate()
        daemon.wait(timeout=15)
        shutil.rmtree(socket_dir, ignore_errors=True)
    lines = [json.loads(line) for line in (tmp_path / "daemon.log").read_text().splitlines()]
    [warning] = [line for line in lines if line["event"] == "sandbox unavailable"]
    assert warning["requested"] == "workspace-write" and "not found" in warning["reason"]


def _is_sleep(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep\0")
    except OSError:  # gone meanwhile
        return False


def test_a_sandboxed_command_dies_with_a_killed_harness(
    bwrap: str, tmp_path: Path, workspace: Path
) -> None:
    import json
    import signal

    marker = "61.7171"
    script = tmp_path / "sleep.json"
    call = {"name": "bash", "arguments": {"command": f"sleep {marker}"}}
    script.write_text(json.dumps([{"tool_calls": [call]}, {"text": "never"}]))
    base = dict(os.environ)
    run = subprocess.Popen(
        [
            *(sys.executable, "-m", "harness", "run", "--embedded", "--allow", "bash"),
            *("--model", f"scripted:{script}", "--dir", str(workspace), "sleep"),
        ],
        env={**base, "HARNESS_HOME": str(tmp_path / "home")},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # The sleep itself, not bwrap (whose command line holds it too): by then bwrap has
        # set up everything, its parent-death signal included.
        deadline = time.monotonic() + 15
        while not any(_is_sleep(pid) for pid in live_processes(marker)):
            assert run.poll() is None, "harness run ended before its command started"
            assert time.monotonic() < deadline, "the command never started"
            time.sleep(0.02)
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=15)
    # Nobody is left to kill the group: bwrap's --die-with-parent and the PID namespace do.
    deadline = time.monotonic() + 5
    while live_processes(marker):
        assert time.monotonic() < deadline, live_processes(marker)
        time.sleep(0.02)


def test_bad_sandbox_values_are_usage_errors(tmp_path: Path) -> None:
    for args, env, message in [
        (("run", "--sandbox", "on", "hi"), {}, "invalid choice: 'on'"),
        (("serve", "--sandbox", "strict"), {}, "invalid choice: 'strict'"),
        (("run", "hi"), {"HARNESS_SANDBOX": "strict"}, "HARNESS_SANDBOX='strict'"),
        (("serve",), {"HARNESS_SANDBOX": "strict"}, "HARNESS_SANDBOX='strict'"),
    ]:
        result = cli(tmp_path, *args, **env)
        assert result.returncode == 2, (args, result.stderr)
        assert message in result.stderr and "Traceback" not in result.stderr


def test_run_through_a_daemon_only_when_its_sandbox_is_the_one_asked_for(
    bwrap: str, tmp_path: Path, workspace: Path
) -> None:

    socket_dir = Path(tempfile.mkdtemp(prefix="hs", dir="/tmp"))
    env = {"HARNESS_SOCKET": str(socket_dir / "h.sock")}
    base = dict(os.environ)
    with (tmp_path / "daemon.log").open("wb") as log:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "harness", "serve"],
            env={**base, "HARNESS_HOME": str(tmp_path / "home"), **env},
            stderr=log,
        )
    try:
        client = wait_for_daemon(daemon, socket_dir / "h.sock", tmp_path / "daemon.log")
        assert client.health()["sandbox"] == "workspace-write"
        answer = Path(__file__).parent.parent / "examples" / "answer.json"
        args = ("run", "--model", f"scripted:{answer}", "--dir", str(workspace), "hi")
        same = cli(tmp_path, *args, "--sandbox", "workspace-write", **env)
        assert same.returncode == 0, same.stderr
        assert len(client.sessions()) == 1  # the daemon ran it
        other = cli(tmp_path, *args, "--sandbox", "off", **env)
        # It stayed embedded, where the daemon's ledger is not to be had.
        assert len(client.sessions()) == 1, other.stderr
        assert other.returncode == 1 and "Traceback" not in other.stderr
    finally:
        daemon.terminate()
        daemon.wait(timeout=15)
        shutil.rmtree(socket_dir, ignore_errors=True)
