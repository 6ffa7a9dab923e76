"""File names that are not UTF-8, carried end to end.

The filesystem's names are bytes. Python hands a name that is not UTF-8 over as a ``str``
holding lone surrogates (``surrogateescape``: byte 0xff becomes ``"\\udcff"``), which opens,
stats and walks the very file again, but which SQLite, JSON and a terminal cannot hold.
So a name keeps that form on the filesystem side, and is written with each such byte as
``\\xff`` (``backslashreplace``) wherever it becomes text: tool results, the ledger, events,
the API. A model that sends the name back as it saw it (``bad\\xffname.txt``) gets the
file: ``on_disk`` turns those escapes back into bytes when the literal name does not exist.
"""

from __future__ import annotations

import re
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPED_BYTE = re.compile(r"\\x([89a-fA-F][0-9a-fA-F])")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # a byte that surrogateescape carried
        return f"\\x{code - 0xDC00:02x}"
    return f"\\u{code:04x}"  # any other lone surrogate (from a model's JSON, say)


def shown(text: str) -> str:
    """``text`` as it may leave the process: no lone surrogate left."""
    # isascii() reads a flag the string already holds; the search scans every character
    # (~30 instructions each: a tool's whole output, twice a step).
    if text.isascii() or _SURROGATE.search(text) is None:
        return text
    return _SURROGATE.sub(_escape, text)


def shown_data(data: Any) -> Any:
    """The same, through the strings (keys included) of JSON-shaped data."""
    if isinstance(data, str):
        return shown(data)
    if isinstance(data, dict):
        return {shown_data(k): shown_data(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [shown_data(v) for v in data]
    return data


def on_disk(text: str) -> str:
    """A name as shown, back in the form that opens the file (``\\xff`` → the byte)."""
    return _ESCAPED_BYTE.sub(lambda m: chr(0xDC00 + int(m.group(1), 16)), text)
