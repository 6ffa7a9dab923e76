"""File snapshots: what the mutating tools change, kept so a session can be diffed and reverted.

A tool that changes files declares the paths it will modify (``Tool.touched_paths``); no
tree is ever scanned. Before such a call runs, the ToolExecutor reads each of those files
and records its content (or its absence) in the same durable write as the call's
``running`` state; after the call it records what each file became. The contents are
content-addressed blobs in the ledger (``blobs``: sha256 → zlib), so an unchanged file
costs one hash and the next step's "before" is usually the last step's "after", stored
once. ``file_changes`` indexes who changed which path from what to what.

Commands run by ``bash`` are not snapshotted: a shell command does not say what it will
touch, and finding out would mean scanning the tree.

``session_diff`` compares the first recorded content of every path the session changed
with what is on disk now; ``revert`` puts back the content each path had before a
message, refusing — and naming the files — when a file no longer holds what the session
last wrote there.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.messages import ids
from harness.messages.events import NewEvent
from harness.messages.model import PatchFile, PatchPart, RevertAction
from harness.messages.names import on_disk

if TYPE_CHECKING:
    from harness.storage.port import FileChangeRow, LedgerPort

Blob = tuple[str, bytes]  # (sha256 hex, raw content)
# Beyond this many lines on each side of the changed middle, counts are not worth a
# quadratic diff: every line of the middle counts as removed and added.
_DIFF_LINES_LIMIT = 4000


def blob_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_content(path: Path) -> bytes | None:
    """A file's bytes, or None when there is no file there (or it cannot be read)."""
    try:
        return path.read_bytes()
    except OSError:
        return None


