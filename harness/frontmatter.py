"""YAML front matter of Markdown files: agent files and ``SKILL.md`` (DESIGN §12).

PyYAML's ``safe_load`` is the parser (no tags that build objects). Importing it costs
15-25 ms, more than the whole budget discovery has at launch, and nearly every front
matter is a few ``key: value`` lines; so a fast path reads that subset itself, and hands
anything else to PyYAML unchanged. The fast path only accepts text whose meaning it is
sure of (plain words, quoted strings without escapes, decimal integers, block mappings);
for all of it ``yaml.safe_load`` gives the same value (tests/test_frontmatter.py checks
that against PyYAML), and where it is unsure it declines rather than guesses.
"""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path
from typing import Any

_FENCE = "---"
# Plain scalars PyYAML might read as something other than a string: booleans of YAML 1.1,
# nulls, numbers of any kind, timestamps, the merge key and the value indicator.
_SPECIAL_WORDS = frozenset(["y", "n", "yes", "no", "true", "false", "on", "off", "null", "~"])
_SPECIAL_START = re.compile(r"[-+.0-9]|<<|=")


def _special(text: str) -> bool:
    return text.lower() in _SPECIAL_WORDS or _SPECIAL_START.match(text) is not None
_INDICATORS = set("-?:,[]{}#&*!|>'\"%@`")
_DECIMAL = re.compile(r"(?:0|[1-9][0-9]*)$")
# PyYAML's booleans (YAML 1.1, resolver.py), exactly these spellings.
_BOOLEANS = {
    spelling: value
    for words, value in (("yes true on", True), ("no false off", False))
    for word in words.split()
    for spelling in (word, word.capitalize(), word.upper())
}


class FrontMatterError(ValueError):
    """The front matter cannot be read; the message says why (without the file's name)."""


def split(text: str) -> tuple[str | None, str]:
    """The front matter (None when the file has none) and the body after it."""
    if not text.startswith(_FENCE):
        return None, text
    lines = text.split("\n")
    if lines[0].rstrip() != _FENCE:
        return None, text
    for index in range(1, len(lines)):
        if lines[index].rstrip() in (_FENCE, "..."):
            return "\n".join(lines[1:index]), "\n".join(lines[index + 1 :])
    raise FrontMatterError("the front matter opened with '---' is never closed")


def parse(text: str) -> tuple[dict[str, Any], str]:
    """The front matter as a mapping ({} when absent) and the body."""
    head, body = split(text.removeprefix("\ufeff"))
    if head is None:
        return {}, body
    data = _fast(head)
    if data is None:
        data = _yaml(head)
    return data, body


def read(path: Path) -> tuple[dict[str, Any], str]:
    """``parse`` of a file; ``FrontMatterError`` when it cannot be read or parsed."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise FrontMatterError("not UTF-8 text") from None
    except OSError as error:
        raise FrontMatterError(f"cannot be read: {error.strerror or error}") from None
    return parse(text)


# --- parsed files, kept by file version ---------------------------------------------------
#
# Kept in this process (a daemon re-reads only what changed), and on disk when a harness
# names a store (``use_store``: ``$HARNESS_HOME/cache/front-matter.json``), so a new
# ``harness run`` in a repository with dozens of agents and skills reads one small JSON file
# instead of parsing each of them again. An entry is keyed by the file's absolute path and
# valid only for the same (mtime, ctime, size, inode); errors are kept too, so a broken
# file does not import PyYAML at every launch. The store is a cache: any problem with it
# is ignored and the files are parsed.

_STORE_VERSION = 1
_STORE_LIMIT = 4000  # entries; the oldest go first
_BODY_LIMIT = 64_000  # characters of body kept; a longer one is read again when needed
_parsed: dict[str, list[Any]] = {}  # path → [signature, data | None, body | None, error | None]
_store: Path | None = None
_store_loaded = False
_dirty = False
_writing = threading.Lock()  # a turn's skill discovery runs in a worker thread


def use_store(path: Path | None) -> None:
    """Keep parsed front matter in ``path`` across processes (None: in memory only)."""
    global _store, _store_loaded
    if path != _store:
        _store, _store_loaded = path, False


def _signature(info: os.stat_result) -> list[int]:
    return [info.st_mtime_ns, info.st_ctime_ns, info.st_size, info.st_ino]


def _load_store() -> None:
    global _store_loaded
    _store_loaded = True
    if _store is None:
        return
    try:
        with _store.open("rb") as handle:
            saved = json.load(handle)
    except (OSError, ValueError):
        return
    if isinstance(saved, dict) and saved.get("version") == _STORE_VERSION:
        entries = saved.get("entries")
        if isinstance(entries, dict):
            for path, entry in entries.items():
                if isinstance(entry, list) and len(entry) == 4:
                    _parsed.setdefault(path, entry)


def flush() -> None:
    """Write the store if this process parsed something new (atomically, 0600)."""
    global _dirty
    if not _dirty or _store is None:
        return
    from harness.private import open_private, private_dir

    with _writing:
        _dirty = False
        entries = dict(list(_parsed.items())[-_STORE_LIMIT:])
        temporary = _store.with_name(f".{_store.name}.{os.getpid()}")
        try:
            private_dir(_store.parent)
            data = {"version": _STORE_VERSION, "entries": entries}
            text = json.dumps(data, ensure_ascii=False)
            with open_private(temporary, "w", encoding="utf-8") as out:
                out.write(text)
            os.replace(temporary, _store)
        except (OSError, ValueError):
            temporary.unlink(missing_ok=True)


def read_cached(
    path: Path, info: os.stat_result, *, body: bool = True
) -> tuple[dict[str, Any], str]:
    """``read`` of a file whose stat is ``info``, from the cache when the file has not
    changed. ``body=False``: the body may come back empty (only the front matter is
    wanted, as for a skill's listing)."""
    global _dirty
    if not _store_loaded:
        _load_store()
    key = str(path)
    signature = _signature(info)
    entry = _parsed.get(key)
    if entry is not None and entry[0] == signature:
        if entry[3] is not None:
            raise FrontMatterError(entry[3])
        if entry[2] is not None or not body:
            return dict(entry[1]), entry[2] or ""
    try:
        data, text = read(path)
    except FrontMatterError as error:
        _parsed[key] = [signature, None, None, str(error)]
        _dirty = True
        raise
    kept = text if len(text) <= _BODY_LIMIT else None
    if _plain(data):
        _parsed.pop(key, None)  # re-inserted last: the newest entries are kept
        _parsed[key] = [signature, data, kept, None]
        _dirty = True
    return data, text


def _plain(value: Any) -> bool:
    """Whether JSON gives ``value`` back unchanged (PyYAML may return dates, sets, int
    keys, NaN): only such front matter is stored."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain(item) for item in value)
    if isinstance(value, float):
        return value == value and value not in (float("inf"), float("-inf"))
    return value is None or isinstance(value, str | int)


def _yaml(head: str) -> dict[str, Any]:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        data = yaml.load(head, Loader=loader)  # a safe loader: no tags that build objects
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" (line {mark.line + 2})" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise FrontMatterError(f"front matter is not valid YAML{where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise FrontMatterError("front matter is not a mapping of keys to values")
    return data


# One line of a block mapping: indent, a key (plain, 'single' or "double" quoted without
# escapes), the colon, and the rest (None: nothing, so the key opens a nested mapping).
_LINE = re.compile(
    r"""( *)(?:([A-Za-z_][A-Za-z0-9_-]*)|'([^']*)'|"([^"\\]*)"):(?: +(.*?))? *"""
)
_OPEN = object()  # ``key:`` opening a nested mapping


