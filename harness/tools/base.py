"""The tool contract (DESIGN §7).

A tool is a pydantic parameter model (its JSON schema is what the model sees), a pure
``permissions`` method that says what must be allowed before anything happens, and an
``execute`` coroutine that does the work inside the caller's cancel scope.

The ToolExecutor owns the path every call takes: validate the arguments, ask for each
``PermissionNeed``, execute, truncate the output. A tool never asks for permission
itself, so an unapproved command can never start a process.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from harness.messages.model import PermissionAction
from harness.messages.permission import PermissionNeed
from harness.messages.question import QuestionInfo, QuestionOutcome
from harness.messages.todo import Todo
from harness.tools.sandbox import Sandbox

__all__ = [
    "P",
    "PermissionNeed",
    "Questions",
    "SubtaskResult",
    "Subtasks",
    "Todos",
    "Tool",
    "ToolContext",
    "ToolFailure",
    "ToolOutput",
    "ToolParams",
    "ToolRejected",
    "ignored_note",
    "parse_arguments",
]


class ToolParams(BaseModel):
    """Base of every tool's parameter model.

    The schema the model sees forbids other properties, but a call is parsed leniently by
    ``parse_arguments``: the names OpenCode's tool of the same name uses are accepted
    (models trained on it send them), and any other unknown argument is dropped and named
    in a note on the result.
    """

    # Built on first use: a run validates a tool's arguments only after its first request,
    # and the schema the request carries comes from the machine's cache when the CLI keeps
    # one (``registry.params_schema``). A tool's first call builds its model (~0.5 ms).
    model_config = ConfigDict(extra="forbid", defer_build=True)

    # OpenCode's name of an argument -> ours. On input only: the schema keeps our names,
    # so the request bytes stay the same.
    input_aliases: ClassVar[Mapping[str, str]] = {}
    # Arguments OpenCode's schema has that this tool has no use for: dropped without a
    # note. Dotted paths, ``*`` for any list item (``todos.*.id``).
    ignored_inputs: ClassVar[frozenset[str]] = frozenset()


P = TypeVar("P", bound=ToolParams)

# Rounds of dropping unknown arguments: each round drops every one the validation named,
# so a second is needed only when a nested model is reached once its parent is valid.
_MAX_DROP_ROUNDS = 4
# JSON's values that cannot be changed in place (what json.loads makes, and bool).
_IMMUTABLE = frozenset({str, int, float, bool, type(None)})


def parse_arguments(params: type[P], raw: dict[str, Any]) -> tuple[P, list[str]]:
    """Validate a call's arguments: the parsed model and the unknown arguments dropped.

    The one rule for arguments a tool's schema does not have, for every tool: OpenCode's
    names are renamed to ours, the arguments OpenCode has and we do not need are dropped
    quietly, and anything else is dropped and returned (dotted paths) so the result can
    name it. Raises ``ValidationError`` for what is still wrong after that. ``raw`` is
    not changed: the ledger keeps the arguments as the model sent them.
    """
    # A copy the renaming and dropping below may change. Arguments of plain values (most
    # calls: a path, a pattern, a number) need only the dict copied; anything nested is
    # copied deeply, so that a tool changing a list it was given cannot change ``raw``.
    flat = all(type(value) in _IMMUTABLE for value in raw.values())
    data: Any = dict(raw) if flat else copy.deepcopy(raw)
    noted: list[str] = []
    for alias, name in params.input_aliases.items():
        if alias in data:
            value = data.pop(alias)
            if name in data:
                noted.append(alias)  # both spellings: ours wins
            else:
                data[name] = value
    for _ in range(_MAX_DROP_ROUNDS):
        try:
            return params.model_validate(data), list(dict.fromkeys(noted))
        except ValidationError as error:
            extras = [e["loc"] for e in error.errors() if e["type"] == "extra_forbidden"]
            if not extras:
                raise
            for loc in extras:
                _drop(data, loc)
                path = ".".join(str(piece) for piece in loc)
                if not _quietly_ignored(params.ignored_inputs, loc):
                    noted.append(path)
    return params.model_validate(data), list(dict.fromkeys(noted))


def _drop(data: Any, loc: tuple[int | str, ...]) -> None:
    for piece in loc[:-1]:
        try:
            data = data[piece]
        except (KeyError, IndexError, TypeError):
            return
    if isinstance(data, dict):
        data.pop(loc[-1], None)


def _quietly_ignored(patterns: frozenset[str], loc: tuple[int | str, ...]) -> bool:
    path = ".".join("*" if isinstance(piece, int) else str(piece) for piece in loc)
    return path in patterns


def ignored_note(names: list[str]) -> str:
    """The line added to a result whose call carried arguments the tool does not take."""
    return f"\n\n(ignored arguments this tool does not take: {', '.join(names)})"


@dataclass(slots=True, frozen=True)
class SubtaskResult:
    session_id: str
    reason: str  # the child turn's stop reason: "answered", "denied", ...
    answer: str
    error: str | None = None


class Subtasks(Protocol):
    """Runs a child session inside the calling tool (the ``task`` tool).

    Provided by the session that owns the call, so tools never import actors; the child
    lives inside the call's cancel scope, and cancelling the call cancels the child.
    """

    async def run(
        self,
        *,
        call_id: str,
        message_id: str,
        description: str,
        prompt: str,
        agent: str | None,
        session_id: str | None,
    ) -> SubtaskResult: ...


class Todos(Protocol):
    """The session's task list (``todowrite`` / ``todoread``), kept in the ledger."""

    def read(self) -> list[Todo]: ...

    async def write(self, todos: list[Todo]) -> None: ...


