"""A multi-row INSERT as one array a column: a short statement whatever the row count.

A commit's rows (its events, and its upserts of sessions, messages and parts) went as
``INSERT … VALUES (…), (…), …``, whose text grew with the rows and differed with each
batch size: PostgreSQL parsed, analysed and planned every row's expressions, every time.
Sent as ``INSERT … SELECT … FROM unnest('{…}'::text[], …)``, it plans one short
statement and reads each column as one literal: the server's CPU an event row went from
10.0 to 5.8–6.8 µs (a 250-row batch of step events, 200 batches, the backend's CPU from
/proc), and at saturation a batch is most of what PostgreSQL does a step (issue 18). A
small batch (a daemon with little to do commits each step alone) stays ``VALUES``.

The seqs of a commit in one round trip are offsets from the base its head reads under the
append lock (``SeqOffset``): a column of offsets adds that base once, in SQL. A
column that mixes offsets with plain numbers, or holds a value of a type not rendered
here, leaves the rows to ``VALUES``, as does a connection whose string literals do not
take backslashes as they are (``standard_conforming_strings`` off) or whose client
encoding is not UTF-8, and text that ``VALUES`` would refuse (a NUL, a lone surrogate),
so that it is refused with the same error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Final

# Below this many rows VALUES costs the server less: the arrays' statement has a fixed
# cost of its own (~50 µs against a one-row VALUES's ~65 µs), each row ~4 µs less
# (measured one statement a transaction, 1 to 81 event rows: even at ~12 rows).
ARRAYS_FROM_ROWS: Final = 16
# The base a commit's seq offsets add to, read once per statement (the head sets it).
_BASE: Final = "(SELECT CAST(current_setting('harness.base') AS BIGINT) AS b) AS base"


class SeqOffset(int):
    """A seq of a commit in one round trip, as its offset in the commit (1 for the first
    event): rendered as SQL that adds it to the ``max(seq)`` read under the append lock
    (postgres.py, ``_BEGIN_IN_ONE``)."""

    __slots__ = ()


def _text_element(value: str) -> str:
    # Inside an array literal's double quotes only a backslash and a double quote are
    # special; the quotes keep commas, braces, spaces and the word NULL as text.
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _float_element(value: float) -> str:
    if math.isfinite(value):
        return repr(value)  # the shortest text that reads back as the same double
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def _column(values: Sequence[Any]) -> tuple[str, str, bool] | None:
    """One column as (its array literal's text, its element type, whether its values are
    offsets from the commit's base); None if it cannot be an array here."""
    kinds = {type(value) for value in values}
    kinds.discard(type(None))
    if not kinds or kinds == {str}:
        items = ["NULL" if value is None else _text_element(value) for value in values]
        return "{" + ",".join(items) + "}", "text", False
    if None in values:
        return None  # only text columns are nullable in the ledger's schema
    if kinds == {SeqOffset} or kinds == {int}:
        return "{" + ",".join(map(str, map(int, values))) + "}", "bigint", SeqOffset in kinds
    if kinds == {float}:
        return "{" + ",".join(map(_float_element, values)) + "}", "float8", False
    return None  # bool, bytes, mixed kinds, offsets beside plain numbers


def unnest_insert(sql: str, rows: Sequence[tuple[Any, ...]]) -> bytes | None:
    """``sql`` (``INSERT INTO t(cols) VALUES (?, …)`` and an optional ``ON CONFLICT``
    tail) for ``rows``, as ``INSERT … SELECT … FROM unnest(…)``, ready to send; None to
    leave it to ``VALUES``."""
    if len(rows) < ARRAYS_FROM_ROWS:
        return None
    head, _, rest = sql.partition(" VALUES (")
    tail = rest.partition(")")[2]
    width = len(rows[0])
    columns = []
    for index in range(width):
        column = _column([row[index] for row in rows])
        if column is None:
            return None
        columns.append(column)
    names = [f"c{index}" for index in range(width)]
    selected = [
        f"base.b + u.{name}" if relative else f"u.{name}"
        for name, (_, _, relative) in zip(names, columns, strict=True)
    ]
    arrays = ["'" + text.replace("'", "''") + f"'::{kind}[]" for text, kind, _ in columns]
    source = f"unnest({', '.join(arrays)}) AS u({', '.join(names)})"
    if any(relative for _, _, relative in columns):
        source += f", {_BASE}"
    query = f"{head} SELECT {', '.join(selected)} FROM {source}{tail}"
    if "\x00" in query:
        return None  # libpq would cut the query there: VALUES refuses it cleanly
    try:
        return query.encode()
    except UnicodeEncodeError:
        return None  # a lone surrogate: VALUES fails on it as it always did
