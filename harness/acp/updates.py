"""Harness events and stored parts as ACP ``session/update`` payloads (``acp.schema``).

One ``Translator`` per prompt (or per replay) turns what the harness publishes into the
updates an editor shows: text deltas become ``agent_message_chunk``, reasoning deltas
``agent_thought_chunk``, a tool part's first sighting ``tool_call`` and its later states
``tool_call_update``, and the task list (``todo.updated``) a ``plan``. Only the session's
own events are shown: a child session (the ``task`` tool) is one tool call of its parent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from acp import schema

from harness.messages.events import Event
from harness.messages.model import MessageWithParts, ReasoningPart, TextPart, ToolPart
from harness.messages.todo import Todo
from harness.secrets import redact, secret_start_at_end

# A tool's name → the ACP kind an editor picks its icon and treatment by.
TOOL_KINDS: dict[str, schema.ToolKind] = {
    "read": "read",
    "todoread": "read",
    "write": "edit",
    "edit": "edit",
    "apply_patch": "edit",
    "bash": "execute",
    "glob": "search",
    "grep": "search",
    "list": "search",
    "webfetch": "fetch",
    "todowrite": "think",
    "task": "think",
    "question": "other",
}
STATUSES: dict[str, schema.ToolCallStatus] = {
    "pending": "pending",
    "running": "in_progress",
    "completed": "completed",
    "error": "failed",
}
# The argument that says best what a call does, by tool, for its title.
_SUBJECT = ("command", "path", "pattern", "url", "description", "name")
# What a tool result may put in one update: an editor shows it, the ledger keeps it all.
MAX_CONTENT = 64 * 1024

Update = (
    schema.AgentMessageChunk
    | schema.AgentThoughtChunk
    | schema.UserMessageChunk
    | schema.ToolCallStart
    | schema.ToolCallProgress
    | schema.AgentPlanUpdate
)


def dump(model: Any) -> dict[str, Any]:
    """A schema model as the wire has it: camelCase aliases, no nulls."""
    result: dict[str, Any] = model.model_dump(mode="json", by_alias=True, exclude_none=True)
    return result


def notification(session_id: str, update: Update) -> dict[str, Any]:
    return dump(schema.SessionNotification(session_id=session_id, update=update))


def _text(text: str) -> schema.TextContentBlock:
    return schema.TextContentBlock(type="text", text=text)


def tool_kind(tool: str) -> schema.ToolKind:
    return TOOL_KINDS.get(tool, "other")


def tool_title(tool: str, arguments: dict[str, Any], title: str = "") -> str:
    if title:
        return title[:300]
    for key in _SUBJECT:
        value = arguments.get(key)
        if isinstance(value, str) and value.strip():
            return f"{tool} {value.strip().splitlines()[0][:200]}"
    return tool


def _path(directory: str, arguments: dict[str, Any]) -> Path | None:
    path = arguments.get("path", arguments.get("filePath"))  # OpenCode's name too
    if not isinstance(path, str) or not path or "\0" in path:
        return None
    return Path(path) if Path(path).is_absolute() else Path(directory, path)


def locations(directory: str, arguments: dict[str, Any]) -> list[schema.ToolCallLocation]:
    """The file a call reads or changes, absolute, for an editor's follow-along."""
    path = _path(directory, arguments)
    if path is None:
        return []
    offset = arguments.get("offset")
    usable = isinstance(offset, int) and not isinstance(offset, bool) and offset >= 0
    return [schema.ToolCallLocation(path=str(path), line=offset if usable else None)]


Content = schema.ContentToolCallContent | schema.FileEditToolCallContent


def diffs(
    tool: str, directory: str, arguments: dict[str, Any], metadata: dict[str, Any]
) -> list[Content]:
    """What an edit changes, as a diff an editor shows beside the call (and while it asks
    for permission): the replaced text and its replacement. A write is a diff once it
    created the file; nothing is read from the disk to make one (the path is the model's)."""
    path = _path(directory, arguments)
    if path is None:
        return []
    old: str | None = None
    if tool == "edit":
        old, new = arguments.get("old_string"), arguments.get("new_string")
    elif tool == "write" and metadata.get("created") is True:
        new = arguments.get("content")
    else:
        return []
    if not isinstance(new, str) or not isinstance(old, str | None):
        return []
    if len(new) + len(old or "") > MAX_CONTENT:
        return []
    return [schema.FileEditToolCallContent(type="diff", path=str(path), old_text=old, new_text=new)]


def _content(text: str) -> list[Content]:
    if len(text) > MAX_CONTENT:
        text = text[:MAX_CONTENT] + f"\n… ({len(text) - MAX_CONTENT} more characters)"
    return [schema.ContentToolCallContent(type="content", content=_text(text))]


def plan(todos: list[dict[str, Any]]) -> schema.AgentPlanUpdate:
    """The task list as a plan; ACP has no ``cancelled`` entry, so one is shown done and
    says so."""
    entries = []
    for raw in todos:
        todo = Todo.model_validate(raw)
        content, status = todo.content, todo.status
        if status == "cancelled":
            content, status = f"{content} (cancelled)", "completed"
        entries.append(schema.PlanEntry(content=content, priority=todo.priority, status=status))
    return schema.AgentPlanUpdate(session_update="plan", entries=entries)


