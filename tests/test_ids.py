"""Ids: a prefix, 14 hex digits of time and counter, 14 base62 characters (messages/ids.py)."""

from __future__ import annotations

import os
import re
from collections import Counter
from typing import Any

from harness.messages import ids


def test_ids_have_their_shape_sort_in_creation_order_and_use_the_whole_alphabet() -> None:
    made = [ids.part_id() for _ in range(5_000)]
    assert all(re.fullmatch(r"prt_[0-9a-f]{14}[0-9A-Za-z]{14}", i) for i in made)
    assert made == sorted(made) and len(set(made)) == len(made)
    # The random part maps each byte to _ALPHABET[byte % 62]: every character turns up.
    seen = Counter("".join(i[-14:] for i in made))
    assert set(seen) == set(ids._ALPHABET)
    assert ids.message_id().startswith("msg_") and ids.call_id().startswith("cal_")


def test_one_read_of_the_systems_randomness_serves_many_ids(monkeypatch: Any) -> None:
    # On the event loop each read is a system call (the GIL goes to a worker thread).
    reads: list[int] = []
    real = ids.secrets.token_bytes

    def counted(size: int) -> bytes:
        reads.append(size)
        return real(size)

    monkeypatch.setattr(ids.secrets, "token_bytes", counted)
    made = [ids.part_id() for _ in range(640)]
    assert len(set(made)) == 640 and made == sorted(made)
    assert len(reads) <= 11  # 64 ids a read (one per id before)


def test_a_forked_child_does_not_reuse_its_parents_random_characters() -> None:
    ids.part_id()  # the parent's pool holds characters it has not used yet
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, to the parent
        os.close(read)
        os.write(write, ids.part_id()[-14:].encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert ids.part_id()[-14:] != child