def _fast(head: str) -> dict[str, Any] | None:
    """The subset of YAML read without PyYAML: ``key: value`` lines, and ``key:`` followed
    by more-indented lines (block mappings, nested to any depth, siblings aligned).
    None: not sure, let PyYAML read it."""
    data: dict[str, Any] = {}
    stack: list[tuple[int, dict[str, Any]]] = [(0, data)]  # (indent, mapping), innermost last
    opened: int | None = None  # the indent of a ``key:`` whose mapping has no line yet
    for line in head.split("\n"):
        line = line.removesuffix("\r")
        # str.isprintable is stricter than PyYAML's reader (it refuses tabs, controls,
        # NEL and the other line breaks, surrogates, BOMs, even a no-break space): text
        # with any of those is PyYAML's to read.
        if not line.isprintable():
            return None
        if not line or line.isspace():
            continue
        found = _LINE.fullmatch(line)
        if found is None:
            return None  # a comment, a list, a flow collection, a block scalar, ...
        lead, plain, single, double, rest = found.groups()
        if plain is not None:
            if _special(plain):
                return None  # ``on:`` is the key True in YAML 1.1
            key = plain
        else:
            key = single if single is not None else double
        value: Any = _OPEN if not rest else _value(rest)
        if value is None:
            return None
        indent = len(lead)
        if opened is not None:
            if indent <= opened:
                return None  # ``key:`` with nothing under it is null: PyYAML's to say
            stack[-1] = (indent, stack[-1][1])
            opened = None
        else:
            while len(stack) > 1 and indent < stack[-1][0]:
                stack.pop()
            if indent != stack[-1][0]:
                return None
        mapping = stack[-1][1]
        if key in mapping:
            return None
        if value is _OPEN:
            child: dict[str, Any] = {}
            mapping[key] = child
            stack.append((-1, child))  # its indent is set by its first line
            opened = indent
        else:
            mapping[key] = value
    return None if opened is not None else data


def _value(text: str) -> Any:
    """A value the fast path is sure of, else None."""
    first = text[0]
    if first == "'":
        inner = text[1:-1]
        if len(text) < 2 or text[-1] != "'" or "'" in inner:
            return None
        return inner
    if first == '"':
        inner = text[1:-1]
        if len(text) < 2 or text[-1] != '"' or '"' in inner or "\\" in inner:
            return None
        return inner
    if _DECIMAL.match(text):
        return int(text)
    if text in _BOOLEANS:
        return _BOOLEANS[text]
    if first in _INDICATORS or _special(text):
        return None
    if ": " in text or " #" in text or text[-1] == ":":
        return None
    return text
