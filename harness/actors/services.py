"""What every session actor shares, and where a session sits in its tree.

Apart from the actors that use them so that the session actor, the turn builder and the
child sessions can all name them without importing one another.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from harness.actors.admission import TurnGate
from harness.agent_files import AgentBook
from harness.config import Config
from harness.context.budget import Budget
from harness.messages.mailbox import FeedMessage, PermissionMessage, QuestionMessage
from harness.messages.model import Rule, Session
from harness.messages.provider import ToolSpec
from harness.permissions.ruleset import DEFAULT_RULES, merge
from harness.providers.limiter import ProviderLimiter, ProviderLimiters
from harness.providers.table import kind_of
from harness.storage.port import LedgerPort
from harness.tools.base import Tool
from harness.tools.sandbox import Sandbox

if TYPE_CHECKING:
    from harness.actors.mcp_hub import McpHub


@dataclass(frozen=True, slots=True)
class SessionServices:
    """What every session actor shares: the ledger, the other actors' mailboxes, config."""

    config: Config
    ledger: LedgerPort
    feed: trio.MemorySendChannel[FeedMessage]
    permission: trio.MemorySendChannel[PermissionMessage]
    tools: Mapping[str, Tool[Any]]
    tool_specs: Mapping[str, ToolSpec]
    questions: trio.MemorySendChannel[QuestionMessage]
    sandbox: Sandbox = field(default_factory=Sandbox)  # what tools' subprocesses run under
    # The default actions Python tools declare (``@harness.tool(permission="allow")``):
    # laid over the defaults, under every agent, config and session rule.
    tool_rules: tuple[Rule, ...] = ()
    # One limiter per provider and server, shared by every session of this harness.
    limiters: ProviderLimiters = field(default_factory=ProviderLimiters)
    mcp: McpHub | None = None  # the MCP servers (DESIGN §12); None when none is configured

    # The agents each session may use (built-in, global, its project's).
    agents: AgentBook = field(default_factory=lambda: AgentBook({}, files=False))
    # When a new turn may start: the steps of the turns going first (actors/admission.py).
    admission: TurnGate = field(default_factory=TurnGate)

    def limiter_for(self, model: str, base_url: str | None) -> ProviderLimiter | None:
        """The shared limiter of the server a session's model talks to; None for what
        talks to no server (a script, a cassette)."""
        kind = kind_of(model)
        if kind is None or not kind.http:
            return None
        return self.limiters.of(kind.name, base_url or kind.base_url)

    def rules_of(self, session: Session) -> tuple[Rule, ...]:
        """A session's own merged ruleset: defaults < agent < config < session."""
        agent = self.agents.agent_of(session)
        mcp = self.mcp.default_rules(agent.name, session.id) if self.mcp is not None else ()
        rules = (DEFAULT_RULES, self.tool_rules, agent.rules, mcp, self.config.rules)
        return tuple(merge(*rules, session.permission))


@dataclass(frozen=True, slots=True)
class Lineage:
    """Where a session sits in its tree: what its ancestors allow and how deep it is."""

    depth: int = 0
    ceilings: tuple[tuple[Rule, ...], ...] = ()  # each ancestor's merged ruleset
    trace_id: str = ""  # the root session's id
    budget: Budget | None = None  # the run's budget, shared by the whole tree
