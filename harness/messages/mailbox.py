"""Every message an actor receives, declared once.

Actors talk only through Trio memory channels. A request that needs an answer carries a
one-shot reply channel (the ``ask`` pattern): the asker creates a channel of size 1,
sends the request, and awaits the single answer, so a cancel of the asker simply drops
the answer on the floor instead of leaving anybody blocked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import trio

from harness.messages.events import Event, NewEvent, StopReason, slot_init
from harness.messages.model import Rule
from harness.messages.permission import (
    PermissionDecision,
    PermissionNeed,
    PermissionRequest,
    Reply,
)
from harness.messages.question import Answers, QuestionInfo, QuestionOutcome, QuestionRequest

Request = TypeVar("Request")
Answer = TypeVar("Answer")


async def ask(
    mailbox: trio.MemorySendChannel[Request],
    request: Callable[[trio.MemorySendChannel[Answer]], Request],
) -> Answer:
    """Send ``request(reply)`` to an actor and wait for its one answer on ``reply``.

    A cancelled asker sends nothing, as with ``await mailbox.send``; but a mailbox with
    room takes the request without the trip through the scheduler that ``send`` makes
    (the wait for the answer is one anyway): a step asks two or three actors.
    """
    reply_send, reply_receive = trio.open_memory_channel[Answer](1)
    await trio.lowlevel.checkpoint_if_cancelled()
    message = request(reply_send)
    try:
        mailbox.send_nowait(message)
    except trio.WouldBlock:
        await mailbox.send(message)
    return await reply_receive.receive()


# --- ledger writer -------------------------------------------------------------------------


@slot_init  # made on every step: see events.py
@dataclass(slots=True, frozen=True)
class WriteEvents:
    """Append events and apply them in one transaction.

    With a ``reply`` channel the caller hears of the commit (or the exception that
    prevented it); without one the write is fire-and-forget, still ordered with every
    other write of the same writer.
    """

    events: Sequence[NewEvent]
    reply: trio.MemorySendChannel[list[Event] | Exception] | None = None
    # File contents the events name, (sha256 hex, bytes): stored in the same transaction.
    blobs: Sequence[tuple[str, bytes]] = ()
    # The lease the writing session actor holds, (session_id, epoch): a shared ledger
    # refuses the write once another daemon has taken the session (DESIGN §14).
    fence: tuple[str, int] | None = None
    # With ``fence``: give that lease back in the same transaction (a turn's last write
    # with nothing queued), instead of a transaction of its own (issue 18).
    release: bool = False
    # A post's bound on how long it may wait for company, when it is not the writer's
    # ``post_delay`` (``LedgerPort.post``).
    within: float | None = None
    # A session that must exist for the write to be made, checked in its transaction: a
    # prompt's look-up, without a read of its own before it (issue 18). Refused as a
    # whole (``LedgerMissing``) if the session does not exist, or no longer does.
    exists: str | None = None
    # With ``exists`` (a prompt): take that session's lease for this daemon in the same
    # transaction, if no daemon holds it, and read what its actor reads once it holds
    # it (``LedgerPort.take_claim_reads``): no claim of its own (issue 18).
    claim: bool = False


# --- event feed ----------------------------------------------------------------------------


@slot_init  # made on every step: see events.py
@dataclass(slots=True, frozen=True)
class Publish:
    events: Sequence[Event]
    # Live events relayed from the daemon that runs their session (a shared ledger,
    # DESIGN §14): fanned out here, never relayed on again.
    remote: bool = False


@dataclass(slots=True, frozen=True)
class Subscription:
    id: int
    events: trio.MemoryReceiveChannel[Event]


@dataclass(slots=True, frozen=True)
class Subscribe:
    """Hear every event published from now on (of one session and its children, or all)."""

    session_id: str | None
    reply: trio.MemorySendChannel[Subscription]
    buffer: int = 4096


@dataclass(slots=True, frozen=True)
class Unsubscribe:
    subscription_id: int


@dataclass(slots=True, frozen=True)
class RegisterChild:
    """Tell the feed that events of ``child_id`` also belong to ``parent_id``'s tree."""

    parent_id: str
    child_id: str


FeedMessage = Publish | Subscribe | Unsubscribe | RegisterChild


