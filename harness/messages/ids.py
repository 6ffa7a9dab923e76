"""Sortable, prefixed identifiers: ``ses_…``, ``msg_…``, ``prt_…``, ``per_…``, ``que_…``,
``cal_…``.

An id is the prefix, 14 hex digits of (milliseconds << 12 | counter) and 14 random
base62 characters. Ids made by one process sort in creation order even within one
millisecond, which is what lets the ledger order parts and messages by id alone.
"""

from __future__ import annotations

import secrets
import threading
import time

_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# Each byte value's character (``_ALPHABET[byte % 62]``), for ``bytes.translate``: a step
# makes several ids, and a generator over the bytes cost most of each one.
_BASE62 = bytes(ord(_ALPHABET[byte % 62]) for byte in range(256))
_lock = threading.Lock()
_last = 0


def _monotonic_stamp() -> int:
    global _last
    with _lock:
        stamp = int(time.time() * 1000) << 12
        _last = stamp if stamp > _last else _last + 1
        return _last


def new_id(prefix: str) -> str:
    stamp = _monotonic_stamp()
    # One read of the system's randomness per id (a modulo bias of 256 % 62 is harmless:
    # the random part only needs to keep ids made in the same millisecond apart).
    rand = secrets.token_bytes(14).translate(_BASE62).decode("ascii")
    return f"{prefix}_{stamp:014x}{rand}"


def session_id() -> str:
    return new_id("ses")


def message_id() -> str:
    return new_id("msg")


def part_id() -> str:
    return new_id("prt")


def permission_id() -> str:
    return new_id("per")


def question_id() -> str:
    return new_id("que")


def call_id() -> str:
    return new_id("cal")
