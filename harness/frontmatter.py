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

import re
from pathlib import Path
from typing import Any

_FENCE = "---"
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
# Plain scalars PyYAML might read as something other than a string: booleans of YAML 1.1,
# nulls, numbers of any kind, timestamps, the merge key and the value indicator.
_SPECIAL = re.compile(
    r"(?i:y|n|yes|no|true|false|on|off|null|~)$|[-+.0-9]|<<|=",
)
_INDICATORS = set("-?:,[]{}#&*!|>'\"%@`")
_DECIMAL = re.compile(r"(?:0|[1-9][0-9]*)$")
# PyYAML's booleans (YAML 1.1, resolver.py), exactly these spellings.
_BOOLEANS = {
    spelling: value
    for words, value in (("yes true on", True), ("no false off", False))
    for word in words.split()
    for spelling in (word, word.capitalize(), word.upper())
}
# What PyYAML's reader accepts (yaml/reader.py, NON_PRINTABLE), minus the characters it
# counts as line breaks (NEL, LS, PS) and the tab: text with anything else is PyYAML's.
_PRINTABLE = re.compile(
    "[\n\r\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]*"
)


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


def _fast(head: str) -> dict[str, Any] | None:
    """The subset of YAML read without PyYAML: ``key: value`` lines, and ``key:`` followed
    by more-indented lines (block mappings, nested to any depth, siblings aligned).
    None: not sure, let PyYAML read it."""
    if not _PRINTABLE.fullmatch(head):
        return None
    data: dict[str, Any] = {}
    stack: list[tuple[int, dict[str, Any]]] = [(0, data)]  # (indent, mapping), innermost last
    opened: int | None = None  # the indent of a ``key:`` whose mapping has no line yet
    for line in head.split("\n"):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        if "\t" in line or line.lstrip().startswith("#"):
            return None
        body = line.lstrip(" ")
        indent = len(line) - len(body)
        item = _pair(body)
        if item is None:
            return None
        key, value = item
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


_OPEN = object()  # ``key:`` opening a nested mapping


def _pair(text: str) -> tuple[str, Any] | None:
    key_text, colon, rest = _split_key(text)
    if not colon:
        return None
    key = _scalar(key_text, key=True)
    if not isinstance(key, str):
        return None
    if not rest.strip():
        return key, _OPEN
    if not rest.startswith(" "):
        return None
    value = _scalar(rest.strip(), key=False)
    return None if value is None else (key, value)


def _split_key(text: str) -> tuple[str, str, str]:
    if text[:1] in ("'", '"'):
        quote = text[0]
        end = text.find(quote, 1)
        if end < 0:
            return "", "", ""
        if text[end + 1 : end + 2] != ":":
            return "", "", ""
        return text[: end + 1], ":", text[end + 2 :]
    key, colon, rest = text.partition(":")
    return key, colon, rest


def _scalar(text: str, *, key: bool) -> Any:
    """A scalar the fast path is sure of, else None."""
    if not text:
        return None
    if text[0] == "'":
        inner = text[1:-1]
        if len(text) < 2 or text[-1] != "'" or "'" in inner:
            return None
        return inner
    if text[0] == '"':
        inner = text[1:-1]
        if len(text) < 2 or text[-1] != '"' or '"' in inner or "\\" in inner:
            return None
        return inner
    if key:
        return text if _KEY.fullmatch(text) and not _SPECIAL.match(text) else None
    if _DECIMAL.match(text):
        return int(text)
    if text in _BOOLEANS:
        return _BOOLEANS[text]
    if text[0] in _INDICATORS or _SPECIAL.match(text):
        return None
    if ": " in text or " #" in text or text.endswith(":") or text != text.strip():
        return None
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in text):
        return None
    return text
