"""A session's history as read from the ledger, and the model's view of it.

The runner keeps one ``History`` per turn and calls ``sync`` at the start of each step:
it reads only the rows the ledger changed since the last sync and re-derives only the
messages those rows touch. That keeps a step's cost flat as a session grows, while the
ledger stays the only source of truth (a fresh ``History`` on a restarted process
produces the same request).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from harness.messages.model import (
    AssistantMessage,
    Message,
    Part,
    TextPart,
    ToolCompleted,
    ToolError,
    ToolPart,
    UserMessage,
)
from harness.messages.provider import AssistantTurn, ChatMessage, ToolCall, ToolResult, UserTurn
from harness.storage.ledger import Ledger

INTERRUPTED = "the tool call was interrupted before it finished"


@dataclass(slots=True)
class _Entry:
    message: Message
    parts: dict[str, Part]
    chat: tuple[ChatMessage, ...] | None = None  # cached model view; None = re-derive


def text_of(parts: list[Part] | tuple[Part, ...]) -> str:
    return "".join(p.text for p in parts if isinstance(p, TextPart) and not p.synthetic)


def _user_view(message: UserMessage, parts: list[Part]) -> tuple[ChatMessage, ...]:
    text = "".join(p.text for p in parts if isinstance(p, TextPart))
    if message.delivery == "steer" and not message.synthetic:
        text = f"[The user sent this while you were working]\n{text}"
    return (UserTurn(text),)


def _assistant_view(parts: list[Part]) -> tuple[ChatMessage, ...]:
    text = text_of(parts)
    tools = [p for p in parts if isinstance(p, ToolPart)]
    if not text and not tools:
        return ()  # an aborted or failed step with nothing to show for it
    calls = tuple(
        ToolCall(p.call_id, p.tool, json.dumps(p.state.input, separators=(",", ":"))) for p in tools
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


class History:
    def __init__(self, ledger: Ledger, session_id: str) -> None:
        self._ledger = ledger
        self.session_id = session_id
        self._entries: dict[str, _Entry] = {}
        self._order: list[str] = []  # message ids, in the order the ledger created them
        self._steps: dict[str, list[str]] = {}  # user message id -> its turn's steps
        self._orphans: dict[str, dict[str, Part]] = {}
        self.mark = 0

    def sync(self) -> None:
        messages, parts, self.mark = self._ledger.changes(self.session_id, self.mark)
        for message in messages:
            entry = self._entries.get(message.id)
            if entry is None:
                entry = _Entry(message, self._orphans.pop(message.id, {}))
                self._entries[message.id] = entry
                self._order.append(message.id)  # changes() lists new messages in creation order
                if isinstance(message, AssistantMessage):
                    self._steps.setdefault(message.parent_id, []).append(message.id)
            else:
                entry.message = message
                entry.chat = None
        for part in parts:
            owner = self._entries.get(part.message_id)
            if owner is None:
                self._orphans.setdefault(part.message_id, {})[part.id] = part
                continue
            owner.parts[part.id] = part
            owner.chat = None

    # --- the model's view -------------------------------------------------------------------

    def chat(self) -> list[ChatMessage]:
        out: list[ChatMessage] = []
        for message_id in self._order:
            entry = self._entries[message_id]
            if entry.chat is None:
                parts = self.parts_of(message_id)
                message = entry.message
                entry.chat = (
                    _user_view(message, parts)
                    if isinstance(message, UserMessage)
                    else _assistant_view(parts)
                )
            out.extend(entry.chat)
        return out

    # --- what the loop decides from ---------------------------------------------------------

    def parts_of(self, message_id: str) -> list[Part]:
        parts = self._entries[message_id].parts
        return [parts[k] for k in sorted(parts)]

    def message(self, message_id: str) -> Message | None:
        entry = self._entries.get(message_id)
        return entry.message if entry else None

    def turn_steps(self, user_message_id: str) -> list[AssistantMessage]:
        """The assistant messages of the turn that a user message started, in order."""
        return [self._step(i) for i in self._steps.get(user_message_id, ())]

    def step_count(self, user_message_id: str) -> int:
        return len(self._steps.get(user_message_id, ()))

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

    def recent_tool_calls(self, user_message_id: str, count: int) -> list[ToolPart]:
        """The last ``count`` tool parts of the turn, oldest first, newest steps only."""
        out: list[ToolPart] = []
        for step_id in reversed(self._steps.get(user_message_id, ())):
            tools = [p for p in self.parts_of(step_id) if isinstance(p, ToolPart)]
            out[:0] = tools
            if len(out) >= count:
                break
        return out[-count:]
