"""SessionActor: one per active session. Owns its inbox, its status and its turns.

It takes input from the ledger's inbox one turn at a time (steered input joins the
running turn at the runner's next step boundary), runs each turn's Runner and
ToolExecutor inside a cancel scope of its own, and records how the turn ended.
Cancelling the session cancels that scope: the provider stream, the running tools and
their process groups all stop, and the ledger closes what was open as cancelled.

A runner that raises is supervised one-for-one: its open tool parts are closed as
interrupted and the turn is restarted from the ledger, at most ``restart_limit`` times
within ``restart_window`` seconds; past that the session is marked ``error``.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
import trio

from harness.actors.children import ChildSessions, Lineage
from harness.actors.question import SessionQuestions
from harness.actors.runner import ContextPolicy, Runner
from harness.actors.todos import SessionTodos
from harness.actors.tool_executor import ToolExecutor
from harness.agents import get_agent
from harness.config import Config
from harness.context.budget import Budget
from harness.context.limits import limits_for
from harness.context.system import SystemBlock, assemble_system
from harness.history import RESTARTED, History
from harness.messages import ids
from harness.messages.events import Event, NewEvent, StopReason, TurnResult
from harness.messages.mailbox import (
    CancelTurn,
    ClearSession,
    FeedMessage,
    PermissionMessage,
    Publish,
    QuestionMessage,
    SessionMessage,
)
from harness.messages.model import (
    InboxItem,
    Rule,
    Session,
    SessionStatus,
    TextPart,
    Tokens,
    ToolError,
    ToolPending,
    UserMessage,
)
from harness.messages.provider import ProviderRequest, TextDelta, ToolSpec, UserTurn
from harness.permissions.ruleset import DEFAULT_RULES, disabled_tools, merge
from harness.providers import create_provider, split_model
from harness.providers.base import Provider
from harness.providers.errors import ProviderError
from harness.providers.retry import RetryNotice, RetryPolicy
from harness.storage.ledger import Ledger, LedgerError
from harness.tools.base import Tool
from harness.tools.process import kill_orphans
from harness.tools.sandbox import Sandbox

log = structlog.get_logger("harness.session")


@dataclass(frozen=True, slots=True)
class SessionServices:
    """What every session actor shares: the ledger, the other actors' mailboxes, config."""

    config: Config
    ledger: Ledger
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


MAX_RESUMES = 10
TITLE_PROMPT = (
    "Write a short title, at most 50 characters, for a coding session that starts with the "
    "user's message below. Use the user's language. Answer with the title only: no quotes, "
    "no punctuation at the end."
)


def kill_orphaned_processes(ledger: Ledger, session_id: str) -> int:
    """Kill what the tool calls of a crashed harness left running (their process groups).

    A running call whose tool reported a process group has its identity in the ledger;
    ``kill_orphans`` checks it against the live processes, so a reused group number is
    left alone. Returns how many processes were killed.
    """
    killed = 0
    for part in ledger.open_tool_parts(session_id):
        identity = part.state.metadata.get("process") if part.state.status == "running" else None
        if isinstance(identity, dict):
            killed += kill_orphans(identity)
    if killed:
        log.warning("killed processes left by a crashed harness", count=killed)
    return killed


