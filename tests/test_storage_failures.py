"""Storage that fails under the CLI (issue 12, items 5 and 6): real files, real mounts.

A corrupt, truncated or read-only ledger, a ``HARNESS_HOME`` that cannot be created, a
log that cannot be written, a disk that fills during a turn: each is one clear line on
stderr and exit 1 (or, for the log, no failure at all), never a traceback.

The tests run as root, where file modes do not stop writes: a read-only filesystem and
a full one are small tmpfs mounts (skipped, saying why, where mounting is not allowed);
an unwritable home is a path under a regular file; an unwritable log is ``/dev/full``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import apsw
import pytest


def _env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["HARNESS_HOME"] = str(home)
    env["HARNESS_SOCKET"] = f"/tmp/hs-{uuid.uuid4().hex[:12]}.sock"  # no daemon answers here
    return env


def harness(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        capture_output=True,
        text=True,
        env=_env(home),
        timeout=60,
    )


def _script(tmp_path: Path, turns: list[dict[str, Any]], name: str = "s.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(turns))
    return f"scripted:{path}"


def _one_clear_line(result: subprocess.CompletedProcess[str], *words: str) -> str:
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture
def ledger_home(tmp_path: Path, project: Path) -> Path:
    """A home whose ledger holds one finished session."""
    home = tmp_path / "home"
    done = harness(home, "run", "--model", _script(tmp_path, [{"text": "hi"}]), "--dir",
                   str(project), "hello")
    assert done.returncode == 0, done.stderr
    return home


# --- item 5: exit codes ---------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty-header"])
@pytest.mark.parametrize("command", [["sessions"], ["show", "ses_x"], ["trace", "ses_x"]])
def test_a_damaged_ledger_is_one_line_and_exit_1(
    ledger_home: Path, damage: str, command: list[str]
) -> None:
    ledger = ledger_home / "ledger.db"
    for leftover in ("ledger.db-wal", "ledger.db-shm"):
        (ledger_home / leftover).unlink(missing_ok=True)
    data = ledger.read_bytes()
    if damage == "truncated":
        ledger.write_bytes(data[: len(data) // 3])
    elif damage == "garbage":
        ledger.write_bytes(os.urandom(len(data)))
    else:
        ledger.write_bytes(b"SQLite format 3\x00" + os.urandom(84) + data[100:])
    before = ledger.read_bytes()
    _one_clear_line(harness(ledger_home, *command), str(ledger))
    assert ledger.read_bytes() == before, "a reader never changes the file"


def test_read_commands_read_a_ledger_on_a_read_only_filesystem(
    tmp_path: Path, project: Path
) -> None:
    with tmpfs(tmp_path / "ro", "8m") as mount:
        home = mount / "home"
        model = _script(tmp_path, [{"text": "hi"}])
        assert harness(home, "run", "--model", model, "--dir", str(project), "hi").returncode == 0
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        listed = harness(home, "sessions", "--json")
        assert listed.returncode == 0, listed.stderr
        (session,) = json.loads(listed.stdout)
        shown = harness(home, "show", session["id"])
        assert shown.returncode == 0 and "hi" in shown.stdout, shown.stderr
        assert harness(home, "trace", session["id"]).returncode == 0
        # A run needs to write: one line naming what it could not write.
        _one_clear_line(
            harness(home, "run", "--model", model, "--dir", str(project), "again"),
            "Read-only file system",
        )


def test_a_home_that_cannot_be_created_is_one_line_for_run(
    tmp_path: Path, project: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    model = _script(tmp_path, [{"text": "hi"}])
    line = _one_clear_line(
        harness(blocker / "home", "run", "--model", model, "--dir", str(project), "hi"),
        "Not a directory",
    )
    assert str(blocker) in line
    assert not (tmp_path / "a-file" / "home").exists()


# --- item 6: a full disk ----------------------------------------------------------------------


def test_a_log_that_cannot_be_written_never_takes_the_session_down(
    tmp_path: Path, project: Path
) -> None:
    home = tmp_path / "home"
    (home / "logs").mkdir(parents=True)
    # The run's log file is /dev/full: every write fails with ENOSPC.
    (home / "logs" / f"run-{time.strftime('%Y%m%d')}.jsonl").symlink_to("/dev/full")
    read = {"tool_calls": [{"name": "read", "arguments": {"path": "notes.txt"}}]}
    model = _script(tmp_path, [read, {"text": "read it"}])
    result = harness(home, "run", "--model", model, "--dir", str(project), "read notes")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "read it"
    assert "Traceback" not in result.stderr
    warnings = [line for line in result.stderr.splitlines() if "log lines" in line]
    assert len(warnings) == 1 and "No space left on device" in warnings[0]


def test_a_full_disk_ends_the_turn_with_disk_full_and_leaves_it_resumable(
    tmp_path: Path, project: Path
) -> None:
    with tmpfs(tmp_path / "small", "3m") as mount:
        home = mount / "home"
        filler = mount / "filler"
        warm = _script(tmp_path, [{"text": "warm"}], "warm.json")
        assert harness(home, "run", "--model", warm, "--dir", str(project), "hi").returncode == 0
        # The turn's own command fills the disk: the writes after it fail.
        fill = f"dd if=/dev/zero of={filler} bs=64k 2>/dev/null; echo filled"
        model = _script(
            tmp_path,
            [
                {"tool_calls": [{"name": "bash", "arguments": {"command": fill}}]},
                {"text": "after the fill"},
                {"text": "went"},
            ],
            "fill.json",
        )
        # The filler sits outside the workspace: only with the sandbox off can dd reach it.
        result = harness(
            home, "run", "--yes", "--sandbox", "off", "--model", model, "--dir", str(project),
            "fill",
        )
        assert result.returncode == 1, result.stderr
        assert "Traceback" not in result.stderr
        errors = [line for line in result.stderr.splitlines() if line.startswith("harness:")]
        assert any("disk full" in line for line in errors), result.stderr
        assert len([line for line in errors if "disk full" in line]) == 1, result.stderr
        filler.unlink()
        ledger = home / "ledger.db"
        check = apsw.Connection(str(ledger))
        assert check.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        claimed = check.execute("SELECT session_id FROM turns").fetchall()
        check.close()
        assert len(claimed) == 1, "the turn is still claimed: it will be resumed"
        # With space again, the next harness resumes it and it finishes.
        resumed = harness(
            home, "run", "--session", claimed[0][0], "--model", model, "--dir", str(project), "go"
        )
        assert resumed.returncode == 0, resumed.stderr
        assert resumed.stdout.strip() == "went"
        check = apsw.Connection(str(ledger))
        assert check.execute("SELECT count(*) FROM turns").fetchall() == [(0,)]
        finished = check.execute(
            "SELECT data FROM events WHERE type = 'turn.finished' AND session_id = ?", claimed[0]
        ).fetchall()
        check.close()
        assert any(json.loads(row[0])["answer"] == "after the fill" for row in finished)
