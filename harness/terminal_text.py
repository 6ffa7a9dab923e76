"""Text the model, a tool, a file, an MCP server or a session's title put in, made safe to
print on a terminal: the one place that knows which characters a terminal obeys.

A terminal takes some characters as orders, not text: ESC starts sequences that clear or
retitle it, move the cursor (to overwrite an ask prompt, so ``rm -rf ~`` reads ``ls``), set
the clipboard (OSC 52) or plant a hyperlink (OSC 8); ``\\r`` and backspace overwrite what
was printed; the C1 range (0x80-0x9f) holds one-character forms of the same (0x9b is a
CSI); and the bidi overrides and isolates (U+202A-U+202E, U+2066-U+2069, "Trojan Source")
reorder what is shown. Every one is shown as visible text instead (``^[``, ``^M``,
``<U+202E>``), so what is printed is what was sent. ``--json`` output needs none of this:
JSON escapes the C0 controls itself, and a program, not a terminal, reads it.

Only ``re`` is imported: ``harness --help`` imports the command modules that use this.
"""

from __future__ import annotations

import re
from typing import Any

_BIDI = "\u202a-\u202e\u2066-\u2069"
# Multi-line text keeps its newlines and tabs; everything else of C0, DEL and C1 is shown.
_IN_TEXT = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}]")
# A one-line field (a title, a tool name, the command an ask is about) shows them too:
# a newline there could print a fake prompt line under the real one.
_IN_LINE = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI}]")


def _shown(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x20:
        return f"^{chr(code + 64)}"  # caret notation: ESC is ^[, CR is ^M
    if code == 0x7F:
        return "^?"
    if code <= 0x9F:
        return "\ufffd"  # C1: no caret form; a replacement mark shows something was there
    return f"<U+{code:04X}>"


def printable(text: str, *, one_line: bool = False) -> str:
    """``text`` with every character a terminal would obey shown as text instead.

    ``one_line``: newlines and tabs are shown too (``^J``, ``^I``), for a field printed
    inside a line. The search before the substitution keeps the common clean case (a
    streamed delta of plain prose) to one regex scan and no copy.
    """
    pattern = _IN_LINE if one_line else _IN_TEXT
    return pattern.sub(_shown, text) if pattern.search(text) else text


def printable_data(value: Any) -> Any:
    """``printable`` over a JSON-like value: every string in it, however deep (keys too)."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {
            printable(key) if isinstance(key, str) else key: printable_data(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [printable_data(item) for item in value]
    return value
