"""The name the model sees for a server's tool, which is also its permission (DESIGN §12).

``NAME_tool``, reduced to ``[A-Za-z0-9_-]`` (what every provider accepts in a function
name) and at most 64 characters. A longer name keeps its head and ends with a short hash
of the full name, so two long names that share a head stay apart and a name is the same
on every run (rules and "always" approvals are stored by it).
"""

from __future__ import annotations

import hashlib
import re

MAX_NAME = 64
_HASH = 8
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def tool_name(server: str, tool: str) -> str:
    full = f"{server}_{tool}"
    safe = _UNSAFE.sub("_", full)
    if len(safe) <= MAX_NAME:
        # Two names reduced to the same one (``a.b``, ``a_b``) are told apart by the
        # client, which keeps the first and skips the other with a warning.
        return safe
    digest = hashlib.sha256(full.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH]
    return f"{safe[: MAX_NAME - _HASH - 1]}_{digest}"
