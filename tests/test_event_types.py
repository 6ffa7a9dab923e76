"""Every event type is registered once: its group, and a projection when it has one.

``EventType`` is the union of three literals in messages/events.py; a projected type is
half-registered when it has no entry in storage/projections.py (the writer would store it
and change nothing), and an entry for a log-only or ephemeral type would change tables
that type was never meant to touch.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import get_args

import pytest
import trio

from harness.client import WireEvent
from harness.messages.events import (
    EphemeralType,
    Event,
    EventType,
    LoggedType,
    NewEvent,
    ProjectedType,
    TurnResult,
    finished_turn,
    slot_init,
    wait_turn_finished,
)
from harness.messages.mailbox import Publish, WriteEvents
from harness.storage.projections import PROJECTIONS

GROUPS = {"projected": ProjectedType, "logged": LoggedType, "ephemeral": EphemeralType}


def test_every_event_type_is_in_exactly_one_group() -> None:
    names = [name for group in GROUPS.values() for name in get_args(group)]
    assert len(names) == len(set(names)), "a type is listed in two groups"
    assert set(names) == set(get_args(EventType))


def test_projected_types_and_the_projection_table_are_the_same_set() -> None:
    projected = set(get_args(ProjectedType))
    assert projected - set(PROJECTIONS) == set(), "a projected type has no projection"
    assert set(PROJECTIONS) - projected == set(), "a projection for a type not projected"


def _finished(message_id: str, session_id: str = "ses_1") -> Event:
    result = TurnResult(message_id, "answered", "done")
    return Event(7, 1.0, "turn.finished", session_id, result.to_dict())


def test_finished_turn_picks_the_turn_asked_for() -> None:
    event = _finished("msg_a")
    assert finished_turn(event, message_id="msg_a") == TurnResult("msg_a", "answered", "done")
    assert finished_turn(event, message_id="msg_b") is None
    assert finished_turn(event, session_id="ses_1") == TurnResult("msg_a", "answered", "done")
    assert finished_turn(event, session_id="ses_child") is None
    started = Event(6, 1.0, "turn.started", "ses_1", {"message_id": "msg_a"})
    assert finished_turn(started, message_id="msg_a") is None


def test_finished_turn_reads_a_wire_event_too() -> None:
    data = TurnResult("msg_a", "error", "", "boom").to_dict()
    wire = WireEvent(9, 1.0, "turn.finished", "ses_1", data, raw="{}")
    assert finished_turn(wire, message_id="msg_a") == TurnResult("msg_a", "error", "", "boom")


def test_wait_turn_finished_reads_until_the_turn_ends_or_the_events_do() -> None:
    async def events(*items: Event) -> AsyncIterator[Event]:
        for item in items:
            yield item

    async def main() -> None:
        stream = events(_finished("msg_other"), _finished("msg_a"), _finished("msg_late"))
        found = await wait_turn_finished(stream, message_id="msg_a")
        assert found == TurnResult("msg_a", "answered", "done")
        assert await wait_turn_finished(events(_finished("msg_other")), message_id="msg_a") is None

    trio.run(main)


def test_envelopes_made_by_slot_init_are_made_as_dataclass_makes_them() -> None:
    """``slot_init`` swaps only how an envelope's slots are filled: the same signature,
    defaults and values as the ``__init__`` that ``dataclass`` writes, still frozen; a
    class it cannot make that way is refused."""

    @dataclass(slots=True, frozen=True)
    class Plain:
        a: int
        b: str = "b"
        c: tuple[int, ...] = ()

    @slot_init
    @dataclass(slots=True, frozen=True)
    class Fast:
        a: int
        b: str = "b"
        c: tuple[int, ...] = ()

    assert inspect.signature(Fast.__init__) == inspect.signature(Plain.__init__)
    for args, kwargs in [((1,), {}), ((1, "x"), {"c": (2,)}), ((), {"a": 3, "c": (4,)})]:
        made, plain = Fast(*args, **kwargs), Plain(*args, **kwargs)
        assert (made.a, made.b, made.c) == (plain.a, plain.b, plain.c)
    with pytest.raises(TypeError):
        Fast()
    with pytest.raises(dataclasses.FrozenInstanceError):
        Fast(1).a = 2  # type: ignore[misc]
    for envelope in (Event, NewEvent, WriteEvents, Publish):
        assert envelope.__init__.__qualname__ == f"{envelope.__qualname__}.__init__"
    event = Event(1, 2.0, "part.updated", "ses_a", {"id": "prt_a"})
    assert dataclasses.replace(event, seq=2) == Event(2, 2.0, "part.updated", "ses_a", event.data)

    @dataclass(slots=True, frozen=True)
    class Listed:
        items: list[int] = dataclasses.field(default_factory=list)

    with pytest.raises(TypeError):
        slot_init(Listed)
