"""Values that start-up derives deterministically, kept per machine (issue 14).

Some of what a ``harness run`` computes before its first request is the same in every
run on a machine: the JSON schemas of the built-in tools' parameters (pydantic builds
each model and walks it: ~17 ms) and the frame of a Mistral request around its
messages (the SDK's ``ChatCompletionStreamRequest`` and the 23 modules of models its
fields pull in, guardrails and connectors included: ~25 ms and ~1 MB). Each is kept
here under a key that names everything it was derived from (the inputs themselves, the
versions of the libraries, and the size and modification time of the source files
involved), so that a changed input, a library upgrade or an edited source is a
different key and the value is derived again; a value found is the one that derivation
gave, on this machine, for exactly that key.

Like ``harness.generated_code``, this is for the command line only (``harness.cli``
turns it on, through ``harness.lean_imports``): a program that embeds harness derives
everything afresh, as before. One JSON file per kind of value, in
``$XDG_CACHE_HOME/harness`` (``~/.cache/harness``): read on the first look-up, written
again at exit when something was added (atomically, 0600, in a 0700 directory). A file
that is not this user's own, that others may write, or that does not parse is ignored,
and so is an entry of the wrong shape (each caller checks what it gets); a file that
cannot be written is not an error.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
from pathlib import Path
from typing import Any

# What one file keeps at most (its JSON text): every look-up reads the whole file, and a
# request frame holds every tool's schema (~10 kB). Past it, the oldest entries go.
MAX_BYTES = 256 * 1024
_FORMAT = 1

_enabled = False
_files: dict[str, _File] = {}


def enable() -> None:
    """Look values up and keep new ones (idempotent): the command line's start-up."""
    global _enabled
    if not _enabled:
        _enabled = True
        atexit.register(save)


def disable() -> None:
    """Back to deriving everything (tests); what was added is not saved."""
    global _enabled
    _enabled = False
    _files.clear()


def enabled() -> bool:
    return _enabled


def directory() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "harness"


def lookup(kind: str, key: str) -> Any:
    """The value kept for ``key``, or None (not enabled, not found, no readable file)."""
    if not _enabled:
        return None
    return _file(kind).entries.get(key)


def store(kind: str, key: str, value: Any) -> None:
    """Keep ``value`` (JSON) for ``key``; written at exit. A no-op when not enabled."""
    if not _enabled:
        return
    try:
        # A copy of its own: what the caller does with ``value`` later is not kept.
        kept = json.loads(json.dumps(value))
    except (TypeError, ValueError, RecursionError):
        return  # not JSON: derived again next time
    cache = _file(kind)
    cache.entries[key] = kept
    cache.added[key] = kept


def save() -> None:
    """Add each file's new entries to what it holds now (run at exit)."""
    for kind, cache in list(_files.items()):
        if cache.added and cache.path is not None:
            added, cache.added = cache.added, {}
            _write(cache.path, _read(cache.path) | added, kind)


class _File:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.entries: dict[str, Any] = {} if path is None else _read(path)
        self.added: dict[str, Any] = {}  # only these are written: not what was read


def _file(kind: str) -> _File:
    cache = _files.get(kind)
    if cache is None:
        try:
            path: Path | None = directory() / f"{kind}.json"
        except (RuntimeError, KeyError):  # no home directory: nowhere to keep anything
            path = None
        cache = _files[kind] = _File(path)
    return cache


def _read(path: Path) -> dict[str, Any]:
    """The file's entries; empty when it is missing, not ours, or not one of ours."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return {}
    try:
        info = os.fstat(fd)
        # What it holds shapes the requests: only a file of this user's no one else writes.
        if info.st_uid != os.getuid() or info.st_mode & 0o022 or info.st_size > 16 << 20:
            return {}
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = json.loads(handle.read())
    except (OSError, ValueError, RecursionError):
        return {}
    finally:
        os.close(fd)
    if not isinstance(data, dict) or data.get("format") != _FORMAT:
        return {}
    entries = data.get("entries")
    return entries if isinstance(entries, dict) else {}


def _write(path: Path, entries: dict[str, Any], kind: str) -> None:
    from harness.private import open_private, private_dir

    temporary = path.with_name(f".{kind}.{os.getpid()}.json")
    try:
        entries = _newest(entries, MAX_BYTES)
        private_dir(path.parent)
        with open_private(temporary, "w", encoding="utf-8") as out:
            json.dump({"format": _FORMAT, "entries": entries}, out, separators=(",", ":"))
        os.replace(temporary, path)
    except (OSError, ValueError, TypeError):
        with contextlib.suppress(OSError):
            temporary.unlink()


def _newest(entries: dict[str, Any], budget: int) -> dict[str, Any]:
    """The latest entries whose JSON fits in ``budget`` bytes (later ones are newer)."""
    kept: list[tuple[str, Any]] = []
    for key, value in reversed(entries.items()):
        budget -= len(key) + len(json.dumps(value, separators=(",", ":"))) + 4
        if budget < 0:
            break
        kept.append((key, value))
    return dict(reversed(kept))


def source_stamp(*files: str | None) -> list[object] | None:
    """Each file's path, size and modification time; None if one has no file to stat."""
    stamp: list[object] = []
    for name in files:
        if not name:
            return None
        try:
            info = os.stat(name)
        except OSError:
            return None
        stamp.append([name, info.st_size, info.st_mtime_ns])
    return stamp
