"""Wildcard patterns for permission rules (DESIGN §8).

``*`` matches any run of characters (``/`` included), ``?`` exactly one, everything else is
literal, and the whole text must match. A pattern ending in ``" *"`` also matches the text
without that tail, so the stored "always" rule ``git status *`` covers a bare ``git status``.
"""

from __future__ import annotations

import re
from functools import lru_cache


@lru_cache(maxsize=2048)
def _compile(pattern: str) -> re.Pattern[str]:
    head, tail = (pattern[:-2], "(?: .*)?") if pattern.endswith(" *") else (pattern, "")
    regex = _translate(head) + tail
    # DOTALL: commands and heredoc bodies can span lines, and `*` must cover them.
    return re.compile(regex, re.DOTALL)


def _translate(pattern: str) -> str:
    return "".join(".*" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in pattern)


def match(pattern: str, text: str) -> bool:
    """Whether ``text`` matches the wildcard ``pattern`` as a whole."""
    return _compile(pattern).fullmatch(text) is not None
