"""What every session actor shares, and where a session sits in its tree.

Apart from the actors that use them so that the session actor, the turn builder and the
child sessions can all name them without importing one another.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from harness.agents import get_agent
from harness.config import Config
from harness.context.budget import Budget
from harness.messages.mailbox import FeedMessage, PermissionMessage, QuestionMessage
from harness.messages.model import Rule, Session
from harness.messages.provider import ToolSpec
from harness.permissions.ruleset import DEFAULT_RULES, merge
from harness.storage.port import LedgerPort
from harness.tools.base import Tool
from harness.tools.sandbox import Sandbox


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

    def rules_of(self, session: Session) -> tuple[Rule, ...]:
        """A session's own merged ruleset: defaults < agent < config < session."""
        agent = get_agent(session.agent)
        return tuple(merge(DEFAULT_RULES, agent.rules, self.config.rules, session.permission))


@dataclass(frozen=True, slots=True)
class Lineage:
    """Where a session sits in its tree: what its ancestors allow and how deep it is."""

    depth: int = 0
    ceilings: tuple[tuple[Rule, ...], ...] = ()  # each ancestor's merged ruleset
    trace_id: str = ""  # the root session's id
    budget: Budget | None = None  # the run's budget, shared by the whole tree