def line_counts(before: bytes | None, after: bytes | None) -> tuple[int, int]:
    """(added, removed) lines between two contents, like ``git diff --numstat``.

    The common head and tail are skipped first, so an edit in a long file costs a diff of
    the changed middle only.
    """
    old = before.splitlines(keepends=True) if before else []
    new = after.splitlines(keepends=True) if after else []
    start = 0
    limit = min(len(old), len(new))
    while start < limit and old[start] == new[start]:
        start += 1
    end = 0
    while end < limit - start and old[-1 - end] == new[-1 - end]:
        end += 1
    old_mid = old[start : len(old) - end]
    new_mid = new[start : len(new) - end]
    if not old_mid or not new_mid or max(len(old_mid), len(new_mid)) > _DIFF_LINES_LIMIT:
        return len(new_mid), len(old_mid)
    import difflib  # here: a run loads it only when a file changed (issue 14)

    added = removed = 0
    matcher = difflib.SequenceMatcher(None, old_mid, new_mid, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            removed += i2 - i1
            added += j2 - j1
    return added, removed


def _shown(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


# --- recording a call ----------------------------------------------------------------------


@dataclass(slots=True)
class Touch:
    path: Path
    before: bytes | None
    before_hash: str | None
    after: bytes | None = None
    after_hash: str | None = None
    done: bool = False


@dataclass(slots=True)
class CallSnapshot:
    """The files one tool call declared it will modify: their content before and after."""

    session_id: str
    message_id: str
    call_id: str
    touches: list[Touch] = field(default_factory=list)

    @classmethod
    def capture(
        cls, session_id: str, message_id: str, call_id: str, paths: Iterable[Path]
    ) -> CallSnapshot:
        snapshot = cls(session_id, message_id, call_id)
        for path in dict.fromkeys(paths):
            data = read_content(path)
            snapshot.touches.append(Touch(path, data, None if data is None else blob_hash(data)))
        return snapshot

    def _envelope(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "message_id": self.message_id,
            "call_id": self.call_id,
        }

    def before_event(self) -> tuple[NewEvent, list[Blob]]:
        """The ``file.snapshot`` event and the blobs it names: written before the call runs."""
        files = [{"path": str(t.path), "before": t.before_hash} for t in self.touches]
        blobs = [(t.before_hash, t.before) for t in self.touches if t.before_hash and t.before]
        event = NewEvent("file.snapshot", self.session_id, {**self._envelope(), "files": files})
        return event, blobs

    def after_event(self) -> tuple[NewEvent, list[Blob]]:
        """Read each file again: the ``file.changed`` event and the new blobs."""
        files: list[dict[str, Any]] = []
        blobs: list[Blob] = []
        for touch in self.touches:
            touch.after = read_content(touch.path)
            touch.after_hash = None if touch.after is None else blob_hash(touch.after)
            touch.done = True
            if touch.after_hash is not None and touch.after_hash != touch.before_hash:
                assert touch.after is not None
                blobs.append((touch.after_hash, touch.after))
            files.append(
                {"path": str(touch.path), "before": touch.before_hash, "after": touch.after_hash}
            )
        event = NewEvent("file.changed", self.session_id, {**self._envelope(), "files": files})
        return event, blobs


def patch_part(
    session_id: str, message_id: str, directory: Path, calls: Sequence[CallSnapshot]
) -> PatchPart | None:
    """The ``patch`` part of a step: each file its calls changed, first before to last after."""
    first: dict[Path, Touch] = {}
    last: dict[Path, Touch] = {}
    for call in calls:
        for touch in call.touches:
            if not touch.done:
                continue
            first.setdefault(touch.path, touch)
            last[touch.path] = touch
    root = Path(os.path.realpath(directory))
    files: list[PatchFile] = []
    for path, start in first.items():
        end = last[path]
        if start.before_hash == end.after_hash:
            continue
        added, removed = line_counts(start.before, end.after)
        files.append(
            PatchFile(
                path=_shown(path, root),
                before_hash=start.before_hash,
                after_hash=end.after_hash,
                added=added,
                removed=removed,
            )
        )
    if not files:
        return None
    return PatchPart(id=ids.part_id(), session_id=session_id, message_id=message_id, files=files)


# --- diff and revert -----------------------------------------------------------------------


class SnapshotError(ValueError):
    """A diff or revert the ledger cannot do (unknown message, missing blob); says why."""


class RevertConflict(SnapshotError):
    """Files changed outside the session since it last wrote them: nothing was reverted."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths
        listed = ", ".join(paths)
        super().__init__(
            f"cannot revert: {listed} changed outside the session since the session last "
            "wrote them; nothing was reverted. Undo or save those changes first."
        )


# The API answers it (harness/messages/api.py); declared with the models, so that a run
# never loads the API's request and answer models (25 of them, ~14 ms of start-up).
Action = RevertAction


@dataclass(slots=True, frozen=True)
class FileTarget:
    path: Path
    first: FileChangeRow  # the earliest change in range: its ``before`` is the target
    latest: FileChangeRow  # the latest change of any kind: what the session last wrote


def _since_seq(ledger: LedgerPort, session_id: str, message_id: str | None) -> int:
    if message_id is None:
        return 0
    found = ledger.message_seq(message_id)
    if found is None or found[0] != session_id:
        raise SnapshotError(f"no message {message_id} in session {session_id}")
    return found[1]


def _targets(ledger: LedgerPort, session_ids: Sequence[str], since: int) -> list[FileTarget]:
    rows = ledger.file_changes(session_ids)  # in seq order
    latest: dict[str, FileChangeRow] = {}
    first: dict[str, FileChangeRow] = {}
    for row in rows:
        latest[row.path] = row
        if row.kind == "tool" and row.seq > since:
            first.setdefault(row.path, row)
    # The ledger shows a non-UTF-8 name as \xff: back to the name that opens the file.
    return [FileTarget(Path(on_disk(p)), row, latest[p]) for p, row in first.items()]


def _blob(ledger: LedgerPort, digest: str | None) -> bytes | None:
    if digest is None:
        return None
    data = ledger.blob(digest)
    if data is None:
        raise SnapshotError(f"the ledger has no stored content {digest[:12]}")
    return data


def session_diff(
    ledger: LedgerPort,
    session_ids: Sequence[str],
    directory: Path,
    *,
    since_message: str | None = None,
) -> tuple[str, list[dict[str, Any]]]:
    """A unified diff of every file the session changed: first snapshot → disk now."""
    root = Path(os.path.realpath(directory))
    since = _since_seq(ledger, session_ids[0], since_message)
    out: list[str] = []
    files: list[dict[str, Any]] = []
    for target in sorted(_targets(ledger, session_ids, since), key=lambda t: str(t.path)):
        before = _blob(ledger, target.first.before)
        now = read_content(target.path)
        if before == now:
            continue
        name = _shown(target.path, root)
        added, removed = line_counts(before, now)
        files.append({"path": name, "added": added, "removed": removed})
        out.extend(_unified(before, now, name))
    return "".join(out), files


def _unified(before: bytes | None, after: bytes | None, name: str) -> list[str]:
    old_name = f"a/{name}" if before is not None else "/dev/null"
    new_name = f"b/{name}" if after is not None else "/dev/null"
    try:
        old = before.decode("utf-8") if before else ""
        new = after.decode("utf-8") if after else ""
    except UnicodeDecodeError:
        return [f"--- {old_name}\n", f"+++ {new_name}\n", f"Binary files {name} differ\n"]
    import difflib

    lines = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        fromfile=old_name,
        tofile=new_name,
    )
    return [
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines
    ]


@dataclass(slots=True)
class RevertResult:
    id: str
    session_id: str
    message_id: str
    files: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "session_id": self.session_id,
            "message_id": self.message_id,
            "files": self.files,
        }


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.urandom(4).hex()}.revert-tmp")
    try:
        temp.write_bytes(data)
        with contextlib.suppress(OSError):
            os.chmod(temp, path.stat().st_mode & 0o7777)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def revert_files(
    ledger: LedgerPort,
    session_ids: Sequence[str],
    directory: Path,
    message_id: str,
) -> tuple[RevertResult, NewEvent, list[Blob]]:
    """Put every file changed at or after ``message_id`` back as it was before it.

    Synchronous (no checkpoint between the check and the writes). Returns the result and
    the ``session.reverted`` event to record, with the blobs of what the files held.
    Raises RevertConflict, naming the files, when a file no longer holds what the session
    last wrote there (an interrupted call's file is taken as it is).
    """
    session_id = session_ids[0]
    since = _since_seq(ledger, session_id, message_id)
    root = Path(os.path.realpath(directory))
    targets = sorted(_targets(ledger, session_ids, since), key=lambda t: str(t.path))
    current: dict[Path, bytes | None] = {}
    conflicts: list[str] = []
    for target in targets:
        data = read_content(target.path)
        current[target.path] = data
        latest = target.latest
        if not latest.done:
            continue
        digest = None if data is None else blob_hash(data)
        if digest != latest.after:
            conflicts.append(_shown(target.path, root))
    if conflicts:
        raise RevertConflict(conflicts)
    wanted = {t.path: _blob(ledger, t.first.before) for t in targets}  # all found, or raise

    files: list[dict[str, Any]] = []
    blobs: list[Blob] = []
    for target in targets:
        path = target.path
        now = current[path]
        want = wanted[path]
        now_hash = None if now is None else blob_hash(now)
        want_hash = target.first.before
        action: Action
        if now == want:
            action = "unchanged"
        elif want is None:
            path.unlink(missing_ok=True)
            action = "deleted"
        else:
            _write_atomically(path, want)
            action = "recreated" if now is None else "restored"
        if now is not None and now_hash is not None:
            blobs.append((now_hash, now))
        files.append(
            {
                "path": str(path),
                "shown": _shown(path, root),
                "action": action,
                "before": now_hash,
                "after": want_hash,
            }
        )
    result = RevertResult(ids.new_id("rev"), session_id, message_id, files)
    event = NewEvent(
        "session.reverted",
        session_id,
        {**result.to_dict(), "time": time.time()},
    )
    return result, event, blobs


class SessionBusy(SnapshotError):
    """A turn is running or queued: the workspace is still changing."""


def session_family(ledger: LedgerPort, session_id: str) -> list[str]:
    """The session and its child sessions (a ``task`` child edits the same workspace)."""
    family = [session_id]
    for parent in family:
        family.extend(child.id for child in ledger.children(parent))
    return family


def diff_session(
    ledger: LedgerPort, session_id: str, *, since_message: str | None = None
) -> tuple[str, list[dict[str, Any]]]:
    session = ledger.session(session_id)
    if session is None:
        raise SnapshotError(f"no session {session_id}")
    family = session_family(ledger, session_id)
    return session_diff(ledger, family, Path(session.directory), since_message=since_message)


async def revert_session(ledger: LedgerPort, session_id: str, message_id: str) -> RevertResult:
    """Revert the workspace to before ``message_id`` and record it (``session.reverted``)."""
    session = ledger.session(session_id)
    if session is None:
        raise SnapshotError(f"no session {session_id}")
    if (
        session.status in ("busy", "retry")
        or ledger.claimed_turns(session_id)
        or ledger.inbox(session_id)
    ):
        raise SessionBusy(
            f"session {session_id} is busy (a turn is running or queued); wait for it to "
            "finish or cancel it, then revert"
        )
    family = session_family(ledger, session_id)
    result, event, blobs = revert_files(ledger, family, Path(session.directory), message_id)
    await ledger.write([event], blobs=blobs)
    return result
