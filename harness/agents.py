"""Built-in agents (DESIGN §8): a system prompt plus the rules layered over the defaults."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from harness.messages.model import Rule

AgentMode = Literal["primary", "subagent", "all"]


@dataclass(frozen=True)
class Agent:
    name: str
    description: str
    prompt: str
    rules: tuple[Rule, ...] = ()  # merged after DEFAULT_RULES, before config and session
    mode: AgentMode = "primary"
    steps: int | None = None  # most model turns per prompt; None means no limit
    model: str | None = None  # the model its sessions use unless one is named (flag, API)
    # Tool name (``*`` and ``?`` wildcards) -> enabled; the last matching entry decides.
    # A disabled tool is hidden from the model and refused if called anyway.
    tools: Mapping[str, bool] = field(default_factory=dict)
    source: str = "built-in"  # where it was defined: "built-in" or the files, ", "-joined

    @property
    def primary(self) -> bool:
        return self.mode in ("primary", "all")

    @property
    def subagent(self) -> bool:
        return self.mode in ("subagent", "all")

    def disabled_tools(self, names: Iterable[str]) -> set[str]:
        """The tools of ``names`` this agent's ``tools`` map turns off."""
        if not self.tools:
            return set()
        from harness.permissions.wildcard import match

        off: set[str] = set()
        for name in names:
            verdict = None
            for pattern, enabled in self.tools.items():
                if match(pattern, name):
                    verdict = enabled
            if verdict is False:
                off.add(name)
        return off


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


def get_agent(name: str, catalog: Mapping[str, Agent] | None = None) -> Agent:
    """The agent called ``name`` in ``catalog`` (default: the built-in agents)."""
    agents = AGENTS if catalog is None else catalog
    try:
        return agents[name]
    except KeyError:
        available = ", ".join(sorted(agents))
        raise UnknownAgentError(f"unknown agent {name!r}; available: {available}") from None


def primary_agent(name: str, catalog: Mapping[str, Agent]) -> Agent:
    """The agent a session is started with (``--agent``): one whose mode allows it."""
    choices = ", ".join(sorted(n for n, a in catalog.items() if a.primary)) or "(none)"
    agent = catalog.get(name)
    if agent is None:
        raise UnknownAgentError(f"unknown agent {name!r}; primary agents: {choices}")
    if not agent.primary:
        raise UnknownAgentError(
            f"agent {name!r} is a subagent (for the task tool only); primary agents: {choices}"
        )
    return agent


def subagents(catalog: Mapping[str, Agent]) -> list[Agent]:
    """The agents ``task`` offers, by name."""
    return [catalog[name] for name in sorted(catalog) if catalog[name].subagent]