class Questions(Protocol):
    """Asks the user, the way a permission is asked (terminal prompt, API, ``answer``).

    Waits for the answer; cancelling the call withdraws the question.
    """

    async def ask(
        self, *, call_id: str, message_id: str, questions: list[QuestionInfo]
    ) -> QuestionOutcome: ...


@dataclass(slots=True, frozen=True)
class ToolContext:
    session_id: str
    message_id: str
    call_id: str
    directory: Path  # the session's working directory, already resolved
    output_dir: Path  # where truncated outputs are saved in full ($HARNESS_HOME/tool-output)
    subtasks: Subtasks | None = None
    todos: Todos | None = None
    questions: Questions | None = None
    # A tool that starts a process group reports its id here, so that the ledger can name
    # it and a harness restarted after a crash can kill what the dead one left running.
    report_process: Callable[[int], Awaitable[None]] | None = None
    # What the gate would answer for a permission and pattern, asking nobody: for checks
    # a tool makes on its own while it runs (each file a search opens, whether a command
    # may reach the network), where an ask per file would be absurd. Only "allow" allows;
    # without a gate (a tool run on its own, in a test) everything is "ask".
    check: Callable[[str, str], PermissionAction] | None = None
    # What every subprocess the tool starts runs under (harness/tools/sandbox.py); None
    # runs it unsandboxed, still without credentials in its environment.
    sandbox: Sandbox | None = None
    # ``directory``'s real path, resolved once for the turn by the executor (tools/paths.py):
    # every call's target is still resolved itself, and judged against this. None: resolve
    # ``directory`` on each use (a tool run on its own, in a test).
    root: str | None = None

    def allows(self, permission: str, pattern: str) -> bool:
        """Whether the rules allow ``permission`` on ``pattern`` without anyone being asked."""
        return self.check is not None and self.check(permission, pattern) == "allow"


@dataclass(slots=True)
class ToolOutput:
    output: str
    title: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)


class ToolFailure(Exception):
    """An expected failure (file not found, no match): the model sees ``str(error)``."""


class ToolRejected(ToolFailure):
    """The user refused what the call asked of them: like a denial, it stops the loop."""


class Tool(ABC, Generic[P]):
    name: ClassVar[str]
    description: ClassVar[str]
    params: type[P]
    # Read-only, idempotent tools may be re-run after a crash (DESIGN §3 Supervision).
    read_only: ClassVar[bool] = False

    def permissions(self, args: P, ctx: ToolContext) -> list[PermissionNeed]:
        """What must be allowed, in order, before ``execute`` runs. No side effects."""
        return []

    def title(self, args: P) -> str:
        """A short human label for progress lines: ``read package.json``."""
        return self.name

    def running_metadata(self, args: P) -> dict[str, Any]:
        """What the ledger's ``running`` record of a call keeps besides its input: read by
        recovery after a crash (an MCP tool says there whether it may be re-run)."""
        return {}

    def touched_paths(self, args: P, ctx: ToolContext) -> list[Path]:
        """The files ``execute`` may create, change or delete: resolved, absolute paths.

        Their content is snapshotted before the call runs, so the session can be diffed
        and reverted (harness/snapshots.py). No side effects. A tool that cannot say (a
        shell command) returns nothing, and its changes are not snapshotted.
        """
        return []

    @abstractmethod
    async def execute(self, args: P, ctx: ToolContext) -> ToolOutput: ...
