"""The data model of DESIGN §5 (contract): Session, Message, Part and ToolState.

The ledger stores these as JSON and the API speaks them, so field names are part of the
contract. Everything is a plain pydantic model with no behaviour: the actors own the rules.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SessionStatus = Literal["idle", "busy", "retry", "error"]
Delivery = Literal["queue", "steer"]
PermissionAction = Literal["allow", "deny", "ask"]
# What reverting did to one file: the snapshots' result and the daemon API's answer.
RevertAction = Literal["restored", "deleted", "recreated", "unchanged"]


class _Model(BaseModel):
    # Built on first use, not at import: a run's first request needs a handful of these
    # (Session, UserMessage, TextPart…); the rest waits for the steps that use them.
    model_config = ConfigDict(extra="forbid", defer_build=True)


class Rule(_Model):
    """One permission rule; the last matching rule of a ruleset wins (DESIGN §8)."""

    permission: str
    pattern: str = "*"
    action: PermissionAction
    # Where the rule was written: a configuration file's absolute path, so the ledger's
    # decision record names the file (DESIGN §11). Left out of the JSON when unset.
    source: str | None = Field(default=None, exclude_if=lambda value: value is None)


class Tokens(_Model):
    input: int = 0
    output: int = 0
    reasoning: int = 0
    cache_read: int = 0
    cache_write: int = 0

    @property
    def total(self) -> int:
        return self.input + self.output + self.reasoning + self.cache_read + self.cache_write

    def plus(self, other: Tokens) -> Tokens:
        return Tokens(
            input=self.input + other.input,
            output=self.output + other.output,
            reasoning=self.reasoning + other.reasoning,
            cache_read=self.cache_read + other.cache_read,
            cache_write=self.cache_write + other.cache_write,
        )


class Session(_Model):
    id: str
    parent_id: str | None = None
    title: str = ""
    directory: str
    agent: str = "build"
    model: str
    base_url: str | None = None  # the provider's server; None: the harness's setting
    status: SessionStatus = "idle"
    permission: list[Rule] = Field(default_factory=list)
    created: float
    updated: float
    tokens: Tokens = Field(default_factory=Tokens)
    cost: float = 0.0
    error: str | None = None


class UserMessage(_Model):
    role: Literal["user"] = "user"
    id: str
    session_id: str
    agent: str
    model: str
    delivery: Delivery = "queue"
    synthetic: bool = False  # written by the harness (a restart note), not typed by a user
    max_steps: int | None = None  # this turn's step limit, when the prompt set one
    # A request to compact the history (chat's /compact), not words for the model: the
    # turn writes a summary and ends, and the model never sees this message.
    compact: bool = False
    created: float


class AssistantMessage(_Model):
    role: Literal["assistant"] = "assistant"
    id: str
    session_id: str
    parent_id: str
    agent: str
    model: str
    step: int
    # "compaction": the message holds a summary of the history before it, not a step.
    mode: Literal["step", "compaction"] = "step"
    finish: str | None = None
    error: str | None = None
    tokens: Tokens = Field(default_factory=Tokens)
    cost: float = 0.0
    created: float
    completed: float | None = None


Message = Annotated[UserMessage | AssistantMessage, Field(discriminator="role")]


# --- tool states -------------------------------------------------------------------------


class _ToolModel(_Model):
    # Built at import after all: every tool step makes these, and deferred, the first
    # step of a run would pay for building them (~3 ms), which a per-step figure reads.
    model_config = ConfigDict(defer_build=False)


class ToolPending(_ToolModel):
    status: Literal["pending"] = "pending"
    input: dict[str, Any] = Field(default_factory=dict)
    raw: str = ""


class ToolRunning(_ToolModel):
    status: Literal["running"] = "running"
    input: dict[str, Any]
    title: str = ""
    metadata: dict[str, Any] = Field(default_factory=dict)
    start: float


class ToolCompleted(_ToolModel):
    status: Literal["completed"] = "completed"
    input: dict[str, Any]
    output: str
    title: str = ""
    metadata: dict[str, Any] = Field(default_factory=dict)
    start: float
    end: float


class ToolError(_ToolModel):
    status: Literal["error"] = "error"
    input: dict[str, Any] = Field(default_factory=dict)
    error: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    start: float
    end: float


ToolState = Annotated[
    ToolPending | ToolRunning | ToolCompleted | ToolError, Field(discriminator="status")
]


# --- parts -------------------------------------------------------------------------------


class _PartBase(_Model):
    id: str
    session_id: str
    message_id: str


class TextPart(_PartBase):
    type: Literal["text"] = "text"
    text: str
    synthetic: bool = False
    start: float | None = None
    end: float | None = None


class ReasoningPart(_PartBase):
    type: Literal["reasoning"] = "reasoning"
    text: str
    start: float | None = None
    end: float | None = None


class ToolPart(_PartBase):
    model_config = ConfigDict(defer_build=False)  # as the tool states (see _ToolModel)

    type: Literal["tool"] = "tool"
    call_id: str
    # The id the model sent, when another call in the session already had it: ``call_id``
    # is then a fresh one, and this keeps the mapping (one result per id in a history).
    model_call_id: str | None = None
    tool: str
    state: ToolState


class StepStartPart(_PartBase):
    type: Literal["step-start"] = "step-start"
    step: int


class StepFinishPart(_PartBase):
    type: Literal["step-finish"] = "step-finish"
    reason: str
    tokens: Tokens = Field(default_factory=Tokens)
    cost: float = 0.0


class FilePart(_PartBase):
    type: Literal["file"] = "file"
    path: str
    mime: str = "text/plain"


class PatchFile(_Model):
    """One file a step changed: its content hashes (None: no file) and line counts."""

    path: str  # relative to the session directory when inside it, else absolute
    before_hash: str | None
    after_hash: str | None
    added: int = 0
    removed: int = 0


class PatchPart(_PartBase):
    """Ends a step that changed files (file snapshots, see harness/snapshots.py)."""

    type: Literal["patch"] = "patch"
    files: list[PatchFile]


class CompactionPart(_PartBase):
    type: Literal["compaction"] = "compaction"
    summary: str
    # The first message kept verbatim after the summary (None: none before this one).
    keep_from: str | None = None
    tokens_before: int = 0


class SubtaskPart(_PartBase):
    type: Literal["subtask"] = "subtask"
    call_id: str | None = None  # the task call that runs the child
    child_session_id: str
    description: str


Part = Annotated[
    TextPart
    | ReasoningPart
    | ToolPart
    | StepStartPart
    | StepFinishPart
    | FilePart
    | PatchPart
    | CompactionPart
    | SubtaskPart,
    Field(discriminator="type"),
]


class MessageWithParts(_Model):
    """A message and its parts in order: what ``messages(session)`` answers."""

    info: Message
    parts: list[Part]


class InboxItem(_Model):
    """User input that is durable but not yet taken by the loop (DESIGN §4 ``inbox``).

    ``id`` is the id the user message will have once taken, so a client-supplied id makes
    a prompt idempotent.
    """

    id: str
    session_id: str
    text: str
    delivery: Delivery = "queue"
    agent: str | None = None
    model: str | None = None
    max_steps: int | None = None  # this turn only (`run --max-steps`); None: the agent's
    compact: bool = False  # a compaction request (``Harness.compact``), see UserMessage
    created: float
