"""File snapshots, patch parts, diff and revert, through the real loop.

A real harness with the scripted provider runs write, edit and apply_patch on a real
temporary project; assertions read the files on disk, the ledger and the API answers.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from harness import server
from harness.client import ApiError, Client
from harness.config import Config
from harness.messages.model import AssistantMessage, PatchPart, Rule, UserMessage
from harness.providers.scripted import ScriptedProvider
from harness.runtime import Harness, open_harness
from harness.snapshots import RevertConflict, SessionBusy, SnapshotError, line_counts

ALLOW_EDIT = [Rule(permission="edit", pattern="*", action="allow")]


@dataclass
class Loop:
    h: Harness
    sid: str

    async def user_messages(self) -> list[str]:
        return [m.info.id for m in await self.h.messages(self.sid) if m.info.role == "user"]

    async def patches(self) -> dict[int, PatchPart]:
        """The patch part of each step, by step number."""
        found: dict[int, PatchPart] = {}
        for message in await self.h.messages(self.sid):
            if isinstance(message.info, AssistantMessage):
                patches = [p for p in message.parts if isinstance(p, PatchPart)]
                assert len(patches) <= 1
                if patches:
                    assert message.parts[-1] is patches[0], "the patch part ends the step"
                    found[message.info.step] = patches[0]
        return found


@asynccontextmanager
async def open_loop(
    tmp_path: Path, project: Path, turns: list[dict[str, Any]], **config: Any
) -> AsyncIterator[Loop]:
    provider = ScriptedProvider.from_turns(turns)
    config.setdefault("rules", ALLOW_EDIT)
    cfg = Config(
        home=tmp_path / "home",
        model=f"scripted:{tmp_path / 'unused.json'}",
        provider_factory=lambda model: provider,
        interactive=False,
        **config,
    )
    async with open_harness(cfg) as h:
        session = await h.create_session(project)
        yield Loop(h, session.id)


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


PATCH = """*** Begin Patch
*** Update File: src/app.py
@@ def main():
-    return 1
+    value = 2
+    return value
*** Add File: docs/new.md
+# New
+second line
*** Delete File: old.txt
*** Update File: rename_me.txt
*** Move to: renamed.txt
@@
-keep
+kept
*** End Patch"""


@pytest.fixture
def workspace(project: Path) -> Path:
    (project / "src").mkdir()
    (project / "src" / "app.py").write_text("def main():\n    return 1\n")
    (project / "old.txt").write_text("to be deleted\nby the patch\n")
    (project / "rename_me.txt").write_text("keep\n")
    (project / "config.ini").write_text("[main]\nname = demo\n")
    return project


def tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): p.read_text()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "home" not in p.parts
    }


def first_turn() -> list[dict[str, Any]]:
    return [
        {"tool_calls": [call("apply_patch", patch=PATCH)]},
        {
            "tool_calls": [
                call("write", path="config.ini", content="[main]\nname = changed\nextra = 1\n"),
                call("edit", path="notes.txt", old_string="line one", new_string="line 1"),
                call("write", path="fresh.txt", content="brand new\n"),
            ]
        },
        {"tool_calls": [call("read", path="notes.txt")]},
        {"text": "done"},
    ]


async def test_patch_parts_list_each_changed_file_with_line_counts(
    tmp_path: Path, workspace: Path
) -> None:
    async with open_loop(tmp_path, workspace, first_turn()) as lp:
        assert (await lp.h.run(lp.sid, "change things")).reason == "answered"
        patches = await lp.patches()
        assert sorted(patches) == [1, 2], "read-only and text steps have no patch part"
        one = {f.path: f for f in patches[1].files}
        assert {p: (f.added, f.removed) for p, f in one.items()} == {
            "src/app.py": (2, 1),
            "docs/new.md": (2, 0),
            "old.txt": (0, 2),
            "rename_me.txt": (0, 1),
            "renamed.txt": (1, 0),
        }
        assert one["docs/new.md"].before_hash is None and one["docs/new.md"].after_hash
        assert one["old.txt"].after_hash is None and one["old.txt"].before_hash
        two = {f.path: (f.added, f.removed) for f in patches[2].files}
        assert two == {"config.ini": (2, 1), "notes.txt": (1, 1), "fresh.txt": (1, 0)}
        # The ledger's record: one row per file per call, each finished.
        rows = lp.h.ledger.file_changes([lp.sid])
        assert len(rows) == 8 and all(r.done and r.kind == "tool" for r in rows)


async def test_revert_restores_edited_created_and_deleted_files(
    tmp_path: Path, workspace: Path
) -> None:
    original = tree(workspace)
    async with open_loop(tmp_path, workspace, first_turn()) as lp:
        await lp.h.run(lp.sid, "change things")
        changed = tree(workspace)
        assert changed["renamed.txt"] == "kept\n" and "old.txt" not in changed
        [turn] = await lp.user_messages()
        result = await lp.h.revert(lp.sid, turn)
        assert tree(workspace) == original
        actions = {f["shown"]: f["action"] for f in result.files}
        assert actions == {
            "config.ini": "restored",
            "docs/new.md": "deleted",
            "fresh.txt": "deleted",
            "notes.txt": "restored",
            "old.txt": "recreated",
            "rename_me.txt": "recreated",
            "renamed.txt": "deleted",
            "src/app.py": "restored",
        }
        # The transcript's record of it: an event naming the target and every file.
        [event] = [
            e
            for e in lp.h.ledger.events_after(0, session_ids=[lp.sid])
            if e.type == "session.reverted"
        ]
        assert event.data["message_id"] == turn and len(event.data["files"]) == 8
        # Nothing left to show, and a second revert finds everything as it should be.
        assert (await lp.h.diff(lp.sid))[0] == ""
        again = await lp.h.revert(lp.sid, turn)
        assert {f["action"] for f in again.files} == {"unchanged"}


async def test_revert_to_a_later_message_keeps_what_came_before(
    tmp_path: Path, project: Path
) -> None:
    turns = [
        {"tool_calls": [call("write", path="a.txt", content="one\n")]},
        {"text": "wrote"},
        {"tool_calls": [call("edit", path="a.txt", old_string="one", new_string="two")]},
        {"tool_calls": [call("write", path="b.txt", content="bee\n")]},
        {"text": "edited"},
    ]
    async with open_loop(tmp_path, project, turns) as lp:
        await lp.h.run(lp.sid, "write a")
        await lp.h.run(lp.sid, "edit a, write b")
        first, second = await lp.user_messages()
        assert (project / "a.txt").read_text() == "two\n"
        # The second step of the second turn: only b.txt goes back.
        steps = [m.info for m in await lp.h.messages(lp.sid) if m.info.role == "assistant"]
        result = await lp.h.revert(lp.sid, steps[3].id)
        assert [f["shown"] for f in result.files] == ["b.txt"]
        assert (project / "a.txt").read_text() == "two\n" and not (project / "b.txt").exists()
        await lp.h.revert(lp.sid, second)
        assert (project / "a.txt").read_text() == "one\n"
        await lp.h.revert(lp.sid, first)
        assert not (project / "a.txt").exists()


async def test_revert_refuses_after_an_outside_change_and_names_the_file(
    tmp_path: Path, project: Path
) -> None:
    turns = [
        {
            "tool_calls": [
                call("write", path="a.txt", content="session\n"),
                call("edit", path="notes.txt", old_string="line one", new_string="line 1"),
            ]
        },
        {"text": "ok"},
    ]
    async with open_loop(tmp_path, project, turns) as lp:
        await lp.h.run(lp.sid, "write")
        [turn] = await lp.user_messages()
        (project / "a.txt").write_text("the user's own edit\n")
        with pytest.raises(RevertConflict) as caught:
            await lp.h.revert(lp.sid, turn)
        assert caught.value.paths == ["a.txt"]
        assert "a.txt" in str(caught.value) and "notes.txt" not in str(caught.value)
        # Nothing was written: not even the file that could have been reverted.
        assert (project / "notes.txt").read_text().startswith("line 1")
        assert (project / "a.txt").read_text() == "the user's own edit\n"
        # A file deleted outside the session is a change too.
        (project / "a.txt").write_text("session\n")
        (project / "notes.txt").unlink()
        with pytest.raises(RevertConflict, match=r"notes\.txt"):
            await lp.h.revert(lp.sid, turn)


async def test_diff_shows_everything_the_session_changed(tmp_path: Path, workspace: Path) -> None:
    async with open_loop(tmp_path, workspace, first_turn()) as lp:
        await lp.h.run(lp.sid, "change things")
        text, files = await lp.h.diff(lp.sid)
        assert "--- a/src/app.py\n+++ b/src/app.py\n" in text
        assert "-    return 1\n+    value = 2\n+    return value\n" in text
        assert "--- /dev/null\n+++ b/docs/new.md\n" in text and "+# New\n" in text
        assert "--- a/old.txt\n+++ /dev/null\n" in text and "-to be deleted\n" in text
        assert "-line one\n+line 1\n" in text
        assert {f["path"]: (f["added"], f["removed"]) for f in files}["config.ini"] == (2, 1)
        # An edit made since, by anyone, is part of "now".
        (workspace / "fresh.txt").write_text("brand new\nand more\n")
        assert "+and more\n" in (await lp.h.diff(lp.sid))[0]
        # --since: the second step only.
        steps = [m.info for m in await lp.h.messages(lp.sid) if m.info.role == "assistant"]
        since, _ = await lp.h.diff(lp.sid, since_message=steps[1].id)
        assert "src/app.py" not in since and "config.ini" in since


async def test_bad_requests_are_clear_errors(tmp_path: Path, project: Path) -> None:
    async with open_loop(tmp_path, project, [{"text": "hi"}]) as lp:
        await lp.h.run(lp.sid, "hello")
        with pytest.raises(SnapshotError, match="no message msg_nope in session"):
            await lp.h.revert(lp.sid, "msg_nope")
        with pytest.raises(SnapshotError, match="no message"):
            await lp.h.diff(lp.sid, since_message="msg_nope")
        assert await lp.h.diff(lp.sid) == ("", [])


async def test_revert_refuses_while_the_session_is_busy(tmp_path: Path, project: Path) -> None:
    turns = [
        {"tool_calls": [call("write", path="a.txt", content="x\n")]},
        {"tool_calls": [call("bash", command="sleep 5")]},
        {"text": "never"},
    ]
    rules = [*ALLOW_EDIT, Rule(permission="bash", pattern="*", action="allow")]
    async with (
        open_loop(tmp_path, project, turns, rules=rules) as lp,
        lp.h.subscribe(lp.sid) as events,
    ):
        turn = await lp.h.prompt(lp.sid, "go")
        with trio.fail_after(5):
            async for event in events:
                if event.type == "part.updated" and event.data.get("tool") == "bash":
                    break
        with pytest.raises(SessionBusy, match="busy"):
            await lp.h.revert(lp.sid, turn)
        assert (project / "a.txt").exists()
        assert await lp.h.cancel(lp.sid)


def test_line_counts_match_a_real_diff() -> None:
    assert line_counts(None, b"a\nb\n") == (2, 0)
    assert line_counts(b"a\nb\n", None) == (0, 2)
    assert line_counts(b"a\nb\nc\n", b"a\nB\nc\nd\n") == (2, 1)
    assert line_counts(b"same\n", b"same\n") == (0, 0)
    big = b"".join(b"line %d\n" % i for i in range(100_000))
    assert line_counts(big, big.replace(b"line 500\n", b"changed\n")) == (1, 1)


# --- the daemon and the command line ------------------------------------------------------


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hs", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_api_diff_and_revert_routes(
    tmp_path: Path, project: Path, socket_dir: Path, nursery: trio.Nursery
) -> None:
    config = Config(home=tmp_path / "home", log_file=tmp_path / "daemon.jsonl")
    h, path = await nursery.start(server.serve, config, socket_dir / "d.sock")
    client = Client(path)

    async def api(name: str, *args: Any) -> Any:
        return await trio.to_thread.run_sync(partial(getattr(client, name), *args))

    script = tmp_path / "script.json"
    script.write_text(
        json.dumps([{"tool_calls": [call("write", path="a.txt", content="x\n")]}, {"text": "ok"}])
    )
    rules = [r.model_dump() for r in ALLOW_EDIT]
    session = await trio.to_thread.run_sync(
        partial(
            client.create_session,
            directory=str(project),
            model=f"scripted:{script}",
            permission=rules,
        )
    )
    sid = session["id"]
    assert (await h.run(sid, "write a")).reason == "answered"
    [user] = [m.info.id for m in await h.messages(sid) if isinstance(m.info, UserMessage)]

    answer = await api("diff", sid)
    assert answer["files"] == [{"path": "a.txt", "added": 1, "removed": 0}]
    assert "+++ b/a.txt" in answer["diff"]

    with pytest.raises(ApiError) as refused:
        await api("revert", sid, "msg_unknown")
    assert refused.value.status == 422 and "no message" in refused.value.message
    with pytest.raises(ApiError) as missing:
        await api("revert", "ses_nope", user)
    assert missing.value.status == 404
    with pytest.raises(ApiError) as bad_body:
        await trio.to_thread.run_sync(
            partial(client.request, "POST", f"/v1/sessions/{sid}/revert", {"message": 1})
        )
    assert bad_body.value.status == 422 and "message_id" in bad_body.value.message

    (project / "a.txt").write_text("outside\n")
    with pytest.raises(ApiError) as conflict:
        await api("revert", sid, user)
    assert conflict.value.status == 409 and "a.txt" in conflict.value.message
    (project / "a.txt").write_text("x\n")

    result = await api("revert", sid, user)
    assert [(f["shown"], f["action"]) for f in result["files"]] == [("a.txt", "deleted")]
    assert not (project / "a.txt").exists()
    assert (await api("diff", sid))["diff"] == ""


def test_cli_diff_and_revert_without_a_daemon(tmp_path: Path, project: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            [
                {"tool_calls": [call("edit", path="notes.txt", old_string="one", new_string="1")]},
                {"text": "ok"},
            ]
        )
    )
    env = {
        **os.environ,
        "HARNESS_HOME": str(tmp_path / "home"),
        "HARNESS_SOCKET": str(tmp_path / "none.sock"),
    }

    def harness(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "harness", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            cwd=project,
        )

    ran = harness("run", "--model", f"scripted:{script}", "--allow", "edit", "--json", "go")
    assert ran.returncode == 0, ran.stderr
    sid = json.loads(ran.stdout.splitlines()[0])["session_id"]
    shown = harness("diff", sid)
    assert shown.returncode == 0 and "-line one\n+line 1\n" in shown.stdout
    user = next(
        json.loads(line)["data"]["id"]
        for line in ran.stdout.splitlines()
        if json.loads(line)["type"] == "message.created"
        and json.loads(line)["data"]["role"] == "user"
    )
    unknown = harness("revert", sid, "--to", "msg_nope")
    assert unknown.returncode == 2 and "no message msg_nope" in unknown.stderr
    assert "Traceback" not in unknown.stderr
    reverted = harness("revert", sid, "--to", user)
    assert reverted.returncode == 0, reverted.stderr
    assert "restored  notes.txt" in reverted.stdout
    assert (project / "notes.txt").read_text() == "line one\nmarker-7f3a line two\n"
