"""Built-in agents (DESIGN §8): a system prompt plus the rules layered over the defaults."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from harness.messages.model import Rule

AgentMode = Literal["primary", "subagent"]


@dataclass(frozen=True)
class Agent:
    name: str
    description: str
    prompt: str
    rules: tuple[Rule, ...] = ()  # merged after DEFAULT_RULES, before config and session
    mode: AgentMode = "primary"
    steps: int | None = None  # most model turns per prompt; None means no limit


class UnknownAgentError(KeyError, ValueError):
    """No agent has that name."""

    def __str__(self) -> str:
        # KeyError would quote the message as if it were a key.
        return str(self.args[0]) if self.args else ""


_SHARED = (
    "Work in the project directory you are given; paths are relative to it. "
    "Read the relevant code before drawing conclusions, and say so plainly when you "
    "are unsure or something failed. Keep answers short and concrete."
)

_BUILD_PROMPT = (
    "You are a coding agent. You can read and search files, edit them and run shell "
    "commands to complete the user's task; some actions wait for the user's permission, "
    "and a refusal means you should stop and adapt, not retry the same thing. "
    "Make focused changes, and run the tests or commands that show they work. " + _SHARED
)

_PLAN_PROMPT = (
    "You are a coding agent in planning mode. You may only read and search the project: "
    "you cannot edit files or run shell commands. Study the code and answer with a clear, "
    "step-by-step plan the user can review, naming the files and functions involved. " + _SHARED
)

_GENERAL_PROMPT = (
    "You are a sub-agent doing one task for another agent. You can read and search files, "
    "edit them and run shell commands. Do the task you were given, then answer with what "
    "you found or changed, since your final message is all the caller sees. " + _SHARED
)

AGENTS: dict[str, Agent] = {
    agent.name: agent
    for agent in (
        Agent(
            name="build",
            description="Default agent: reads, edits and runs commands, asking first.",
            prompt=_BUILD_PROMPT,
        ),
        Agent(
            name="plan",
            description="Read-only agent: explores the code and proposes a plan.",
            prompt=_PLAN_PROMPT,
            rules=(
                Rule(permission="edit", pattern="*", action="deny"),
                Rule(permission="bash", pattern="*", action="deny"),
                Rule(permission="webfetch", pattern="*", action="ask"),
            ),
        ),
        Agent(
            name="general",
            description="General-purpose sub-agent for multi-step tasks given by another agent.",
            prompt=_GENERAL_PROMPT,
            # The todo list belongs to the parent session's agent.
            rules=(Rule(permission="todowrite", pattern="*", action="deny"),),
            mode="subagent",
        ),
    )
}


def get_agent(name: str) -> Agent:
    """The agent called ``name``."""
    try:
        return AGENTS[name]
    except KeyError:
        available = ", ".join(sorted(AGENTS))
        raise UnknownAgentError(f"unknown agent {name!r}; available: {available}") from None
