"""The event envelope and the event types.

Every state change is an event. A durable event is appended to the ledger's ``events``
table with a ``seq`` and applied to the projections in the same transaction; subscribers
hear of it only after the commit. An ephemeral event (streaming deltas, live status) has
``seq = None`` and is published without being stored.

The envelope is a slotted dataclass rather than a pydantic model: a step publishes a
handful of events and this keeps the hot path free of validation we do not need (the
payloads were validated when their models were built).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

from pydantic import BaseModel

# Every event type, in three groups. A new type goes in exactly one of them; a projected
# one also needs its entry in storage/projections.py's PROJECTIONS, and
# tests/test_event_types.py fails until the two name the same types.

# durable: each one is applied to a projection table (see storage/projections.py)
ProjectedType = Literal[
    "session.created",
    "session.updated",
    "session.deleted",
    "session.reverted",
    "file.snapshot",
    "file.changed",
    "message.created",
    "message.updated",
    "part.created",
    "part.updated",
    "inbox.added",
    "inbox.taken",
    "approval.added",
    "turn.started",
    "turn.resumed",
    "turn.finished",
    "todo.updated",
]

# durable, log only: the record of why things happened
LoggedType = Literal[
    "permission.asked",
    "permission.replied",
    "permission.decided",
    "question.asked",
    "question.replied",
    "question.rejected",
    "sandbox.unavailable",  # a turn's commands run unsandboxed: {requested, reason, notice}
    # MCP servers (DESIGN §12), each {server, ...}: a stdio server's process group, recorded
    # before its first message so a restart after a crash reaps it {process, pid}; ready
    # {transport, pid, tools, schema_tokens, seconds}; a start that failed, an exit
    # {reason, process, code}; a tool left out {tool, reason}.
    "mcp.process",
    "mcp.started",
    "mcp.failed",
    "mcp.exited",
    "mcp.warning",
    "skill.invalid",  # a SKILL.md a turn skipped: {file, reason}
    # A shared ledger's session changed hands (DESIGN §14): {session_id, owner, epoch, from}
    "session.leased",
    # A cancel of the session's running turn sent through a daemon that does not run it
    # (DESIGN §14): the holder cancels the turn when its feed reads this. {by}
    "cancel.requested",
]

# ephemeral: published live, never stored
EphemeralType = Literal[
    "part.delta",
    "session.retry",
    "feed.overflow",
    "step.request",
]

EventType = Literal[ProjectedType, LoggedType, EphemeralType]


_Class = TypeVar("_Class", bound=type)


def slot_init(cls: _Class) -> _Class:
    """``cls``, a frozen slotted dataclass, with an ``__init__`` that fills each slot
    through its descriptor: the same signature and defaults as the one ``dataclass``
    writes, which sets each field with ``object.__setattr__(self, name, value)`` (its
    way round the frozen class's own ``__setattr__``) and so looks each name up on the
    class again. A ``WriteEvents`` is made in ~0.7 µs instead of ~1.1, an ``Event`` in
    ~0.4 instead of ~0.7; a step makes ~25 such envelopes (issue 14: ~1.4 % of a wire
    step's instructions). Written as ``dataclass`` writes its own, from the fields."""
    fields = dataclasses.fields(cls)
    if "__post_init__" in vars(cls) or any(
        f.default_factory is not dataclasses.MISSING or not f.init or f.kw_only for f in fields
    ):
        raise TypeError(f"slot_init: {cls.__name__} has fields it does not handle")
    namespace: dict[str, Any] = {}
    params: list[str] = []
    lines: list[str] = []
    for field in fields:
        name = field.name
        namespace[f"_set_{name}"] = getattr(cls, name).__set__
        if field.default is dataclasses.MISSING:
            params.append(name)
        else:
            namespace[f"_default_{name}"] = field.default
            params.append(f"{name}=_default_{name}")
        lines.append(f"    _set_{name}(self, {name})")
    exec(f"def __init__(self, {', '.join(params)}):\n" + "\n".join(lines), namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__annotations__ = vars(cls)["__init__"].__annotations__
    setattr(cls, "__init__", init)  # noqa: B010 (a class's method, set as dataclass sets it)
    return cls


@slot_init
@dataclass(slots=True, frozen=True)
class NewEvent:
    """An event not yet committed: the writer gives it a ``seq`` and a timestamp."""

    type: EventType
    session_id: str
    data: dict[str, Any]

    @classmethod
    def of(cls, kind: EventType, session_id: str, model: BaseModel) -> NewEvent:
        """The event that records ``model`` (a session, message, part…) as JSON."""
        # ``model.model_dump(mode="json")`` without its Python frame: a step records ~9.
        return cls(kind, session_id, model.__pydantic_serializer__.to_python(model, mode="json"))


@slot_init
@dataclass(slots=True, frozen=True)
class Event:
    seq: int | None
    ts: float
    type: EventType
    session_id: str
    data: dict[str, Any]

    @property
    def durable(self) -> bool:
        return self.seq is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "ts": self.ts,
            "type": self.type,
            "session_id": self.session_id,
            "data": self.data,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)


# Why a turn ended: the run's stop reason (DESIGN §1, rule 3).
StopReason = Literal[
    "answered", "max_steps", "doom_loop", "budget", "overflow", "denied", "error", "cancelled"
]


@dataclass(slots=True, frozen=True)
class TurnResult:
    """How a turn ended: what ``Harness.run`` answers and ``turn.finished`` records."""

    message_id: str  # the user message that started the turn
    reason: StopReason
    answer: str = ""
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "message_id": self.message_id,
            "reason": self.reason,
            "answer": self.answer,
            "error": self.error,
        }


_T = TypeVar("_T")


class EventLike(Protocol):
    """An ``Event``, or the client's ``WireEvent``: what the turn helpers and the chat read."""

    @property
    def type(self) -> str: ...
    @property
    def session_id(self) -> str: ...
    @property
    def data(self) -> dict[str, Any]: ...


def finished_turn(
    event: EventLike, *, message_id: str | None = None, session_id: str | None = None
) -> TurnResult | None:
    """The result when ``event`` is a ``turn.finished``, else None.

    With ``message_id``: only the turn that message started; with ``session_id``: only a
    turn of that session (a subscription also carries its child sessions' events).
    """
    if event.type != "turn.finished":
        return None
    data = event.data
    if message_id is not None and data.get("message_id") != message_id:
        return None
    if session_id is not None and event.session_id != session_id:
        return None
    return TurnResult(data["message_id"], data["reason"], data.get("answer", ""), data.get("error"))


def with_queued(first: _T, events: AsyncIterable[_T]) -> Iterator[_T]:
    """``first``, then the items already queued behind it when ``events`` is a memory
    channel, taken without a trip through the scheduler each (``receive_nowait``): a step
    publishes a dozen events or more, and each ``async for`` round was one. A closed
    channel just ends this; the caller's ``async for`` then ends on its next round."""
    import trio

    yield first
    if not isinstance(events, trio.MemoryReceiveChannel):
        return
    while True:
        try:
            yield events.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel):
            return


async def wait_turn_finished(
    events: AsyncIterable[EventLike],
    *,
    message_id: str | None = None,
    session_id: str | None = None,
) -> TurnResult | None:
    """Read ``events`` until a turn finishes (see ``finished_turn``); None if they end first."""
    async for first in events:
        for event in with_queued(first, events):
            if event.type != "turn.finished":  # most: no call to find out
                continue
            result = finished_turn(event, message_id=message_id, session_id=session_id)
            if result is not None:
                return result
    return None
