"""The provider-neutral request and stream events (DESIGN §6).

The runner builds a ``ProviderRequest`` from the ledger and reads ``StreamEvent``s back;
it never sees an SDK type. Each provider maps these to and from its own wire format.
Frozen dataclasses: the history is rebuilt every step, so these must be cheap to create
and safe to share between steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from harness.messages.model import Tokens

# --- request -------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # the JSON text exactly as the model produced it


@dataclass(slots=True, frozen=True)
class UserTurn:
    text: str
    role: Literal["user"] = "user"


@dataclass(slots=True, frozen=True)
class AssistantTurn:
    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    role: Literal["assistant"] = "assistant"


@dataclass(slots=True, frozen=True)
class ToolResult:
    call_id: str
    name: str
    content: str
    is_error: bool = False
    role: Literal["tool"] = "tool"


ChatMessage = UserTurn | AssistantTurn | ToolResult


@dataclass(slots=True, frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments


@dataclass(slots=True, frozen=True)
class ProviderRequest:
    model: str  # the model name without the provider prefix
    system: tuple[str, ...]
    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolSpec, ...]
    tool_choice: Literal["auto", "none"] = "auto"
    max_tokens: int | None = None
    temperature: float | None = None
    session_id: str = ""
    step: int = 0
    # How many assistant replies the session's whole history holds, summarized ones
    # included: the one count of progress that compaction does not change.
    assistant_turns: int = 0


# --- stream events -------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class TextDelta:
    text: str
    kind: Literal["text"] = "text"


@dataclass(slots=True, frozen=True)
class ReasoningDelta:
    text: str
    kind: Literal["reasoning"] = "reasoning"


@dataclass(slots=True, frozen=True)
class ToolCallEvent:
    """A whole tool call: providers accumulate argument fragments before emitting it."""

    id: str
    name: str
    arguments: str
    kind: Literal["tool_call"] = "tool_call"


@dataclass(slots=True, frozen=True)
class Finish:
    reason: str  # "stop", "tool_calls", "length", "error", ...
    usage: Tokens = field(default_factory=Tokens)
    cost: float = 0.0
    kind: Literal["finish"] = "finish"


StreamEvent = TextDelta | ReasoningDelta | ToolCallEvent | Finish
