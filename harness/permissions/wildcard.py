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
    # Most rules name their permission plainly (``read``, ``bash``) or are ``*``, and
    # every need is checked against every rule: those two answered without a regex.
    if pattern == "*":
        return True
    if "*" not in pattern and "?" not in pattern:
        return pattern == text
    return _compile(pattern).fullmatch(text) is not None


def _variants(pattern: str) -> tuple[str, ...]:
    return (pattern[:-2], pattern) if pattern.endswith(" *") else (pattern,)


def _globs_intersect(a: str, b: str) -> bool:
    """Whether some text matches both wildcard patterns (a walk over their product)."""
    seen: set[tuple[int, int]] = set()
    stack = [(0, 0)]
    while stack:
        state = stack.pop()
        if state in seen:
            continue
        seen.add(state)
        i, j = state
        if i == len(a) and j == len(b):
            return True
        if i < len(a) and a[i] == "*":
            stack.append((i + 1, j))  # the star matches nothing more
        if j < len(b) and b[j] == "*":
            stack.append((i, j + 1))
        if i < len(a) and j < len(b):
            x, y = a[i], b[j]
            if x in "*?" or y in "*?" or x == y:  # both can take the same next character
                stack.append((i if x == "*" else i + 1, j if y == "*" else j + 1))
    return False


def could_match(pattern: str, covers: str) -> bool:
    """Whether ``pattern`` matches some text that ``covers`` also matches.

    ``covers`` stands for every value a subject might have (``rm*`` for ``rm $F``); a deny
    rule that matches any of them must apply to the subject.
    """
    return any(_globs_intersect(a, b) for a in _variants(pattern) for b in _variants(covers))
