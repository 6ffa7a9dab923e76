"""Child sessions: what the ``task`` tool runs (the session tree of DESIGN §3).

A child is a SessionActor of its own, with its own ledger session (``parent_id`` set),
started inside the parent's tool call: it lives in that call's cancel scope, so
cancelling the parent cancels the child and everything under it. Its permissions are
capped by its ancestors' (each ancestor's ruleset is a further layer the strictest
answer of which wins), and the tree is bounded in depth and in children running at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import structlog
import trio

from harness.actors.event_feed import subscription
from harness.actors.new_session import join_tree, new_session, record_session
from harness.actors.services import Lineage, SessionServices
from harness.agents import subagents
from harness.context.budget import Budget
from harness.messages import ids
from harness.messages.events import NewEvent, wait_turn_finished
from harness.messages.model import InboxItem, Session, SubtaskPart
from harness.providers import resolve_model, split_model
from harness.providers.errors import ProviderError
from harness.tools.base import SubtaskResult, ToolFailure

log = structlog.get_logger("harness.children")


class ChildActor(Protocol):
    """The session actor a child runs as (``SessionActor``, which this module never imports)."""

    async def run(self, *, task_status: trio.TaskStatus[None] = ...) -> None: ...


# (child session id, its lineage, the call id its span hangs under) -> its actor
ChildActorFactory = Callable[[str, Lineage, str], ChildActor]


class ChildSessions:
    """The ``Subtasks`` a session gives its tool calls."""

    def __init__(
        self,
        services: SessionServices,
        parent: Session,
        lineage: Lineage,
        limiter: trio.Semaphore,
        child_actor: ChildActorFactory,
        budget: Budget | None = None,
    ) -> None:
        self._services = services
        self._parent = parent
        self._lineage = lineage
        self._limiter = limiter
        self._child_actor = child_actor
        self._budget = budget

    async def run(
        self,
        *,
        call_id: str,
        message_id: str,
        description: str,
        prompt: str,
        agent: str | None,
        session_id: str | None,
    ) -> SubtaskResult:
        config = self._services.config
        if self._lineage.depth + 1 > config.max_task_depth:
            raise ToolFailure(
                f"cannot start a subtask: sessions may nest at most {config.max_task_depth} "
                "deep; do this part of the work yourself"
            )
        ledger = self._services.ledger
        if session_id is not None:
            child = ledger.session(session_id)
            if child is None or child.parent_id != self._parent.id:
                raise ToolFailure(f"{session_id} is not a subtask session of this session")
        else:
            name = agent or "general"
            catalog = self._services.agents.of(self._parent)
            chosen = catalog.get(name)
            if chosen is None:
                offered = ", ".join(a.name for a in subagents(catalog)) or "(none)"
                raise ToolFailure(f"unknown agent {name[:100]!r}; available agents: {offered}")
            model = self._parent.model
            if chosen.model:  # the agent's own model, checked as a session's would be
                try:
                    split_model(chosen.model)
                except ProviderError as error:
                    raise ToolFailure(f"agent {name}: {error}") from None
                model = resolve_model(chosen.model)
            child = new_session(
                parent_id=self._parent.id,
                title=description[:50],
                directory=self._parent.directory,
                agent=name,
                model=model,
            )
            self._services.agents.bind(child.id, catalog)
        async with self._limiter:
            return await self._run(
                child, call_id, message_id, description, prompt, session_id is None
            )

    async def _run(
        self,
        child: Session,
        call_id: str,
        message_id: str,
        description: str,
        prompt: str,
        new: bool,
    ) -> SubtaskResult:
        services = self._services
        ledger = services.ledger
        marker = SubtaskPart(
            id=ids.part_id(),
            session_id=self._parent.id,
            message_id=message_id,
            call_id=call_id,
            child_session_id=child.id,
            description=description,
        )
        item = InboxItem(id=ids.message_id(), session_id=child.id, text=prompt, created=time.time())
        events = [
            NewEvent.of("part.created", self._parent.id, marker),
            NewEvent.of("inbox.added", child.id, item),
        ]
        parent_rules = services.rules_of(self._parent)
        lineage = Lineage(
            depth=self._lineage.depth + 1,
            ceilings=(*self._lineage.ceilings, parent_rules),
            trace_id=self._lineage.trace_id or self._parent.id,
            budget=self._budget,
        )
        actor = self._child_actor(child.id, lineage, call_id)
        log.info("subtask started", child_session_id=child.id, call_id=call_id)
        async with (
            subscription(services.feed, child.id) as events_channel,
            trio.open_nursery() as nursery,
        ):
            if new:
                await record_session(ledger, services.feed, child, *events)
            else:
                await join_tree(services.feed, child)
                await ledger.write(events)
            await nursery.start(actor.run)
            result = await wait_turn_finished(events_channel, message_id=item.id)
            if result is not None:
                nursery.cancel_scope.cancel()
        if result is not None:
            log.info("subtask finished", child_session_id=child.id)
            return SubtaskResult(child.id, result.reason, result.answer or "", result.error)
        raise ToolFailure(f"the subtask session {child.id} stopped without an answer")
