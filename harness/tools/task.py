"""task: run a piece of work in a child session and return its final answer."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, ClassVar

from pydantic import Field

from harness.tools.base import (
    PermissionNeed,
    Tool,
    ToolContext,
    ToolFailure,
    ToolOutput,
    ToolParams,
)

if TYPE_CHECKING:
    from harness.agents import Agent


class TaskParams(ToolParams):
    # OpenCode's names for these arguments (see ToolParams).
    input_aliases: ClassVar[Mapping[str, str]] = {"subagent_type": "agent"}

    description: str = Field(description="A short (3-5 words) description of the task")
    prompt: str = Field(description="The full task for the sub-agent, with all it needs to know")
    agent: str | None = Field(default=None, description="The agent to run it (default: general)")
    session_id: str | None = Field(
        default=None,
        description="Continue an earlier subtask: the session id its result named",
    )


class TaskTool(Tool[TaskParams]):
    name = "task"
    description = (
        "Run a self-contained piece of work (a search across many files, an investigation, "
        "a focused change) in a sub-agent with its own context, and get its final answer "
        "back. The sub-agent sees only the prompt you give it, so include everything it "
        "needs. Several task calls in one reply run in parallel. The result names the "
        "subtask's session id; pass it as session_id to continue that subtask later."
    )
    params = TaskParams

    def permissions(self, args: TaskParams, ctx: ToolContext) -> list[PermissionNeed]:
        # Checked per agent, so a ruleset can allow some sub-agents and not others.
        agent = args.agent or "general"
        return [PermissionNeed("task", agent, agent, {"description": args.description})]

    def title(self, args: TaskParams) -> str:
        return f"task {args.description}"

    async def execute(self, args: TaskParams, ctx: ToolContext) -> ToolOutput:
        if ctx.subtasks is None:
            raise ToolFailure("subtasks are not available here")
        result = await ctx.subtasks.run(
            call_id=ctx.call_id,
            message_id=ctx.message_id,
            description=args.description,
            prompt=args.prompt,
            agent=args.agent,
            session_id=args.session_id,
        )
        footer = f"\n\n<task_metadata>\nsession_id: {result.session_id}\n</task_metadata>"
        metadata = {"session_id": result.session_id, "reason": result.reason}
        if result.reason != "answered":
            detail = f": {result.error}" if result.error else ""
            raise ToolFailure(
                f"the subtask stopped ({result.reason}){detail}. "
                f"Its last words: {result.answer or '(none)'}{footer}"
            )
        return ToolOutput(
            output=(result.answer or "(the subtask gave no answer)") + footer,
            title=f"task {args.description}",
            metadata=metadata,
        )


def task_description(agents: Iterable[Agent]) -> str:
    """The task tool's description with the subagents a session can run, name and purpose
    (DESIGN §12), so the model picks one by what it is for."""
    lines = [f"- {agent.name}: {agent.description or '(no description)'}" for agent in agents]
    if not lines:
        return TaskTool.description
    return TaskTool.description + "\n\nAvailable agents (the agent argument):\n" + "\n".join(
        lines
    )
