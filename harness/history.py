"""A session's history as read from the ledger, and the model's view of it.

The runner keeps one ``History`` per turn and calls ``sync`` at the start of each step:
it reads only the rows the ledger changed since the last sync and re-derives only the
messages those rows touch. That keeps a step's cost flat as a session grows, while the
ledger stays the only source of truth (a fresh ``History`` on a restarted process
produces the same request).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.messages.events import Event
from harness.messages.model import (
    AssistantMessage,
    CompactionPart,
    Message,
    Part,
    TextPart,
    ToolCompleted,
    ToolError,
    ToolPart,
    UserMessage,
)
from harness.messages.provider import AssistantTurn, ChatMessage, ToolCall, ToolResult, UserTurn
from harness.storage.port import _MESSAGE, _PART, LedgerPort

INTERRUPTED = "the tool call was interrupted before it finished"
# What a restart writes on the work it closes. A step whose stream a restart cut off ran
# nothing (calls run only once their stream has finished): it is kept in the record but
# left out of the model's view and of the step count, so that the resumed turn sends the
# very request that was interrupted and the model cannot tell a crash happened.
RESTARTED = "interrupted by restart"


def cut_by_restart(message: Message) -> bool:
    """A step whose reply was still streaming when the process died."""
    return (
        isinstance(message, AssistantMessage)
        and message.mode == "step"
        and message.finish is None
        and message.error == RESTARTED
    )


@dataclass(slots=True)
class _Entry:
    message: Message
    parts: dict[str, Part]
    # The model's view of this message, derived on demand and cached until it changes:
    chat: tuple[ChatMessage, ...] | None = None
    pruned: tuple[ChatMessage, ...] | None = None  # the same with old tool outputs elided
    tokens: int = 0  # estimated tokens of ``chat``
    tool_tokens: int = 0  # of which tool outputs
    is_reply: bool = False  # an assistant reply with something to show (or a summary)
    counted: bool = False  # whether the figures above are in the History's running totals


@dataclass(slots=True)
class _View:
    """The model's view as the last ``chat`` built it, kept to build the next one from.

    A step only appends messages and changes the last few, so the next view keeps what
    comes before the first change and builds the rest: the work of a step does not grow
    with the history (issue 14). Made anew when the summary at its head changes.
    """

    compaction: tuple[str, CompactionPart] | None
    ids: list[str]  # the visible messages' ids, in order
    entries: list[_Entry]  # and their entries
    position: dict[str, int]  # message id -> its index in ``ids``
    tool_before: list[int]  # tool-output tokens of entries[:i], one more item than entries
    out: list[ChatMessage]  # the view: the summary (if any), then each entry's messages
    offsets: list[int]  # where each of the first len(offsets) entries starts in ``out``
    cut: int = 0  # entries before this index showed pruned tool outputs


def estimate_tokens(text: str) -> int:
    """A provider-neutral estimate: about four characters a token."""
    return len(text) // 4 + 1


PRUNED = (
    "[This old tool output was pruned to save context ({chars} characters). The ledger "
    "keeps it; run the tool again if you need it.]"
)
SUMMARY_HEADER = "[Summary of the conversation so far, written when the context filled up]\n"


def text_of(parts: list[Part] | tuple[Part, ...]) -> str:
    return "".join(p.text for p in parts if isinstance(p, TextPart) and not p.synthetic)


def _user_view(message: UserMessage, parts: list[Part]) -> tuple[ChatMessage, ...]:
    if message.compact:
        return ()  # a request to the harness, not words for the model
    text = "".join(p.text for p in parts if isinstance(p, TextPart))
    if message.delivery == "steer" and not message.synthetic:
        text = f"[The user sent this while you were working]\n{text}"
    return (UserTurn(text),)


# ``json.dumps(…, separators=(",", ":"))`` with its encoder made once, not per call.
_compact_json = json.JSONEncoder(separators=(",", ":")).encode


def _assistant_view(parts: list[Part]) -> tuple[ChatMessage, ...]:
    text = text_of(parts)
    tools = [p for p in parts if isinstance(p, ToolPart)]
    if not text and not tools:
        return ()  # an aborted or failed step with nothing to show for it
    calls = tuple(
        ToolCall(p.call_id, p.tool, _compact_json(p.state.input)) for p in tools
    )
    view: list[ChatMessage] = [AssistantTurn(text, calls)]
    for part in tools:
        state = part.state
        if isinstance(state, ToolCompleted):
            view.append(ToolResult(part.call_id, part.tool, state.output))
        elif isinstance(state, ToolError):
            view.append(ToolResult(part.call_id, part.tool, state.error, is_error=True))
        else:
            view.append(ToolResult(part.call_id, part.tool, INTERRUPTED, is_error=True))
    return tuple(view)



def _rows_written(
    written: Sequence[Event], mark: int
) -> tuple[list[Message], list[Part], int]:
    """The messages and parts committed events wrote, validated as a read's rows are, in
    the order each was first written, and the mark past the last of them (``mark`` if
    none).

    From the events' data as is: it is what their rows' JSON was made from, so the same
    validation in Python mode gives the same models, without encoding each one again
    (half of this function's time, a step at a time; issue 18). A row written several
    times (a tool part: pending, running, completed) is validated once, as its last
    version: what a read of the rows would give."""
    latest_messages: dict[str, dict[str, Any]] = {}
    latest_parts: dict[str, dict[str, Any]] = {}
    for event in written:
        kind = event.type
        if kind == "message.created" or kind == "message.updated":
            latest_messages[event.data["id"]] = event.data  # an update keeps its place
        elif kind == "part.created" or kind == "part.updated":
            latest_parts[event.data["id"]] = event.data
        else:
            continue
        mark = max(mark, event.seq or 0)
    messages = [_MESSAGE.validate_python(data) for data in latest_messages.values()]
    parts = [_PART.validate_python(data) for data in latest_parts.values()]
    return messages, parts, mark


class History:
    def __init__(self, ledger: LedgerPort, session_id: str) -> None:
        self._ledger = ledger
        self.session_id = session_id
        self._entries: dict[str, _Entry] = {}
        self._order: list[str] = []  # message ids, in the order the ledger created them
        self._index: dict[str, int] = {}  # message id -> its place in _order
        self._steps: dict[str, list[str]] = {}  # user message id -> its turn's steps
        self._compaction: tuple[str, CompactionPart] | None = None  # the latest summary
        self._orphans: dict[str, dict[str, Part]] = {}
        self._calls: dict[str, set[str]] = {}  # tool call id -> the messages holding it
        # Steps a restart cut off, kept as the messages change: counting them in
        # step_count would otherwise walk every step of the turn, each step.
        self._cut: set[str] = set()
        self.mark = 0
        # Running totals, kept up to date from the messages that changed, so that a step
        # does not walk the whole history to estimate it (that would grow with its length).
        self._dirty: set[str] = set()
        self._totals_valid = True
        self._tokens = 0  # visible messages
        self._tool_tokens = 0  # visible messages' tool outputs
        self._replies = 0  # all messages
        self._view: _View | None = None
        self._view_changed: set[str] = set()  # messages changed since the view was built
        # Set by ``seed`` (and on a shared ledger by each catch-up): the mark at which this
        # history holds every message and part of the session, so that the next catch-up
        # reads nothing, or only applies what the ledger kept for it (``follow``).
        self._complete_at: int | None = None
        # What the ledger knows this history by when it keeps commits for it (``follow``):
        # not the history itself, which a turn that never closes it would keep alive.
        self._follower = object()

    def seed(
        self, rows: tuple[list[Message], list[Part], int], written: Sequence[Event]
    ) -> None:
        """Start from rows the caller has already, as if read by ``sync``: ``rows``, what
        the claim of the session's lease read (``changes`` after 0), and ``written``, the
        events its holder committed since, as committed (redacted as stored). The caller
        vouches that nothing else was written since (the lease's fence keeps others
        out). On a shared ledger the history follows the session from here: its writer's
        later commits are applied as committed (``catch_up``). Otherwise, once this
        process commits or hears of another change of the session's messages or parts
        (``message_mark`` moves), the next catch-up reads again."""
        messages, parts, mark = _rows_written(written, rows[2])
        self._apply([*rows[0], *messages], [*rows[1], *parts], mark)
        # Complete only if the last such commit seen here is the one just applied: any
        # later one (not the caller's) is read at the next catch-up.
        if self._ledger.message_mark(self.session_id) == mark:
            self._complete_at = mark
            self._ledger.follow(self.session_id, self._follower)

    def sync(self) -> None:
        self._complete_at = None
        self._ledger.follow(self.session_id, self._follower)  # what commits meanwhile is kept
        self._apply(*self._ledger.changes(self.session_id, self.mark))
        self._read_done()

    async def catch_up(self) -> None:
        """``sync``, with the read made as the event loop's hot reads are (the loop is
        free while a database server answers: ``LedgerPort.changes_async``).

        No read at all while this history has every commit of the session's messages and
        parts since its last: this writer's own, kept for it as committed
        (``LedgerPort.take_written``), the objects a read gives. On a shared ledger the
        lease makes this writer the only one (issue 18); on a SQLite file the ledger's
        lock does (harness/storage/lock.py), and a read of a step's rows cost 35–90 µs
        against ~15 to apply its events (issue 14, ninth pass)."""
        ledger, session_id = self._ledger, self.session_id
        complete_at, self._complete_at = self._complete_at, None
        if complete_at is not None:
            written = ledger.take_written(session_id, self._follower)
            if written is not None:
                self._apply_written(written)
                self._complete_at = self.mark
                return
        ledger.follow(session_id, self._follower)  # commits made during the read are kept too
        self._apply(*await ledger.changes_async(session_id, self.mark))
        self._read_done()

    def _read_done(self) -> None:
        """A read brought every commit up to its start; those made since (this writer's,
        kept by ``follow`` before the read) come at the next catch-up, applied again if
        the read saw them: a row ends as its last version either way."""
        self._complete_at = self.mark

    def close(self) -> None:
        """The turn is over: the ledger keeps nothing more for this history."""
        self._complete_at = None
        self._ledger.unfollow(self.session_id, self._follower)

    def _apply_written(self, written: Sequence[Event]) -> None:
        """Apply committed events as ``_apply`` applies a read of the rows they wrote:
        validated as a read's rows are; a row written twice ends as its last version."""
        messages, parts, mark = _rows_written(written, self.mark)
        if messages or parts:
            self._apply(messages, parts, mark)

    def _apply(self, messages: list[Message], parts: list[Part], mark: int) -> None:
        self.mark = mark
        for message in messages:
            entry = self._entries.get(message.id)
            if entry is None:
                entry = _Entry(message, self._orphans.pop(message.id, {}))
                self._entries[message.id] = entry
                self._index[message.id] = len(self._order)
                self._order.append(message.id)  # changes() lists new messages in creation order
                if isinstance(message, AssistantMessage) and message.mode == "step":
                    self._steps.setdefault(message.parent_id, []).append(message.id)
            else:
                entry.message = message
                entry.chat = None
                self._view_changed.add(message.id)
            if cut_by_restart(message):
                self._cut.add(message.id)
            else:
                self._cut.discard(message.id)
            self._dirty.add(message.id)
        for part in parts:
            if isinstance(part, ToolPart):
                self._calls.setdefault(part.call_id, set()).add(part.message_id)
            owner = self._entries.get(part.message_id)
            if owner is None:
                self._orphans.setdefault(part.message_id, {})[part.id] = part
                continue
            owner.parts[part.id] = part
            owner.chat = None
            self._view_changed.add(part.message_id)
            self._dirty.add(part.message_id)
            if isinstance(part, CompactionPart):
                self._compaction = (part.message_id, part)
                self._totals_valid = False  # what is visible changed: count it all again

    def _refresh(self) -> None:
        """Bring the running totals up to date with what changed since the last call."""
        if not self._totals_valid:
            self._tokens = self._tool_tokens = self._replies = 0
            for entry in self._entries.values():
                entry.counted = False
            self._dirty = set(self._order)
            self._totals_valid = True
        if not self._dirty:
            return
        hidden = set(self._order) - set(self._visible()) if self._compaction else set()
        for message_id in self._dirty:
            entry = self._entries[message_id]
            visible = message_id not in hidden
            if entry.counted:
                self._replies -= entry.is_reply
                if visible:
                    self._tokens -= entry.tokens
                    self._tool_tokens -= entry.tool_tokens
            self._view_of(message_id)
            self._replies += entry.is_reply
            if visible:
                self._tokens += entry.tokens
                self._tool_tokens += entry.tool_tokens
            entry.counted = True
        self._dirty.clear()

    # --- the model's view -------------------------------------------------------------------

    def _view_of(self, message_id: str) -> _Entry:
        entry = self._entries[message_id]
        if entry.chat is None:
            parts = self.parts_of(message_id)
            message = entry.message
            if isinstance(message, UserMessage):
                entry.chat = _user_view(message, parts)
            elif message.mode == "compaction" or cut_by_restart(message):
                # A summary is shown at the head of the view instead; a cut step not at all.
                entry.chat = ()
            else:
                entry.chat = _assistant_view(parts)
            entry.pruned = None
            entry.tool_tokens = sum(
                estimate_tokens(m.content) for m in entry.chat if isinstance(m, ToolResult)
            )
            entry.tokens = entry.tool_tokens + sum(
                estimate_tokens(m.text) + sum(len(c.arguments) // 4 for c in m.tool_calls)
                if isinstance(m, AssistantTurn)
                else estimate_tokens(m.text)
                for m in entry.chat
                if not isinstance(m, ToolResult)
            )
            entry.is_reply = isinstance(message, AssistantMessage) and (
                message.mode == "compaction" or bool(entry.chat)
            )
        return entry

    def _visible(self) -> list[str]:
        """Ids of the messages in the model's view: all, or those kept after a summary."""
        if self._compaction is None:
            return self._order
        owner, part = self._compaction
        start = (
            self._index.get(part.keep_from, self._index[owner])
            if part.keep_from
            else (self._index[owner])
        )
        return [i for i in self._order[start:] if i != owner]

    def chat(self, *, prune_protect: int | None = None) -> list[ChatMessage]:
        """What the model sees: the summary of compacted history, then the messages kept.

        With ``prune_protect``, tool outputs older than the newest ``prune_protect``
        tokens of tool output are elided, when that saves at least half as much again
        (pruning a little would only spoil the provider's prompt cache); the ledger keeps
        them whole. Built from the last view (``_View``): only the messages after the
        first one that changed since are looked at again.
        """
        self._refresh()
        visible = self._visible()
        view = self._view
        if view is None or view.compaction is not self._compaction:
            head: list[ChatMessage] = []
            if self._compaction is not None:
                head.append(UserTurn(SUMMARY_HEADER + self._compaction[1].summary))
            view = self._view = _View(self._compaction, [], [], {}, [0], head, [])
        # The view holds up to the first message changed since it was built.
        valid = len(view.ids)
        for message_id in self._view_changed:
            position = view.position.get(message_id)
            if position is not None and position < valid:
                valid = position
        self._view_changed.clear()
        # Both come from the append-only ``_order`` under the same head, so the view can
        # only have grown; checked at its end all the same (a full compare would be O(n)).
        if valid and (len(visible) < valid or visible[valid - 1] != view.ids[valid - 1]):
            valid = 0
        for message_id in view.ids[valid:]:
            del view.position[message_id]
        del view.ids[valid:], view.entries[valid:], view.tool_before[valid + 1 :]
        for message_id in visible[valid:]:
            entry = self._view_of(message_id)
            view.position[message_id] = len(view.ids)
            view.ids.append(message_id)
            view.entries.append(entry)
            view.tool_before.append(view.tool_before[-1] + entry.tool_tokens)
        entries = view.entries
        cut = 0  # entries before this index show pruned tool outputs
        # The walk is needed only once there is more tool output than is protected.
        if prune_protect is not None and view.tool_before[-1] > prune_protect:
            seen = 0
            for index in range(len(entries) - 1, -1, -1):
                seen += entries[index].tool_tokens
                if seen > prune_protect:
                    if view.tool_before[index + 1] >= prune_protect // 2:
                        cut = index + 1
                    break
        # Rebuild the view from the first entry whose messages may differ.
        rebuild = min(valid, view.cut, cut) if cut != view.cut else valid
        out, offsets = view.out, view.offsets
        if rebuild < len(offsets):
            del out[offsets[rebuild] :], offsets[rebuild:]
        for position in range(len(offsets), len(entries)):
            entry = entries[position]
            offsets.append(len(out))
            if position < cut and entry.tool_tokens:
                if entry.pruned is None:
                    entry.pruned = tuple(
                        ToolResult(m.call_id, m.name, PRUNED.format(chars=len(m.content)))
                        if isinstance(m, ToolResult) and not m.is_error
                        else m
                        for m in entry.chat or ()
                    )
                out.extend(entry.pruned)
            else:
                out.extend(entry.chat or ())
        view.cut = cut
        return list(out)

    def estimate(self) -> int:
        """Estimated tokens of the model's view (before pruning), summary included."""
        self._refresh()
        total = self._tokens
        if self._compaction is not None:
            total += estimate_tokens(self._compaction[1].summary)
        return total

    def reported_estimate(self) -> int | None:
        """The provider's own count for the last visible step, plus what came after it.

        The last step's reported input and output tokens cover everything up to its reply;
        its tool results and any later messages are new and are estimated. None when no
        visible step reported usage (nothing since the last summary, or no usage at all).
        """
        added = 0
        # A count reported before the latest summary measured the old, longer context.
        since = self._index[self._compaction[0]] if self._compaction is not None else -1
        for message_id in reversed(self._visible()):
            if self._index[message_id] < since:
                return None
            entry = self._view_of(message_id)
            message = entry.message
            if isinstance(message, AssistantMessage) and message.mode == "step":
                # Only the latest step's count is current; without one, estimate instead.
                if message.tokens.input <= 0:
                    return None
                return message.tokens.input + message.tokens.output + entry.tool_tokens + added
            added += entry.tokens
        return None

    def keep_from(self, keep_tokens: int) -> str | None:
        """The oldest visible message such that it and all after it fit in ``keep_tokens``."""
        kept: str | None = None
        total = 0
        for message_id in reversed(self._visible()):
            total += self._view_of(message_id).tokens
            if total > keep_tokens and kept is not None:
                break
            kept = message_id
        return kept

    def assistant_turns(self) -> int:
        """Assistant replies in the whole history (summarized ones and summaries included)."""
        self._refresh()
        return self._replies

    # --- what the loop decides from ---------------------------------------------------------

    def parts_of(self, message_id: str) -> list[Part]:
        parts = self._entries[message_id].parts
        return [parts[k] for k in sorted(parts)]

    def turn_steps(self, user_message_id: str) -> list[AssistantMessage]:
        """The assistant messages of the turn that a user message started, in order."""
        return [self._step(i) for i in self._steps.get(user_message_id, ())]

    def step_count(self, user_message_id: str) -> int:
        """Steps the turn has taken; a step a restart cut off is taken again, not counted."""
        steps = self._steps.get(user_message_id, ())
        cut = sum(1 for i in self._cut if self._step(i).parent_id == user_message_id)
        return len(steps) - cut

    def last_step(self, user_message_id: str) -> AssistantMessage | None:
        ids = self._steps.get(user_message_id)
        return self._step(ids[-1]) if ids else None

    def _step(self, message_id: str) -> AssistantMessage:
        message = self._entries[message_id].message
        assert isinstance(message, AssistantMessage)
        return message

    def last_message(self) -> Message | None:
        return self._entries[self._order[-1]].message if self._order else None

    def answer_if_done(self, user_message_id: str) -> str | None:
        """The turn's final answer when the ledger shows it finished, else None.

        Finished means: the last message is an assistant message of this turn, its
        stream ended normally with a reason other than ``tool_calls``, and it made no
        tool call whose result the model has not seen yet.
        """
        last = self.last_message()
        if not isinstance(last, AssistantMessage) or last.parent_id != user_message_id:
            return None
        if last.finish is None or last.finish == "tool_calls" or last.error is not None:
            return None
        if last.mode == "compaction":
            return None  # a summary was just written: the work goes on
        parts = self.parts_of(last.id)
        if any(isinstance(p, ToolPart) for p in parts):
            return None
        return text_of(parts)

    def unanswered_calls(self, user_message_id: str) -> list[ToolPart]:
        """Pending tool calls of the turn's last step, when that step finished streaming.

        Only a restart leaves these: recovery resets an interrupted read-only call to
        pending so that it is run again instead of being reported as interrupted.
        """
        last = self.last_step(user_message_id)
        if last is None or last.finish is None or last.error is not None:
            return []
        return [
            p
            for p in self.parts_of(last.id)
            if isinstance(p, ToolPart) and p.state.status == "pending"
        ]

    def call_id_taken(self, call_id: str) -> bool:
        """Whether a call the model can see already has this id (a step cut by a restart
        is not seen, so the same reply streamed again keeps its ids)."""
        for message_id in self._calls.get(call_id, ()):
            entry = self._entries.get(message_id)
            if entry is None or not cut_by_restart(entry.message):
                return True
        return False

    def recent_tool_calls(self, user_message_id: str, count: int) -> list[ToolPart]:
        """The last ``count`` tool parts of the turn, oldest first, newest steps only."""
        out: list[ToolPart] = []
        for step_id in reversed(self._steps.get(user_message_id, ())):
            tools = [p for p in self.parts_of(step_id) if isinstance(p, ToolPart)]
            out[:0] = tools
            if len(out) >= count:
                break
        return out[-count:]