def close_open_work(
    ledger: Ledger,
    session_id: str,
    reason: str,
    *,
    rerun: frozenset[str] = frozenset(),
) -> list[NewEvent]:
    """Events that close what a stopped turn left open.

    Open tool parts become errors with ``reason``, except calls of the ``rerun`` tools
    (read-only and idempotent) in a step that finished streaming: those go back to
    ``pending`` so the runner runs them again. The assistant messages that owned closed
    parts, or that never finished streaming, are marked with ``reason`` (aborted) — except
    a message with calls going back to pending: its step goes on, and the runner only
    runs the pending calls of a step that is not marked aborted.
    """
    now = time.time()
    events: list[NewEvent] = []
    owners: set[str] = set()
    resumed: set[str] = set()
    unfinished = {m.id for m in ledger.assistant_messages(session_id, unfinished_or_in=set())}
    for part in ledger.open_tool_parts(session_id):
        state = part.state
        if part.tool in rerun and part.message_id not in unfinished:
            again = part.model_copy(update={"state": ToolPending(input=state.input)})
            events.append(NewEvent("part.updated", session_id, again.model_dump(mode="json")))
            resumed.add(part.message_id)
            continue
        start = getattr(state, "start", now)
        closed = part.model_copy(
            update={"state": ToolError(input=state.input, error=reason, start=start, end=now)}
        )
        owners.add(part.message_id)
        events.append(NewEvent("part.updated", session_id, closed.model_dump(mode="json")))
    for message in ledger.assistant_messages(session_id, unfinished_or_in=owners - resumed):
        aborted = message.model_copy(
            update={"error": reason, "completed": message.completed or now}
        )
        events.append(NewEvent("message.updated", session_id, aborted.model_dump(mode="json")))
    return events


def abandon_turn(
    ledger: Ledger,
    session_id: str,
    message_id: str,
    reason: str = RESTARTED,
    *,
    status: SessionStatus = "idle",
) -> list[NewEvent]:
    """Events that end a claimed turn for good, without running it any further.

    Processes its interrupted tool calls left running are killed first.
    """
    kill_orphaned_processes(ledger, session_id)
    result = TurnResult(message_id, "error", "", reason)
    events = [
        *close_open_work(ledger, session_id, reason),
        NewEvent("turn.finished", session_id, result.to_dict()),
    ]
    session = ledger.session(session_id)
    if session is not None:
        ended = session.model_copy(
            update={
                "status": status,
                "error": reason if status == "error" else None,
                "updated": time.time(),
            }
        )
        events.append(NewEvent("session.updated", session_id, ended.model_dump(mode="json")))
    return events


def _root_cause(error: BaseException) -> BaseException:
    """The error inside the nurseries' wrapping: a reason must name what was raised."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


def _ledger_failure(error: BaseException) -> LedgerError | None:
    """The ledger's failure somewhere in ``error`` (a full disk): no restart can help."""
    if isinstance(error, LedgerError):
        return error
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            found = _ledger_failure(inner)
            if found is not None:
                return found
    return None


def derive_title(text: str, limit: int = 50) -> str:
    """The first line of the first prompt, cut on a word boundary to ``limit`` characters."""
    line = " ".join(text.strip().splitlines()[0].split()) if text.strip() else ""
    if len(line) <= limit:
        return line
    cut = line[: limit - 1].rsplit(" ", 1)[0] or line[: limit - 1]
    return cut + "…"


