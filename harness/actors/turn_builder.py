"""The one place a turn is wired: its Runner, its ToolExecutor and what they are given.

A session actor decides when a turn runs and how it ends; what the turn runs with (the
tools its rules leave visible, the executor's services, the runner's limits, policies and
callbacks) is put together here, once per attempt, so the actor does not hold it and a
change to the Runner's or the ToolExecutor's arguments is made in one spot.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Container, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import structlog
import trio

from harness.actors.children import ChildActorFactory, ChildSessions
from harness.actors.question import SessionQuestions
from harness.actors.runner import ContextPolicy, Runner
from harness.actors.services import Lineage, SessionServices
from harness.actors.todos import SessionTodos
from harness.actors.tool_executor import ToolExecutor
from harness.agents import subagents
from harness.context.budget import Budget
from harness.context.limits import limits_for
from harness.context.system import SystemBlock, assemble_system
from harness.history import History
from harness.messages.events import NewEvent
from harness.messages.model import Rule, Session, Tokens, UserMessage
from harness.permissions.ruleset import disabled_tools
from harness.project import FolderLook
from harness.providers import split_model
from harness.providers.base import Provider
from harness.providers.retry import RetryNotice, RetryPolicy
from harness.skills import Skill, discover, has_skill_folders
from harness.tools.base import Tool
from harness.tools.skill import skill_description
from harness.tools.task import task_description

log = structlog.get_logger("harness.turns")
# (session, file, reason) already reported by a skill.invalid event in this process.
_REPORTED: set[tuple[str, str, str]] = set()


@dataclass(frozen=True, slots=True)
class Turn:
    """One turn of a session, as fixed when it starts; passed down, never stored."""

    message_id: str  # the user message the turn answers
    system: tuple[SystemBlock, ...]  # once per turn: git status and AGENTS.md hold still
    budget: Budget | None  # None: unlimited
    skills: tuple[Skill, ...] = ()  # found when the turn starts (harness/skills.py)
    user_message: UserMessage | None = None  # its limits: max_steps, compact


@dataclass(frozen=True, slots=True)
class SessionHooks:
    """What a turn's runner calls back into its session actor for."""

    take_steered: Callable[[], Awaitable[None]]  # steered input joins at a step boundary
    on_usage: Callable[[Tokens, float], None]  # a step's tokens and cost
    on_retry: Callable[[RetryNotice], Awaitable[None]]  # a provider retry is scheduled


