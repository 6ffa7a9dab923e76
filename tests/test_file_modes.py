"""What harness keeps is its owner's only: directories 0700, files 0600."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness import Config, open_harness
from harness.cli import _exit_code_for
from harness.providers.cassette import CassetteWriter
from harness.providers.scripted import ScriptedProvider


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    return env | {"HARNESS_HOME": str(home)}


def test_a_run_makes_a_private_home(tmp_path: Path, project: Path) -> None:
    home = tmp_path / "home"
    script = tmp_path / "script.json"
    big = {"name": "bash", "arguments": {"command": "seq 100000"}}
    script.write_text(json.dumps([{"tool_calls": [big]}, {"text": "ok"}]))
    argv = ["run", "--model", f"scripted:{script}", "--dir", str(project), "--allow", "bash"]
    argv += ["--record", str(tmp_path / "c.jsonl"), "go"]
    old = os.umask(0o022)  # the usual umask: modes must not come from it
    try:
        result = subprocess.run(
            [sys.executable, "-m", "harness", *argv],
            capture_output=True,
            text=True,
            env=_env(home),
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
    finally:
        os.umask(old)
    assert result.returncode == 0, result.stderr
    directories = [home, home / "logs", home / "tool-output"]
    files = [home / "ledger.db", *home.glob("logs/*"), *home.glob("tool-output/*")]
    files += [p for p in (home / "ledger.db-wal", home / "ledger.db-shm") if p.exists()]
    assert list(home.glob("tool-output/*")) and list(home.glob("logs/*"))
    assert {str(d): oct(mode(d)) for d in directories} == {str(d): "0o700" for d in directories}
    assert {str(f): oct(mode(f)) for f in files} == {str(f): "0o600" for f in files}
    assert mode(tmp_path / "c.jsonl") == 0o600
    # The workspace is the user's: a file a tool makes there keeps the usual mode.
    assert mode(project / "package.json") == 0o644


async def test_an_existing_loose_home_is_tightened(tmp_path: Path, project: Path) -> None:
    home = tmp_path / "home"
    (home / "logs").mkdir(parents=True)
    (home / "tool-output").mkdir()
    for name in ("ledger.db", "ledger.db-wal", "ledger.db-shm"):
        (home / name).write_bytes(b"")
        (home / name).chmod(0o644)
    for directory in (home, home / "logs", home / "tool-output"):
        directory.chmod(0o755)
    (home / "ledger.db-wal").unlink()  # an empty WAL is fine, a missing one too
    (home / "ledger.db-shm").unlink()
    provider = ScriptedProvider.from_turns([{"text": "ok"}])
    config = Config(
        home=home,
        model="scripted:x",
        provider_factory=lambda model: provider,
        interactive=False,
        yes=True,
    )
    async with open_harness(config) as h:
        session = await h.create_session(project)
        await h.run(session.id, "hello")
        for path in (home / "ledger.db", home / "ledger.db-wal", home / "ledger.db-shm"):
            assert mode(path) == 0o600, path
    for directory in (home, home / "logs", home / "tool-output"):
        assert mode(directory) == 0o700, directory


def test_cassettes_and_crash_files_are_private(tmp_path: Path, monkeypatch: Any) -> None:
    cassette = tmp_path / "loose.jsonl"
    cassette.write_text("")
    cassette.chmod(0o644)
    writer = CassetteWriter(cassette)
    writer.write({"v": 1})
    writer.close()
    assert mode(cassette) == 0o600
    home = tmp_path / "crash-home"
    monkeypatch.setenv("HARNESS_HOME", str(home))
    assert _exit_code_for(RuntimeError("boom")) == 1
    assert mode(home) == 0o700 and mode(home / "logs") == 0o700
    assert mode(home / "logs" / "crash.log") == 0o600


def test_a_shared_sticky_directory_is_never_tightened(tmp_path: Path) -> None:
    from harness.private import prepare_home

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    prepare_home(shared)
    assert mode(shared) == 0o1777
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o755)
    prepare_home(loose)
    assert mode(loose) == 0o700
