"""Recovery: what a session does about a turn that a crash, a restart or a cancel cut short.

Kill the processes its tool calls left running, close the work it left open (open tool
parts, unfinished assistant messages), end a turn for good, and decide whether a crashed
runner may run again. These are ledger-level steps, shared by the session actor (which
resumes or restarts its own turns) and the supervisor (which abandons turns no actor will
carry on); keeping them apart from both means neither imports the other for them.
"""

from __future__ import annotations

import time
from collections import deque

import structlog

from harness.history import RESTARTED
from harness.messages.events import NewEvent, TurnResult
from harness.messages.model import SessionStatus, ToolError, ToolPart, ToolPending, ToolRunning
from harness.storage.port import LedgerError, LedgerPort
from harness.tools.process import kill_orphans, process_alive, same_machine

log = structlog.get_logger("harness.session")

# A turn resumed this many times and still not finished is ended instead: whatever makes
# the harness die during it would most likely do so again.
MAX_RESUMES = 10


def kill_orphaned_processes(ledger: LedgerPort, session_id: str) -> int:
    """Kill what the tool calls of a crashed harness left running (their process groups).

    A running call whose tool reported a process group has its identity in the ledger;
    ``kill_orphans`` checks it against the live processes, so a reused group number is
    left alone. Returns how many processes were killed.
    """
    killed = 0
    for part in ledger.open_tool_parts(session_id):
        identity = part.state.metadata.get("process") if part.state.status == "running" else None
        if isinstance(identity, dict):
            killed += kill_orphans(identity)
    if killed:
        log.warning("killed processes left by a crashed harness", count=killed)
    return killed


def reap_mcp_servers(ledger: LedgerPort) -> list[NewEvent]:
    """Kill the MCP servers a harness that died (``kill -9``, a crash) left running.

    Each stdio server's process group is in the ledger from before its first message
    (``mcp.process``) until it is recorded as ended; what is still open at a start was left
    by a dead harness, unless the harness that recorded it (its ``owner``) still runs: a
    shared ledger (DESIGN §14) holds the live servers of other daemons too. A record made
    on another machine is left for a harness of that machine to judge. Checked against the
    recorded identity, so a reused number is left alone. Returns the ``mcp.exited`` events
    that close the records.
    """
    events: list[NewEvent] = []
    for session_id, server, record in ledger.mcp_processes():
        identity = record["process"]
        owner = record.get("owner")
        if isinstance(owner, dict) and (not same_machine(owner) or process_alive(owner)):
            continue
        killed = kill_orphans(identity)
        reason = "left running by a harness that did not stop; reaped at start"
        data = {"server": server, "reason": reason, "process": identity, "killed": killed}
        events.append(NewEvent("mcp.exited", session_id, data))
        if killed:
            log.warning("killed an MCP server left by a dead harness", server=server, count=killed)
    return events


def _rerunnable_mcp(part: ToolPart) -> bool:
    """An MCP call annotated ``idempotentHint`` (recorded with its ``running`` state) may be
    run again after a crash; any other MCP call is shown to the model as interrupted."""
    mcp = part.state.metadata.get("mcp") if isinstance(part.state, ToolRunning) else None
    return isinstance(mcp, dict) and mcp.get("idempotent") is True