@dataclass(frozen=True, slots=True)
class TurnBuilder:
    """Makes a session's turns: one per actor, holding what stays the same between them."""

    services: SessionServices
    lineage: Lineage
    is_child: bool  # a child spends its tree's budget rather than one of its own
    child_slots: trio.Semaphore  # bounds the children of this session running at once
    child_actor: ChildActorFactory
    hooks: SessionHooks

    async def turn(
        self, message_id: str, session: Session, user_message: UserMessage | None = None
    ) -> Turn:
        config = self.services.config
        if self.is_child:
            budget = self.lineage.budget
        else:
            own = Budget(config.budget_tokens, config.budget_cost, config.budget_time)
            budget = own if own.limited else None
        # One look at the project's folders for AGENTS.md, .git and skills: each folder's
        # stat once, and the names it was seen without not asked for again (project.py).
        look = FolderLook()
        directory = Path(session.directory)
        system = await assemble_system(
            self.services.agents.agent_of(session).prompt, directory, config.home, look
        )
        if self.services.mcp is not None:
            # Lazily, by the first turn that may use them; shared by the harness's sessions.
            await self.services.mcp.prepare(session.id, directory)
        skills = await self._skills(session, look) if "skill" in self.services.tools else ()
        if user_message is None:  # a turn resumed: its user message is in the ledger
            user_message = await self.services.ledger.user_message_async(message_id)
        return Turn(message_id, tuple(system), budget, skills, user_message)

    async def _skills(self, session: Session, look: FolderLook) -> tuple[Skill, ...]:
        """The session's skills; each SKILL.md skipped is an event and a log line, once
        per session and file version in this process. Read in a worker thread (the
        folders' files), unless there is no skills folder at all to read."""
        if not has_skill_folders(session.directory, look):
            return ()
        skills, problems = await trio.to_thread.run_sync(discover, Path(session.directory))
        events = []
        for problem in problems:
            key = (session.id, problem.file, problem.reason)
            if key in _REPORTED:
                continue
            _REPORTED.add(key)
            log.warning("skill skipped", file=problem.file, reason=problem.reason)
            data = {"file": problem.file, "reason": problem.reason}
            events.append(NewEvent("skill.invalid", session.id, data))
        if events:
            self.services.ledger.post(events)
        return tuple(skills)

    def build(
        self, turn: Turn, session: Session, provider: Provider, history: History | None = None
    ) -> tuple[Runner, ToolExecutor]:
        """One attempt at ``turn``: its executor (not started yet) and the runner using it
        (``history``: the session's, already read; else read afresh)."""
        services = self.services
        config = services.config
        ledger = services.ledger
        own = services.rules_of(session)
        layers: Sequence[Sequence[Rule]] = (own, *self.lineage.ceilings)
        hidden = set().union(*(disabled_tools(services.tools, rules) for rules in layers))
        catalog = services.agents.of(session)
        agent = services.agents.agent_of(session)
        hidden |= agent.disabled_tools(services.tools)  # the agent's ``tools`` map
        builtin = {name: tool for name, tool in services.tools.items() if name not in hidden}
        if not turn.skills:
            builtin.pop("skill", None)  # nothing to load: the tool would only cost tokens
        tools: Mapping[str, Tool[Any]] = builtin
        disabled: Container[str] = frozenset(hidden)
        specs = [services.tool_specs[name] for name in tools]
        if "task" in tools:
            # The subagents this session's catalog offers, by name and description.
            described = task_description(subagents(catalog))
            specs = [replace(s, description=described) if s.name == "task" else s for s in specs]
        if "skill" in tools:
            listed = skill_description(turn.skills)
            specs = [replace(s, description=listed) if s.name == "skill" else s for s in specs]
        source = None
        if services.mcp is not None:
            from harness.actors.turn_tools import TurnTools  # with the SDK: only when needed

            live = TurnTools(
                tools,  # the built-in ones this agent and these rules leave
                {spec.name: spec for spec in specs},
                lambda: services.rules_of(session),
                self.lineage.ceilings,
                services.mcp,
                session.id,
                lambda: [p for m in ledger.messages(session.id) for p in m.parts],
            )
            tools, disabled, specs, source = live, live.disabled, [], live.specs
            layers = live.layers
        subtasks = ChildSessions(
            services, session, self.lineage, self.child_slots, self.child_actor, turn.budget
        )
        executor = ToolExecutor(
            session_id=session.id,
            directory=Path(session.directory),
            project=session.directory,
            tools=tools,
            disabled=disabled,
            layers=layers,
            ledger=ledger,
            permission=services.permission,
            output_dir=config.tool_output_dir,
            subtasks=subtasks,
            todos=SessionTodos(session.id, ledger),
            questions=SessionQuestions(session.id, services.questions),
            yes=config.yes,
            sandbox=services.sandbox,
        )
        user_message = turn.user_message
        turn_steps = user_message.max_steps if user_message is not None else None
        compact_only = user_message is not None and user_message.compact
        runner = Runner(
            session=session,
            model_name=split_model(session.model)[1],
            provider=provider,
            system=[block.text for block in turn.system],
            system_sources=[block.source for block in turn.system],
            tool_specs=specs,
            tool_source=source,
            max_steps=turn_steps or config.max_steps or agent.steps,
            ledger_history=history or History(ledger, session.id),
            ledger_post=ledger.post,
            # What the runner waits for before it reads: this session's own writes. On a
            # shared ledger a flush is a transaction even with nothing to wait for (the
            # first step's, right after the turn's claim was answered, was one a turn).
            ledger_flush=partial(ledger.settle, session.id),
            take_steered=self.hooks.take_steered,
            executor=executor.mailbox,
            feed=services.feed,
            on_usage=self.hooks.on_usage,
            on_retry=self.hooks.on_retry,
            retry_policy=RetryPolicy(
                max_attempts=config.retry_attempts, initial_delay=config.retry_initial_delay
            ),
            context=ContextPolicy(
                limits=limits_for(session.model, config.model_limits),
                keep_tokens=config.compaction_keep_tokens,
                prune_protect=config.prune_protect_tokens,
            ),
            budget=turn.budget,
            show_request=config.show_request,
            compact_only=compact_only,
        )
        return runner, executor
