"""Sortable, prefixed identifiers: ``ses_…``, ``msg_…``, ``prt_…``, ``per_…``, ``que_…``,
``cal_…``.

An id is the prefix, 14 hex digits of (milliseconds << 12 | counter) and 14 random
base62 characters. Ids made by one process sort in creation order even within one
millisecond, which is what lets the ledger order parts and messages by id alone.
"""

from __future__ import annotations

import os
import secrets
import threading
import time

_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# Each byte value's character (``_ALPHABET[byte % 62]``), for ``bytes.translate``: a step
# makes several ids, and a generator over the bytes cost most of each one.
_BASE62 = bytes(ord(_ALPHABET[byte % 62]) for byte in range(256))
_RANDOM = 14  # random characters an id
# Ids whose random parts one read of the system's randomness gives: a read is a system
# call, and on the daemon's event loop every system call lets a worker thread take the
# GIL (a turn's start makes four ids, a step two or three).
_BATCH = 64
_lock = threading.Lock()
_last = 0
_pool = b""  # random characters read and not used yet


def _forget_pool() -> None:
    # A forked child must not hand out the characters its parent also will.
    global _pool
    _pool = b""


os.register_at_fork(after_in_child=_forget_pool)


def new_id(prefix: str) -> str:
    global _last, _pool
    with _lock:
        stamp = int(time.time() * 1000) << 12
        _last = stamp = stamp if stamp > _last else _last + 1
        if len(_pool) < _RANDOM:
            # A modulo bias of 256 % 62 is harmless: the random part only needs to keep
            # ids made in the same millisecond (by other processes) apart.
            _pool = secrets.token_bytes(_RANDOM * _BATCH).translate(_BASE62)
        rand, _pool = _pool[:_RANDOM], _pool[_RANDOM:]
    return f"{prefix}_{stamp:014x}{rand.decode('ascii')}"


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
