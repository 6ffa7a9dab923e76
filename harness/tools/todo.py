"""todowrite / todoread: the session's task list, kept in the ledger (DESIGN §7).

``todowrite`` replaces the whole list; ``todoread`` returns it. Each session (a child
too) has its own list; the session provides it through ``ToolContext.todos``.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from harness.messages.todo import Todo
from harness.tools.base import (
    PermissionNeed,
    Tool,
    ToolContext,
    ToolFailure,
    ToolOutput,
    ToolParams,
)

_MARKS = {"pending": "[ ]", "in_progress": "[>]", "completed": "[x]", "cancelled": "[-]"}
_ORDER = ("in_progress", "pending", "completed", "cancelled")


def render_todos(todos: list[Todo]) -> str:
    """A readable list, then the counts: ``[x] write tests (high)`` …"""
    if not todos:
        return "The todo list is empty."
    lines = [f"{_MARKS[t.status]} {t.content} ({t.priority})" for t in todos]
    counts = {status: sum(t.status == status for t in todos) for status in _ORDER}
    summary = ", ".join(
        f"{count} {status.replace('_', ' ')}" for status, count in counts.items() if count
    )
    return "\n".join(lines) + f"\n\n{len(todos)} todos: {summary}"


def _output(todos: list[Todo]) -> ToolOutput:
    counts = {status: sum(t.status == status for t in todos) for status in _ORDER}
    return ToolOutput(
        output=render_todos(todos),
        title=f"{len(todos)} todos",
        metadata={"todos": [t.model_dump() for t in todos], "counts": counts},
    )


class TodoWriteParams(ToolParams):
    # OpenCode's todo items carry an id; ours are kept in order and need none.
    ignored_inputs: ClassVar[frozenset[str]] = frozenset({"todos.*.id"})

    todos: list[Todo] = Field(max_length=200, description="The whole updated todo list")


class TodoWriteTool(Tool[TodoWriteParams]):
    name = "todowrite"
    description = (
        "Create or update your task list for this session: pass the whole list each time "
        "(it replaces the previous one). Use it for work of three steps or more: add the "
        "steps as pending, mark one in_progress before you start it and completed as soon "
        "as it is done, cancel what is no longer needed. The user sees the list."
    )
    params = TodoWriteParams

    def permissions(self, args: TodoWriteParams, ctx: ToolContext) -> list[PermissionNeed]:
        return [PermissionNeed("todowrite", "*", "*")]

    def title(self, args: TodoWriteParams) -> str:
        return f"{len(args.todos)} todos"

    async def execute(self, args: TodoWriteParams, ctx: ToolContext) -> ToolOutput:
        if ctx.todos is None:
            raise ToolFailure("the todo list is not available here")
        await ctx.todos.write(list(args.todos))
        return _output(list(args.todos))


class TodoReadParams(ToolParams):
    pass


class TodoReadTool(Tool[TodoReadParams]):
    name = "todoread"
    description = "Read your current task list for this session (what todowrite last stored)."
    params = TodoReadParams
    read_only = True

    def permissions(self, args: TodoReadParams, ctx: ToolContext) -> list[PermissionNeed]:
        return [PermissionNeed("todoread", "*", "*")]

    def title(self, args: TodoReadParams) -> str:
        return "todos"

    async def execute(self, args: TodoReadParams, ctx: ToolContext) -> ToolOutput:
        if ctx.todos is None:
            raise ToolFailure("the todo list is not available here")
        return _output(ctx.todos.read())