class Translator:
    """The updates for one session's events, remembering what it already sent: a tool
    call is announced once, then updated; streamed text is not sent twice."""

    def __init__(self, session_id: str, directory: str) -> None:
        self.session_id = session_id
        self.directory = directory
        self._calls: dict[str, str] = {}  # call id → the last status sent
        self._sent: dict[str, str] = {}  # text/reasoning part id → its text sent so far
        # The streaming part and the end of its text held back: it could begin a secret.
        self._open: tuple[str, bool] | None = None
        self._held = ""

    def updates(self, event: Event) -> list[Update]:
        if event.session_id != self.session_id:
            return []
        data = event.data
        if event.type == "part.delta":
            return self._delta(data.get("part_id", ""), data.get("field") == "reasoning", data)
        if event.type in ("part.created", "part.updated"):
            kind = data.get("type")
            if kind == "tool":
                return self.tool(ToolPart.model_validate(data))
            if kind in ("text", "reasoning") and data.get("end") is not None:
                return self._rest_of(data)
            return []
        if event.type == "todo.updated":
            return [plan(data.get("todos") or [])]
        return []

    def _chunk(self, reasoning: bool, text: str) -> Update:
        if reasoning:
            thought = _text(text)
            return schema.AgentThoughtChunk(session_update="agent_thought_chunk", content=thought)
        return schema.AgentMessageChunk(session_update="agent_message_chunk", content=_text(text))

    def _delta(self, part_id: str, reasoning: bool, data: dict[str, Any]) -> list[Update]:
        """Live text, redacted, less any end of it that could begin a known secret: that
        waits for the next piece (a secret split across two deltas is still caught)."""
        updates = self.flush() if self._open is not None and self._open[0] != part_id else []
        self._open = (part_id, reasoning)
        text = redact(self._held + str(data.get("delta", "")))
        keep = secret_start_at_end(text)
        ready, self._held = text[: len(text) - keep], text[len(text) - keep :]
        if ready:
            self._sent[part_id] = self._sent.get(part_id, "") + ready
            updates.append(self._chunk(reasoning, ready))
        return updates

    def flush(self) -> list[Update]:
        """What was held back of the streaming part: it began no secret after all."""
        if self._open is None:
            return []
        (part_id, reasoning), held = self._open, self._held
        self._open, self._held = None, ""
        if not held:
            return []
        self._sent[part_id] = self._sent.get(part_id, "") + held
        return [self._chunk(reasoning, held)]

    def _rest_of(self, data: dict[str, Any]) -> list[Update]:
        """A finished text part: whatever of it no delta carried (a subscriber that fell
        behind, a text restored from the ledger), so the editor's copy is whole."""
        part_id = data.get("id", "")
        updates = self.flush() if self._open is not None and self._open[0] == part_id else []
        if data.get("synthetic"):
            return updates
        text: str = data.get("text", "")  # redacted by the ledger, as the deltas were here
        sent = self._sent.pop(part_id, "")
        if not text.startswith(sent):
            return updates  # not the text streamed: the editor keeps what it was shown
        rest = text[len(sent) :]
        return updates + ([self._chunk(data.get("type") == "reasoning", rest)] if rest else [])

    def tool(self, part: ToolPart) -> list[Update]:
        state = part.state
        status = STATUSES[state.status]
        previous = self._calls.get(part.call_id)
        if previous == status:
            return []
        self._calls[part.call_id] = status
        arguments = state.input
        title = tool_title(part.tool, arguments, getattr(state, "title", ""))
        metadata = getattr(state, "metadata", {})
        changes = diffs(part.tool, self.directory, arguments, metadata)
        content: list[Content] | None = changes or None
        raw_output: Any = None
        if state.status == "completed":
            content, raw_output = [*changes, *_content(state.output)], metadata or None
        elif state.status == "error":
            content = _content(state.error)
        if previous is None:
            return [
                schema.ToolCallStart(
                    session_update="tool_call",
                    tool_call_id=part.call_id,
                    title=title,
                    kind=tool_kind(part.tool),
                    status=status,
                    raw_input=arguments or None,
                    locations=locations(self.directory, arguments) or None,
                    content=content,
                    raw_output=raw_output,
                )
            ]
        return [
            schema.ToolCallProgress(
                session_update="tool_call_update",
                tool_call_id=part.call_id,
                title=title,
                status=status,
                raw_input=arguments or None,
                content=content,
                raw_output=raw_output,
            )
        ]

    def history(self, messages: list[MessageWithParts], todos: list[Todo]) -> list[Update]:
        """A stored session as the updates that would have shown it (``session/load``)."""
        updates: list[Update] = []
        for message in messages:
            info = message.info
            if info.role == "assistant" and info.mode == "compaction":
                continue  # a summary of earlier turns the editor already shows
            for part in message.parts:
                if isinstance(part, TextPart) and part.text and not part.synthetic:
                    if info.role == "user":
                        chunk: Update = schema.UserMessageChunk(
                            session_update="user_message_chunk", content=_text(part.text)
                        )
                        updates.append(chunk)
                    else:
                        updates.append(self._chunk(False, part.text))
                elif isinstance(part, ReasoningPart) and part.text:
                    updates.append(self._chunk(True, part.text))
                elif isinstance(part, ToolPart):
                    updates += self.tool(part)
        if todos:
            updates.append(plan([todo.model_dump() for todo in todos]))
        return updates
