"""Ids: a prefix, 14 hex digits of time and counter, 14 base62 characters (messages/ids.py)."""

from __future__ import annotations

import re
from collections import Counter

from harness.messages import ids


def test_ids_have_their_shape_sort_in_creation_order_and_use_the_whole_alphabet() -> None:
    made = [ids.part_id() for _ in range(5_000)]
    assert all(re.fullmatch(r"prt_[0-9a-f]{14}[0-9A-Za-z]{14}", i) for i in made)
    assert made == sorted(made) and len(set(made)) == len(made)
    # The random part maps each byte to _ALPHABET[byte % 62]: every character turns up.
    seen = Counter("".join(i[-14:] for i in made))
    assert set(seen) == set(ids._ALPHABET)
    assert ids.message_id().startswith("msg_") and ids.call_id().startswith("cal_")
