"""A deterministic provider driven by a JSON script, for tests, demos and benchmarks.

The script is a list of turns (or ``{"turns": [...]}``). The turn answered is chosen by
the number of assistant turns already in the request's history, so the same script gives
the same answers after a restart from the ledger. A turn is an object with any of:

``text``          the answer text (streamed in ``chunks`` pieces, default 1)
``reasoning``     reasoning text, streamed before the answer
``tool_calls``    ``[{"name": "read", "arguments": {...} or "raw json", "id"?: "..."}]``
``delay``         seconds to wait before the first event (a slow model; cancellable)
``chunk_delay``   seconds between streamed pieces
``error``         ``{"kind": "retryable|overflow|auth|bad_request|truncated", "message": ...}``
``fail_first``    the same, plus ``"times": N``: the first N attempts at this turn fail
``usage``         ``{"input": N, "output": N}`` tokens reported on finish
``finish``        the finish reason (default: ``tool_calls`` when there are calls, else ``stop``)
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import trio
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness import project
from harness.messages.model import Tokens
from harness.messages.provider import (
    AssistantTurn,
    Finish,
    ProviderRequest,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    ToolCallEvent,
    UserTurn,
)
from harness.providers.errors import (
    AuthError,
    BadRequestError,
    ContextOverflowError,
    ProviderError,
    RetryableError,
    TruncatedStreamError,
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ScriptedCall(_Strict):
    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)
    id: str | None = None


class ScriptedError(_Strict):
    kind: Literal["retryable", "overflow", "auth", "bad_request", "truncated"] = "retryable"
    message: str = "scripted error"
    times: int = 1
    retry_after: float | None = None


class ScriptedUsage(_Strict):
    input: int = 0
    output: int = 0


class ScriptedTurn(_Strict):
    text: str = ""
    reasoning: str = ""
    tool_calls: list[ScriptedCall] = Field(default_factory=list)
    delay: float = 0.0
    chunk_delay: float = 0.0
    chunks: int = Field(default=1, ge=1)
    error: ScriptedError | None = None
    fail_first: ScriptedError | None = None
    usage: ScriptedUsage | None = None
    finish: str | None = None


class ScriptError(ValueError):
    """The script file is missing or malformed; the message says where."""


class Script(_Strict):
    turns: list[ScriptedTurn]
    subtasks: dict[str, list[ScriptedTurn]] = Field(default_factory=dict)


# Parsed scripts by file, while the file's stat holds: a daemon makes a provider for each
# session actor, i.e. for most turns, and read and validated the same file each time.
# A script is never changed by the provider that plays it. A file changed less than
# RACY_NS before it was read is not kept (coarse timestamps: project.py).
_SCRIPTS: dict[str, tuple[tuple[int, int, int, int, int], Script]] = {}
_SCRIPTS_KEEP = 64


def load_script(path: Path) -> Script:
    key = os.fspath(path)
    try:
        info = os.stat(key)
    except FileNotFoundError as error:
        raise ScriptError(f"script not found: {path}") from error
    except (OSError, ValueError) as error:
        raise ScriptError(f"cannot read script {path}: {error}") from error
    signature = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    cached = _SCRIPTS.get(key)
    if cached is not None and cached[0] == signature:
        return cached[1]
    script = _parse_script(path)
    if time.time_ns() - max(info.st_mtime_ns, info.st_ctime_ns) > project.RACY_NS:
        if len(_SCRIPTS) >= _SCRIPTS_KEEP:
            _SCRIPTS.clear()
        _SCRIPTS[key] = (signature, script)
    return script


def _parse_script(path: Path) -> Script:
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError as error:
        raise ScriptError(f"script not found: {path}") from error
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ScriptError(f"cannot read script {path}: {error}") from error
    if isinstance(raw, list):
        raw = {"turns": raw}
    if not isinstance(raw, dict):
        raise ScriptError(f'script {path}: expected a list of turns or {{"turns": [...]}}')
    try:
        return Script.model_validate(raw)
    except ValidationError as error:
        raise ScriptError(f"script {path}: {error}") from error


def _call_id(scope: str, turn_index: int, call_index: int) -> str:
    # 9 alphanumeric characters, the one id shape every provider (Mistral included) accepts;
    # the scope (the session) keeps a child's ids apart from its parent's.
    digest = hashlib.sha256(f"{scope}:{turn_index}:{call_index}".encode()).hexdigest()
    return "c" + digest[:8]


def _error(spec: ScriptedError) -> ProviderError:
    kinds: dict[str, type[ProviderError]] = {
        "retryable": RetryableError,
        "overflow": ContextOverflowError,
        "auth": AuthError,
        "bad_request": BadRequestError,
        "truncated": TruncatedStreamError,
    }
    return kinds[spec.kind](spec.message, retry_after=spec.retry_after)


def _pieces(text: str, count: int) -> list[str]:
    if count <= 1 or len(text) <= 1:
        return [text] if text else []
    size = -(-len(text) // count)
    return [text[i : i + size] for i in range(0, len(text), size)]


class ScriptedProvider:
    name = "scripted"

    def __init__(
        self,
        turns: list[ScriptedTurn],
        *,
        subtasks: dict[str, list[ScriptedTurn]] | None = None,
        record: bool = False,
    ) -> None:
        self.turns = turns
        self.subtasks = subtasks or {}
        self.record = record
        self.requests: list[ProviderRequest] = []
        self._attempts: dict[tuple[str, int], int] = {}

    @classmethod
    def from_file(cls, path: Path, *, record: bool = False) -> ScriptedProvider:
        script = load_script(path)
        return cls(script.turns, subtasks=script.subtasks, record=record)

    @classmethod
    def from_turns(
        cls,
        turns: list[dict[str, Any]],
        *,
        subtasks: dict[str, list[dict[str, Any]]] | None = None,
        record: bool = False,
    ) -> ScriptedProvider:
        script = Script.model_validate({"turns": turns, "subtasks": subtasks or {}})
        return cls(script.turns, subtasks=script.subtasks, record=record)

    @asynccontextmanager
    async def stream(self, request: ProviderRequest) -> AsyncIterator[AsyncIterator[StreamEvent]]:
        if self.record:
            self.requests.append(request)
        first = next((m.text for m in request.messages if isinstance(m, UserTurn)), "")
        key = first if first in self.subtasks else ""
        turns = self.subtasks[key] if key else self.turns
        # Progress through the script is the number of replies the history holds (the
        # runner counts them across compactions); a bare request counts its own.
        index = request.assistant_turns or sum(
            1 for message in request.messages if isinstance(message, AssistantTurn)
        )
        if index >= len(turns):
            raise BadRequestError(
                f"the script has {len(turns)} turns and turn {index + 1} was asked for"
            )
        turn = turns[index]
        attempt = self._attempts.get((key, index), 0) + 1
        self._attempts[(key, index)] = attempt
        async with aclosing(self._events(turn, index, attempt, request.session_id)) as events:
            yield events

    async def _events(
        self, turn: ScriptedTurn, index: int, attempt: int, scope: str
    ) -> AsyncGenerator[StreamEvent, None]:
        if turn.delay:
            await trio.sleep(turn.delay)
        if turn.fail_first is not None and attempt <= turn.fail_first.times:
            raise _error(turn.fail_first)
        if turn.error is not None:
            raise _error(turn.error)
        for piece in _pieces(turn.reasoning, turn.chunks):
            yield ReasoningDelta(piece)
            if turn.chunk_delay:
                await trio.sleep(turn.chunk_delay)
        for piece in _pieces(turn.text, turn.chunks):
            yield TextDelta(piece)
            if turn.chunk_delay:
                await trio.sleep(turn.chunk_delay)
        for number, call in enumerate(turn.tool_calls):
            arguments = (
                call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)
            )
            yield ToolCallEvent(call.id or _call_id(scope, index, number), call.name, arguments)
        usage = (
            Tokens(input=turn.usage.input, output=turn.usage.output)
            if turn.usage is not None
            else Tokens(output=len(turn.text) // 4 + len(turn.tool_calls))
        )
        reason = turn.finish or ("tool_calls" if turn.tool_calls else "stop")
        yield Finish(reason, usage)

    async def aclose(self) -> None:
        return None