class SessionActor:
    def __init__(
        self,
        services: SessionServices,
        session_id: str,
        *,
        lineage: Lineage | None = None,
        parent_span: str | None = None,
        idle_release: float | None = None,
    ) -> None:
        self._services = services
        # Seconds idle (no input, no turn) after which the actor ends; None: never.
        self._idle_release = idle_release
        # Set, synchronously with the last look at the inbox, once the actor has chosen to
        # end: from then on the supervisor starts a new actor for the session instead.
        self.closing = False
        self._lineage = lineage or Lineage(trace_id=session_id)
        self._parent_span = parent_span
        self._children = trio.Semaphore(services.config.max_children)
        self._ledger = services.ledger
        self.session_id = session_id
        self.mailbox, self._receive = trio.open_memory_channel[SessionMessage](math.inf)
        self._wake = trio.Event()
        self._turn_scope: trio.CancelScope | None = None
        self._provider: Provider | None = None
        self._provider_for: tuple[str, str | None] = ("", None)  # (model, base_url)
        self._restarts: deque[float] = deque()
        self._state: Session | None = None
        self._budget: Budget | None = None
        self._nursery: trio.Nursery | None = None
        self._system: list[SystemBlock] = []

    # --- mailbox ----------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # Spans for the log: a root session's trace is its id; a child's span hangs
        # under the tool call that started it.
        # A child starts in its parent's call task: drop the parent's step and call.
        structlog.contextvars.clear_contextvars()
        self._bind_session_span()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._work)
                task_status.started()
                async with self._receive:
                    async for message in self._receive:
                        if isinstance(message, CancelTurn):
                            message.reply.send_nowait(self._cancel_turn())
                        else:
                            self._wake.set()
                nursery.cancel_scope.cancel()
        finally:
            self.closing = True
            self._answer_leftovers()
            if self._provider is not None:
                with trio.CancelScope(shield=True):
                    await self._provider.aclose()

    def _answer_leftovers(self) -> None:
        """A cancel that reached an actor as it ended is answered: there is no turn."""
        while True:
            try:
                message = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.ClosedResourceError, trio.EndOfChannel):
                return
            if isinstance(message, CancelTurn):
                message.reply.send_nowait(False)

    def _bind_session_span(self) -> None:
        structlog.contextvars.bind_contextvars(
            session_id=self.session_id,
            trace_id=self._lineage.trace_id or self.session_id,
            span_id=self.session_id,
            parent_span_id=self._parent_span,
        )

    def _cancel_turn(self) -> bool:
        if self._turn_scope is None:
            return False
        self._turn_scope.cancel()
        return True

    # --- turns ------------------------------------------------------------------------------

    async def _work(self) -> None:
        # A turn claimed and never finished was cut short by a crash: it goes first.
        for _, message_id, resumes in self._ledger.claimed_turns(self.session_id):
            await self._resume(message_id, resumes)
        while True:
            inbox = self._ledger.inbox(self.session_id)
            if not inbox:
                with trio.move_on_after(self._idle_release or math.inf):
                    await self._wake.wait()
                if not self._wake.is_set() and not self._ledger.inbox(self.session_id):
                    # Idle: let the actor, its provider and its caches go. The inbox was
                    # read after the last wake was sent (input is committed before its
                    # wake), and ``closing`` is set before anything else can run.
                    self.closing = True
                    log.debug("idle session actor released")
                    self.mailbox.close()
                    return
                self._wake = trio.Event()
                continue
            await self._turn(inbox[0])

    async def _take(self, item: InboxItem, session: Session) -> list[NewEvent]:
        """The events that turn an inbox item into a user message, in one transaction."""
        message = UserMessage(
            id=item.id,
            session_id=self.session_id,
            agent=item.agent or session.agent,
            model=item.model or session.model,
            delivery=item.delivery,
            max_steps=item.max_steps,
            created=time.time(),
        )
        part = TextPart(
            id=ids.part_id(), session_id=self.session_id, message_id=item.id, text=item.text
        )
        return [
            NewEvent("inbox.taken", self.session_id, {"id": item.id}),
            NewEvent("message.created", self.session_id, message.model_dump(mode="json")),
            NewEvent("part.created", self.session_id, part.model_dump(mode="json")),
        ]

    async def _take_steered(self) -> None:
        session = self._session()
        items = [i for i in self._ledger.inbox(self.session_id) if i.delivery == "steer"]
        if items:
            events: list[NewEvent] = []
            for item in items:
                events.extend(await self._take(item, session))
            await self._ledger.write(events)

    def _session(self) -> Session:
        """The session as this actor last wrote it; read from the ledger once.

        This actor is the only writer of its session row, so its copy is the truth even
        while its last writes are still on their way to the ledger.
        """
        if self._state is None:
            session = self._ledger.session(self.session_id)
            if session is None:
                raise LookupError(f"session {self.session_id} does not exist")
            self._state = session
        return self._state

    def _save(self, **changes: Any) -> None:
        self._state = self._session().model_copy(update={**changes, "updated": time.time()})
        self._ledger.post(
            [NewEvent("session.updated", self.session_id, self._state.model_dump(mode="json"))]
        )

    def _set_status(self, status: SessionStatus, error: str | None = None) -> None:
        self._save(status=status, error=error)

    def _add_usage(self, tokens: Tokens, cost: float) -> None:
        session = self._session()
        self._save(
            tokens=session.tokens.plus(tokens),
            cost=session.cost + cost,
            # A step that finished means the provider answered: any retry is over.
            status="busy" if session.status == "retry" else session.status,
        )

    async def _on_retry(self, notice: RetryNotice) -> None:
        self._set_status("retry")
        event = Event(
            None,
            time.time(),
            "session.retry",
            self.session_id,
            {"attempt": notice.attempt, "next": notice.at, "error": notice.error},
        )
        await self._services.feed.send(Publish((event,)))
        log.warning("provider retry scheduled", attempt=notice.attempt, delay=notice.delay)

    async def _turn(self, item: InboxItem) -> None:
        # Between turns the row may have been changed through the API (PATCH, refused
        # while a turn runs or input waits): start each turn from the ledger's copy, once
        # this actor's own last posts (a late title) have landed in it.
        await self._ledger.flush()
        self._state = None
        session = self._session()
        events = await self._take(item, session)
        claim = {"message_id": item.id, "session_id": self.session_id, "started": time.time()}
        # The claim is committed with the user message: from here a crash resumes the turn.
        events.append(NewEvent("turn.started", self.session_id, claim))
        sandbox = self._services.sandbox
        if sandbox.unavailable is not None:
            # In each turn's record: its commands ran without the sandbox asked for.
            notice = {
                "requested": sandbox.requested,
                "reason": sandbox.unavailable,
                "notice": sandbox.notice,
            }
            events.append(NewEvent("sandbox.unavailable", self.session_id, notice))
        await self._ledger.write(events)
        # Derived, not asked of the model: a run sends no side requests by default.
        self._save(status="busy", error=None, title=session.title or derive_title(item.text))
        if not session.title and self._services.config.title_model and self._nursery:
            # Off the critical path: the turn never waits for the title, nor fails with it.
            self._nursery.start_soon(self._write_title, item.text)
        await self._run_turn(item.id)

    async def _write_title(self, prompt: str) -> None:
        config = self._services.config
        model = config.title_model or ""
        try:
            with trio.fail_after(30):
                provider = (
                    config.provider_factory(model)
                    if config.provider_factory is not None
                    else create_provider(model, base_url=config.base_url)
                )
                try:
                    request = ProviderRequest(
                        model=split_model(model)[1],
                        system=(TITLE_PROMPT,),
                        messages=(UserTurn(prompt[:2000]),),
                        tools=(),
                        tool_choice="none",
                        session_id=self.session_id,
                    )
                    pieces: list[str] = []
                    async with provider.stream(request) as events:
                        async for event in events:
                            if isinstance(event, TextDelta):
                                pieces.append(event.text)
                finally:
                    if provider is not self._provider:
                        await provider.aclose()
        except (ProviderError, trio.TooSlowError) as error:
            log.warning("title not written", error=str(error))
            return
        title = derive_title(" ".join("".join(pieces).strip().strip('"').split()))
        if title:
            self._save(title=title)
            log.info("title written", title=title)

    async def _resume(self, message_id: str, resumes: int) -> None:
        """Carry on a turn that a crash interrupted, from what the ledger shows."""
        structlog.contextvars.bind_contextvars(turn=message_id)
        kill_orphaned_processes(self._ledger, self.session_id)
        if resumes >= MAX_RESUMES:
            reason = f"the turn was resumed {resumes} times after restarts and kept failing"
            log.error("turn abandoned", resumes=resumes)
            await self._ledger.write(
                [
                    *close_open_work(self._ledger, self.session_id, RESTARTED),
                    NewEvent(
                        "turn.finished",
                        self.session_id,
                        TurnResult(message_id, "error", "", reason).to_dict(),
                    ),
                ]
            )
            self._set_status("error", reason)
            return
        read_only = frozenset(n for n, t in self._services.tools.items() if t.read_only)
        # Nothing is added to the conversation: a call a restart cut off says so in its own
        # result, and a step cut mid-stream is left out of the model's view (History), so
        # when nothing was lost the model gets exactly the request it was answering. The
        # ledger alone records that the turn was resumed.
        events = close_open_work(self._ledger, self.session_id, RESTARTED, rerun=read_only)
        events.append(
            NewEvent(
                "turn.resumed",
                self.session_id,
                {"message_id": message_id, "resumes": resumes + 1},
            )
        )
        await self._ledger.write(events)
        log.info("turn resumed after restart", resumes=resumes + 1)
        self._save(status="busy", error=None)
        await self._run_turn(message_id)

    async def _run_turn(self, message_id: str) -> None:
        structlog.contextvars.bind_contextvars(turn=message_id)
        config = self._services.config
        if self._parent_span is not None:
            self._budget = self._lineage.budget  # a child spends its tree's budget
        else:
            budget = Budget(config.budget_tokens, config.budget_cost, config.budget_time)
            self._budget = budget if budget.limited else None
        # Built once per turn: git status and AGENTS.md do not change between steps.
        session = self._session()
        self._system = await assemble_system(
            get_agent(session.agent).prompt, Path(session.directory), config.home
        )
        log.info("turn started")
        result: TurnResult | None = None
        try:
            result = await self._supervised_turn(message_id)
        except LedgerError as error:
            await self._ledger_failed(message_id, error)
            return
        finally:
            if result is None and self._parent_span is not None:
                # A child dies with its parent's call: it is cancelled, not to be resumed.
                # (The cancel may arrive wrapped in an exception group, hence finally.)
                with trio.CancelScope(shield=True):
                    stopped = await self._stopped(message_id, "cancelled", "cancelled")
                    await self._ledger.write(
                        [NewEvent("turn.finished", self.session_id, stopped.to_dict())]
                    )
                    self._set_status("idle")
        failed = result.reason == "error" and self._session().status == "error"
        self._ledger.post([NewEvent("turn.finished", self.session_id, result.to_dict())])
        if not failed:
            self._set_status("idle")
        await self._ledger.flush()
        log.info("turn finished", reason=result.reason)
        structlog.contextvars.unbind_contextvars("turn", "step", "message_id")
        self._bind_session_span()

    async def _supervised_turn(self, user_message_id: str) -> TurnResult:
        while True:
            try:
                with trio.CancelScope() as scope:
                    self._turn_scope = scope
                    return await self._run_runner(user_message_id)
                # Only a cancel of this scope lands here (CancelTurn).
                return await self._stopped(user_message_id, "cancelled", "cancelled")
            except ProviderError as error:
                # Building the provider failed (no key, unknown model): nothing to restart.
                return await self._stopped(user_message_id, "error", str(error))
            except Exception as error:
                failure = _ledger_failure(error)
                if failure is not None:
                    raise failure from None  # a rerun would fail the same way, tools and all
                log.exception("runner crashed")
                cause = _root_cause(error)
                with trio.CancelScope(shield=True):
                    # Let the runner's posted writes land first: close_open_work reads
                    # the ledger, and a step it cannot see yet would stay open.
                    await self._ledger.flush()
                    await self._ledger.write(
                        close_open_work(self._ledger, self.session_id, "interrupted")
                    )
                if not self._may_restart():
                    reason = (
                        f"the runner crashed {len(self._restarts)} times within "
                        f"{self._services.config.restart_window:.0f} s: "
                        f"{type(cause).__name__}: {cause}"
                    )
                    self._set_status("error", reason)
                    return TurnResult(user_message_id, "error", "", reason)
            finally:
                self._turn_scope = None

    async def _ledger_failed(self, message_id: str, error: LedgerError) -> None:
        """The ledger cannot be written (a full disk): stop the turn, writing nothing.

        The turn's claim stays in the ledger, so the turn is resumed, from what was
        committed, when the session is woken again (a prompt, once there is space) or the
        harness restarts. Whoever follows the turn hears that it ended from a live-only
        ``turn.finished`` event, which needs no disk.
        """
        log.error("turn stopped: the ledger cannot be written", error=str(error))
        self._state = None  # what this actor posted may not have landed
        result = TurnResult(message_id, "error", "", str(error))
        event = Event(None, time.time(), "turn.finished", self.session_id, result.to_dict())
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await self._services.feed.send(Publish((event,)))
        if self._parent_span is not None:
            raise error  # a child's failure is its parent's call's failure
        await self._wake.wait()
        self._wake = trio.Event()
        for _, claimed, resumes in self._ledger.claimed_turns(self.session_id):
            await self._resume(claimed, resumes)

    def _may_restart(self) -> bool:
        config = self._services.config
        now = time.monotonic()
        while self._restarts and now - self._restarts[0] > config.restart_window:
            self._restarts.popleft()
        self._restarts.append(now)
        return len(self._restarts) <= config.restart_limit

    async def _stopped(self, user_message_id: str, reason: StopReason, error: str) -> TurnResult:
        with trio.CancelScope(shield=True):
            self._services.permission.send_nowait(ClearSession(self.session_id))
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                self._services.questions.send_nowait(ClearSession(self.session_id))
            await self._ledger.flush()  # the stopped runner's posts, before reading
            await self._ledger.write(close_open_work(self._ledger, self.session_id, error))
        return TurnResult(user_message_id, reason, "", error)

    async def _run_runner(self, user_message_id: str) -> TurnResult:
        services = self._services
        config = services.config
        session = self._session()
        agent = get_agent(session.agent)
        base_url = session.base_url or config.base_url
        if self._provider is not None and self._provider_for != (session.model, base_url):
            # The session's model or server changed since the last turn: a new client.
            with trio.CancelScope(shield=True):
                await self._provider.aclose()
            self._provider = None
        if self._provider is None:
            factory = config.provider_factory
            self._provider = (
                factory(session.model)
                if factory is not None
                else create_provider(session.model, base_url=base_url, record=config.record)
            )
            self._provider_for = (session.model, base_url)
        user_message = self._ledger.user_message(user_message_id)
        turn_steps = user_message.max_steps if user_message is not None else None
        _, model_name = split_model(session.model)
        layers = (services.rules_of(session), *self._lineage.ceilings)
        hidden = set().union(*(disabled_tools(services.tools, rules) for rules in layers))
        tools = {name: tool for name, tool in services.tools.items() if name not in hidden}
        history = History(self._ledger, session.id)
        executor = ToolExecutor(
            session_id=session.id,
            directory=Path(session.directory),
            project=session.directory,
            tools=tools,
            disabled=frozenset(hidden),
            layers=layers,
            ledger=self._ledger,
            permission=services.permission,
            output_dir=config.tool_output_dir,
            subtasks=ChildSessions(services, session, self._lineage, self._children, self._budget),
            todos=SessionTodos(session.id, self._ledger),
            questions=SessionQuestions(session.id, services.questions),
            yes=config.yes,
            sandbox=services.sandbox,
        )
        runner = Runner(
            session=session,
            model_name=model_name,
            provider=self._provider,
            system=[block.text for block in self._system],
            system_sources=[block.source for block in self._system],
            tool_specs=[services.tool_specs[name] for name in tools],
            max_steps=turn_steps or config.max_steps or agent.steps,
            ledger_history=history,
            ledger_post=self._ledger.post,
            ledger_flush=self._ledger.flush,
            take_steered=self._take_steered,
            executor=executor.mailbox,
            feed=services.feed,
            on_usage=self._add_usage,
            on_retry=self._on_retry,
            retry_policy=RetryPolicy(
                max_attempts=config.retry_attempts, initial_delay=config.retry_initial_delay
            ),
            context=ContextPolicy(
                limits=limits_for(session.model, config.model_limits),
                keep_tokens=config.compaction_keep_tokens,
                prune_protect=config.prune_protect_tokens,
            ),
            budget=self._budget,
            show_request=config.show_request,
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(executor.run)
            try:
                return await runner.run_turn(user_message_id)
            finally:
                nursery.cancel_scope.cancel()
                # A provider's wire cache serves the steps of one turn: an idle session
                # should not hold a second copy of its history until the next prompt.
                forget = getattr(self._provider, "forget_requests", None)
                if forget is not None:
                    forget()