def close_open_work(
    ledger: LedgerPort,
    session_id: str,
    reason: str,
    *,
    rerun: frozenset[str] = frozenset(),
    rerun_idempotent_mcp: bool = False,
) -> list[NewEvent]:
    """Events that close what a stopped turn left open.

    Open tool parts become errors with ``reason``, except calls of the ``rerun`` tools
    (read-only and idempotent) in a step that finished streaming: those go back to
    ``pending`` so the runner runs them again. The assistant messages that owned closed
    parts, or that never finished streaming, are marked with ``reason`` (aborted) — except
    a message with calls going back to pending: its step goes on, and the runner only
    runs the pending calls of a step that is not marked aborted.
    """
    now = time.time()
    events: list[NewEvent] = []
    owners: set[str] = set()
    resumed: set[str] = set()
    unfinished = {m.id for m in ledger.assistant_messages(session_id, unfinished_or_in=set())}
    for part in ledger.open_tool_parts(session_id):
        state = part.state
        repeat = part.tool in rerun or (rerun_idempotent_mcp and _rerunnable_mcp(part))
        if repeat and part.message_id not in unfinished:
            again = part.model_copy(update={"state": ToolPending(input=state.input)})
            events.append(NewEvent.of("part.updated", session_id, again))
            resumed.add(part.message_id)
            continue
        start = getattr(state, "start", now)
        closed = part.model_copy(
            update={"state": ToolError(input=state.input, error=reason, start=start, end=now)}
        )
        owners.add(part.message_id)
        events.append(NewEvent.of("part.updated", session_id, closed))
    for message in ledger.assistant_messages(session_id, unfinished_or_in=owners - resumed):
        aborted = message.model_copy(
            update={"error": reason, "completed": message.completed or now}
        )
        events.append(NewEvent.of("message.updated", session_id, aborted))
    return events


def end_turn(
    ledger: LedgerPort, session_id: str, message_id: str, *, closed_as: str, error: str
) -> list[NewEvent]:
    """Events that close a turn's open work as ``closed_as`` and finish it with ``error``."""
    result = TurnResult(message_id, "error", "", error)
    return [
        *close_open_work(ledger, session_id, closed_as),
        NewEvent("turn.finished", session_id, result.to_dict()),
    ]


def abandon_turn(
    ledger: LedgerPort,
    session_id: str,
    message_id: str,
    reason: str = RESTARTED,
    *,
    status: SessionStatus = "idle",
) -> list[NewEvent]:
    """Events that end a claimed turn for good, without running it any further.

    Processes its interrupted tool calls left running are killed first.
    """
    kill_orphaned_processes(ledger, session_id)
    events = end_turn(ledger, session_id, message_id, closed_as=reason, error=reason)
    session = ledger.session(session_id)
    if session is not None:
        ended = session.model_copy(
            update={
                "status": status,
                "error": reason if status == "error" else None,
                "updated": time.time(),
            }
        )
        events.append(NewEvent.of("session.updated", session_id, ended))
    return events


def resume_events(
    ledger: LedgerPort, session_id: str, message_id: str, resumes: int, rerun: frozenset[str]
) -> list[NewEvent]:
    """Events that let an interrupted turn carry on: its open work closed, its resume counted.

    Nothing is added to the conversation: a call a restart cut off says so in its own
    result, and a step cut mid-stream is left out of the model's view (History), so when
    nothing was lost the model gets exactly the request it was answering. The ledger alone
    records that the turn was resumed.
    """
    events = close_open_work(
        ledger, session_id, RESTARTED, rerun=rerun, rerun_idempotent_mcp=True
    )
    resumed = {"message_id": message_id, "resumes": resumes + 1}
    events.append(NewEvent("turn.resumed", session_id, resumed))
    return events


class RestartPolicy:
    """One-for-one restarts of a crashing runner: at most ``limit`` within ``window`` s."""

    def __init__(self, limit: int, window: float) -> None:
        self._limit = limit
        self._window = window
        self._crashes: deque[float] = deque()

    @property
    def recent_crashes(self) -> int:
        return len(self._crashes)

    def may_restart(self) -> bool:
        """Count one more crash; whether the runner may still be started again."""
        now = time.monotonic()
        while self._crashes and now - self._crashes[0] > self._window:
            self._crashes.popleft()
        self._crashes.append(now)
        return len(self._crashes) <= self._limit


def root_cause(error: BaseException) -> BaseException:
    """The error inside the nurseries' wrapping: a reason must name what was raised."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


def ledger_failure(error: BaseException) -> LedgerError | None:
    """The ledger's failure somewhere in ``error`` (a full disk): no restart can help."""
    if isinstance(error, LedgerError):
        return error
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            found = ledger_failure(inner)
            if found is not None:
                return found
    return None