# --- permission ----------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class AskPermission:
    session_id: str
    message_id: str
    call_id: str
    tool: str
    need: PermissionNeed
    # The session's merged ruleset first, then each ancestor's: the strictest answer wins.
    layers: Sequence[Sequence[Rule]]
    project: str  # the scope of "always" approvals: the session's directory
    reply: trio.MemorySendChannel[PermissionDecision]


@dataclass(slots=True, frozen=True)
class ReplyPermission:
    request_id: str
    reply: Reply
    message: str | None
    done: trio.MemorySendChannel[bool]  # False when no such request is pending
    no_terminal: bool = False  # rejected because nobody could be asked
    # Given through another daemon of a shared ledger, whose permission.replied event is
    # in the ledger already (DESIGN §14): only the decision is left to record.
    remote: bool = False


@dataclass(slots=True, frozen=True)
class ListPending:
    session_id: str | None
    reply: trio.MemorySendChannel[list[PermissionRequest]]


@dataclass(slots=True, frozen=True)
class ClearSession:
    """Reject every pending ask of a session (it was cancelled)."""

    session_id: str


PermissionMessage = AskPermission | ReplyPermission | ListPending | ClearSession


# --- questions -----------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class AskQuestion:
    """Ask the user; the single answer is a ``QuestionOutcome``.

    The asker makes the id, so that it can withdraw the question if it is cancelled first.
    """

    request_id: str
    session_id: str
    message_id: str
    call_id: str
    questions: Sequence[QuestionInfo]
    reply: trio.MemorySendChannel[QuestionOutcome]


@dataclass(slots=True, frozen=True)
class AnswerQuestion:
    """The user's answers (one list per question), or a rejection when ``answers`` is None.

    ``done`` hears None when accepted, else why not: ``"not_found"`` or a message saying
    why the answers do not fit the questions.
    """

    request_id: str
    answers: Answers | None
    message: str | None
    done: trio.MemorySendChannel[str | None]
    # Given through another daemon of a shared ledger, whose question.replied (or
    # question.rejected) event is in the ledger already (DESIGN §14): only the asker is
    # left to tell.
    remote: bool = False


@dataclass(slots=True, frozen=True)
class ListQuestions:
    session_id: str | None
    reply: trio.MemorySendChannel[list[QuestionRequest]]


@dataclass(slots=True, frozen=True)
class WithdrawQuestion:
    """The asker stopped waiting (its call was cancelled): drop the question."""

    request_id: str


QuestionMessage = AskQuestion | AnswerQuestion | ListQuestions | WithdrawQuestion | ClearSession


# --- tool executor -------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class PlannedCall:
    """A tool call the model made, already recorded as a ``pending`` tool part.

    ``refusal`` is set when the runner refuses the call outright (tools disabled after the
    step limit): the executor records it as an error without validating or running it.
    """

    part_id: str
    call_id: str
    tool: str
    arguments: str
    doom_loop: bool = False
    refusal: str | None = None
    model_call_id: str | None = None  # the model's id, when ``call_id`` replaced a reused one


@dataclass(slots=True, frozen=True)
class CallOutcome:
    call_id: str
    ok: bool
    stop: StopReason | None = None  # set when the call's outcome must stop the loop


@dataclass(slots=True, frozen=True)
class ExecuteCalls:
    """A step's calls for the ToolExecutor. ``reply`` is the runner's own channel for
    every step of the turn (not one a request): the runner asks one step at a time, and
    takes the answer that lists its calls."""

    message_id: str
    calls: Sequence[PlannedCall]
    reply: trio.MemorySendChannel[list[CallOutcome]]


# --- sessions ------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class Wake:
    """New input is durable in the session's inbox."""


@dataclass(slots=True, frozen=True)
class CancelTurn:
    reply: trio.MemorySendChannel[bool]  # False when nothing was running


SessionMessage = Wake | CancelTurn


@dataclass(slots=True, frozen=True)
class WakeSession:
    session_id: str
    # Heard from a shared ledger (another daemon's input, a lapsed lease), not from this
    # daemon's API: a child session is then never started here (its parent's call runs it).
    remote: bool = False
    # Claimed for this daemon by the shared ledger: its lease-holder stopped renewing.
    orphan: bool = False


@dataclass(slots=True, frozen=True)
class CancelSession:
    session_id: str
    reply: trio.MemorySendChannel[bool]


@dataclass(slots=True, frozen=True)
class LeaseLost:
    """Another daemon took the session (a shared ledger, DESIGN §14): stop running it."""

    session_id: str


SupervisorMessage = WakeSession | CancelSession | LeaseLost
