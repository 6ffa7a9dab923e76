"""Runner: the loop of DESIGN §1, one step at a time, for one turn of one session.

Every step starts by reading the ledger (``History.sync``) and decides from it alone
whether the turn is answered; the runner's own variables only carry a step's streaming
state. So a runner started on a ledger left by a killed process picks up exactly where
the ledger says the turn was.

A step: record an assistant message → stream the model's reply into parts → hand the
tool calls to the ToolExecutor (which records their results) → decide. The turn ends
when the last assistant message is finished with no tool call left for the model to
see, or on a limit, a denial, an error or a cancel — each recorded as the reason.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal

import structlog
import trio

from harness.context.budget import Budget
from harness.context.compaction import BUDGET_PROMPT, COMPACTION_PROMPT, COMPACTION_SYSTEM
from harness.context.limits import DEFAULT_LIMITS, ModelLimits
from harness.history import History, estimate_tokens, text_of
from harness.messages import ids
from harness.messages.events import Event, NewEvent, StopReason, TurnResult
from harness.messages.mailbox import CallOutcome, ExecuteCalls, FeedMessage, PlannedCall, Publish
from harness.messages.model import (
    AssistantMessage,
    CompactionPart,
    Part,
    ReasoningPart,
    Session,
    StepFinishPart,
    StepStartPart,
    TextPart,
    Tokens,
    ToolPart,
    ToolPending,
)
from harness.messages.provider import (
    Finish,
    ProviderRequest,
    ReasoningDelta,
    TextDelta,
    ToolCallEvent,
    ToolSpec,
    UserTurn,
)
from harness.providers.base import Provider
from harness.providers.errors import ContextOverflowError, ProviderError
from harness.providers.retry import RetryNotice, RetryPolicy, stream_with_retries

log = structlog.get_logger("harness.runner")

MAX_STEPS_PROMPT = (
    "MAXIMUM STEPS REACHED. You have used every step this task was allowed, so tools are "
    "disabled now. Do not call any tool. Answer with text only: say that the step limit "
    "was reached, summarise what was done, list what remains, and recommend next steps."
)
STEP_LIMIT_REFUSAL = "tools are disabled: the step limit was reached; answer with text only"
DOOM_LOOP_THRESHOLD = 3
TEXT_FLUSH_SECONDS = 1.0
# Live deltas are gathered for this long (20 updates a second) before they are published:
# a model streams a chunk per token, and an event per token to every subscriber costs
# more than it shows (with 100 sessions streaming, prompt ack p99 went from 88 to 6 ms).
DELTA_SECONDS = 0.05

UsageSink = Callable[[Tokens, float], None]
RetrySink = Callable[[RetryNotice], Awaitable[None]]


def _canonical(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), sort_keys=True, separators=(",", ":"))
    except json.JSONDecodeError:
        return arguments


@dataclass(frozen=True, slots=True)
class ContextPolicy:
    """How the runner keeps the history within the model's window."""

    limits: ModelLimits = DEFAULT_LIMITS
    keep_tokens: int = 8_000  # recent history kept verbatim after a compaction
    prune_protect: int | None = 40_000  # newest tool output (tokens) never pruned


@dataclass(slots=True)
class _Stream:
    """What one step has streamed so far: the parts still open and the calls made."""

    message: AssistantMessage
    text: TextPart | None = None
    text_buffer: list[str] = field(default_factory=list)
    reasoning: ReasoningPart | None = None
    reasoning_buffer: list[str] = field(default_factory=list)
    calls: list[PlannedCall] = field(default_factory=list)
    finish: Finish | None = None
    last_flush: float = 0.0
    # Deltas not yet published: (part id, field) and the text gathered for it.
    pending_delta: tuple[str, str] | None = None
    pending_text: list[str] = field(default_factory=list)
    last_publish: float = 0.0


class Runner:
    def __init__(
        self,
        *,
        session: Session,
        model_name: str,
        provider: Provider,
        system: Sequence[str],
        system_sources: Sequence[str] = (),
        tool_specs: Sequence[ToolSpec],
        max_steps: int | None,
        ledger_history: History,
        ledger_post: Callable[[Sequence[NewEvent]], None],
        ledger_flush: Callable[[], Awaitable[None]],
        take_steered: Callable[[], Awaitable[None]],
        executor: trio.MemorySendChannel[ExecuteCalls],
        feed: trio.MemorySendChannel[FeedMessage],
        on_usage: UsageSink,
        on_retry: RetrySink,
        retry_policy: RetryPolicy,
        context: ContextPolicy | None = None,
        budget: Budget | None = None,
        show_request: bool = False,
    ) -> None:
        self.session = session
        self._model_name = model_name
        self._provider = provider
        self._system = tuple(system)
        self._system_sources = tuple(system_sources)
        self._tool_specs = tuple(tool_specs)
        self._max_steps = max_steps
        self._history = ledger_history
        self._post = ledger_post
        self._flush = ledger_flush
        self._take_steered = take_steered
        self._executor = executor
        self._feed = feed
        self._on_usage = on_usage
        self._on_retry = on_retry
        self._retry_policy = retry_policy
        self._context = context or ContextPolicy()
        self._budget = budget
        self._show_request = show_request
        # What every request carries besides the history: counted once.
        self._fixed_tokens = sum(estimate_tokens(text) for text in self._system) + sum(
            estimate_tokens(json.dumps(spec.parameters)) + estimate_tokens(spec.description)
            for spec in self._tool_specs
        )

    # --- the loop ---------------------------------------------------------------------------

    async def run_turn(self, user_message_id: str) -> TurnResult:
        history = self._history
        compacted_at = 0  # the step a compaction last ran for: at most once per step
        while True:
            await self._take_steered()
            await self._flush()
            history.sync()
            answer = history.answer_if_done(user_message_id)
            if answer is not None:
                return TurnResult(user_message_id, "answered", answer)
            leftover = history.unanswered_calls(user_message_id)
            if leftover:
                stop = await self._rerun(leftover)
                if stop is not None:
                    return TurnResult(user_message_id, stop, self._last_text(user_message_id))
                continue
            step = history.step_count(user_message_id) + 1
            final: StopReason | None = None
            final_prompt = ""
            spent = self._budget.spent() if self._budget is not None else None
            if spent is not None:
                final, final_prompt = "budget", BUDGET_PROMPT.format(reason=spent)
            elif self._max_steps is not None and step >= self._max_steps:
                final, final_prompt = "max_steps", MAX_STEPS_PROMPT
            if self._too_big():
                if compacted_at == step:
                    return await self._stop(
                        user_message_id,
                        "overflow",
                        "the context is still too large after compaction",
                    )
                compacted_at = step
                stop, error = await self._compact(user_message_id, step)
                if stop is not None:
                    return await self._stop(user_message_id, stop, error)
                continue
            stop, error = await self._step(user_message_id, step, final_prompt)
            if stop == "overflow" and compacted_at != step:
                # The provider said the request does not fit: compact, then retry the step.
                compacted_at = step
                stop, error = await self._compact(user_message_id, step)
                if stop is None:
                    continue
            if stop is None and final is not None:
                stop = final
            if stop is not None:
                await self._flush()
                history.sync()
                return TurnResult(user_message_id, stop, self._last_text(user_message_id), error)

    async def _stop(
        self, user_message_id: str, reason: StopReason, error: str | None
    ) -> TurnResult:
        await self._flush()
        self._history.sync()
        return TurnResult(user_message_id, reason, self._last_text(user_message_id), error)

    def _too_big(self) -> bool:
        limits = self._context.limits
        return self._estimate() > limits.context - limits.reserve

    def _estimate(self) -> int:
        """Tokens the next request would take: the provider's count when there is one."""
        history = self._history
        estimate = history.estimate()
        reported = history.reported_estimate()
        if reported is not None:
            estimate = max(estimate, reported)
        return estimate + self._fixed_tokens

    def _last_text(self, user_message_id: str) -> str:
        steps = self._history.turn_steps(user_message_id)
        for step in reversed(steps):
            text = text_of(self._history.parts_of(step.id))
            if text:
                return text
        return ""

    # --- one step ---------------------------------------------------------------------------

    async def _step(
        self, user_message_id: str, step: int, final_prompt: str
    ) -> tuple[StopReason | None, str | None]:
        """One model reply and its tool calls. A ``final_prompt`` makes it the last step:
        tools are disabled and the prompt (step limit, budget) says why."""
        last_step = bool(final_prompt)
        session = self.session
        message = AssistantMessage(
            id=ids.message_id(),
            session_id=session.id,
            parent_id=user_message_id,
            agent=session.agent,
            model=session.model,
            step=step,
            created=time.time(),
        )
        start = StepStartPart(
            id=ids.part_id(), session_id=session.id, message_id=message.id, step=step
        )
        self._post(
            [
                NewEvent("message.created", session.id, message.model_dump(mode="json")),
                NewEvent("part.created", session.id, start.model_dump(mode="json")),
            ]
        )
        structlog.contextvars.bind_contextvars(
            step=step, message_id=message.id, span_id=message.id, parent_span_id=session.id
        )
        request = ProviderRequest(
            model=self._model_name,
            system=self._system + ((final_prompt,) if last_step else ()),
            messages=tuple(self._history.chat(prune_protect=self._context.prune_protect)),
            tools=() if last_step else self._tool_specs,
            tool_choice="none" if last_step else "auto",
            session_id=session.id,
            step=step,
            assistant_turns=self._history.assistant_turns(),
        )
        log.info("step started", messages=len(request.messages))
        if self._show_request:
            await self._publish_request(request)
        state = _Stream(message)
        try:
            async with stream_with_retries(
                self._provider, request, policy=self._retry_policy, on_retry=self._on_retry
            ) as events:
                async for event in events:
                    if isinstance(event, TextDelta):
                        await self._text(state, event.text)
                    elif isinstance(event, ReasoningDelta):
                        await self._reasoning(state, event.text)
                    elif isinstance(event, ToolCallEvent):
                        self._tool_call(state, event, user_message_id, last_step)
                    elif isinstance(event, Finish):
                        state.finish = event
                await self._flush_deltas(state)
        except ProviderError as error:
            self._close_stream_parts(state)
            self._finish_message(state, error=str(error))
            log.warning("provider error", error=str(error))
            return ("overflow" if isinstance(error, ContextOverflowError) else "error"), str(error)
        finally:
            # On a cancel, keep what was streamed: the partial text is part of the record.
            if state.finish is None:
                self._close_stream_parts(state)
        if state.finish is None:
            error_text = "the model's reply ended without a finish reason"
            self._finish_message(state, error=error_text)
            return "error", error_text
        self._close_stream_parts(state)
        self._finish_message(state)
        if not state.calls:
            return None, None
        outcomes = await self._execute(message.id, state.calls)
        for outcome in outcomes:
            if outcome.stop is not None:
                return outcome.stop, None
        return None, None

    async def _compact(
        self, user_message_id: str, step: int
    ) -> tuple[StopReason | None, str | None]:
        """Replace the history before the recent messages with a summary the model writes.

        The summary is stored as a compaction part of a message of its own; from then on
        the model's view is that summary plus the messages kept verbatim. A summary that
        does not make the context smaller stops the turn instead of looping.
        """
        history = self._history
        session = self.session
        before = self._estimate()
        keep_from = history.keep_from(self._context.keep_tokens)
        message = AssistantMessage(
            id=ids.message_id(),
            session_id=session.id,
            parent_id=user_message_id,
            agent=session.agent,
            model=session.model,
            step=step,
            mode="compaction",
            created=time.time(),
        )
        self._post([NewEvent("message.created", session.id, message.model_dump(mode="json"))])
        request = ProviderRequest(
            model=self._model_name,
            system=(COMPACTION_SYSTEM,),
            messages=(
                *history.chat(prune_protect=self._context.prune_protect),
                UserTurn(COMPACTION_PROMPT),
            ),
            tools=(),
            tool_choice="none",
            session_id=session.id,
            step=step,
            assistant_turns=history.assistant_turns(),
        )
        log.info("compacting", tokens=before, keep_from=keep_from)
        state = _Stream(message)
        pieces: list[str] = []
        try:
            async with stream_with_retries(
                self._provider, request, policy=self._retry_policy, on_retry=self._on_retry
            ) as events:
                async for event in events:
                    if isinstance(event, TextDelta):
                        pieces.append(event.text)
                    elif isinstance(event, Finish):
                        state.finish = event
        except ProviderError as error:
            self._finish_message(state, error=str(error))
            return "overflow", f"compaction failed: {error}"
        summary = "".join(pieces).strip()
        if state.finish is None or not summary:
            self._finish_message(state, error="the compaction produced no summary")
            return "overflow", "the compaction produced no summary"
        part = CompactionPart(
            id=ids.part_id(),
            session_id=session.id,
            message_id=message.id,
            summary=summary,
            keep_from=keep_from,
            tokens_before=before,
        )
        self._post([NewEvent("part.created", session.id, part.model_dump(mode="json"))])
        self._finish_message(state)
        await self._flush()
        history.sync()
        after = self._estimate()
        log.info("compacted", tokens_before=before, tokens_after=after)
        if after >= before * 0.95:
            return "overflow", (
                f"compaction did not shrink the context ({before} -> {after} tokens); "
                "the messages that must be kept do not fit the model's window"
            )
        return None, None

    async def _publish_request(self, request: ProviderRequest) -> None:
        """The exact request, for ``--show-request``: built only when someone asked."""
        data = {
            "step": request.step,
            "model": request.model,
            "system": [
                {"source": source, "text": text}
                for source, text in zip(
                    [*self._system_sources, *(["final"] * len(request.system))],
                    request.system,
                    strict=False,
                )
            ],
            "messages": [asdict(m) for m in request.messages],
            "tools": [spec.name for spec in request.tools],
            "tool_choice": request.tool_choice,
        }
        event = Event(None, time.time(), "step.request", self.session.id, data)
        await self._feed.send(Publish((event,)))

    async def _rerun(self, parts: list[ToolPart]) -> StopReason | None:
        """Run again calls a restart interrupted and recovery judged safe to repeat."""
        calls = [
            PlannedCall(
                part_id=p.id,
                call_id=p.call_id,
                tool=p.tool,
                arguments=json.dumps(p.state.input),
                model_call_id=p.model_call_id,
            )
            for p in parts
        ]
        log.info("re-running interrupted read-only calls", count=len(calls))
        outcomes = await self._execute(parts[0].message_id, calls)
        return next((o.stop for o in outcomes if o.stop is not None), None)

    async def _execute(self, message_id: str, calls: list[PlannedCall]) -> list[CallOutcome]:
        reply_send, reply_receive = trio.open_memory_channel[list[CallOutcome]](1)
        await self._executor.send(ExecuteCalls(message_id, calls, reply_send))
        return await reply_receive.receive()

    # --- streaming into parts ---------------------------------------------------------------

    async def _publish_delta(self, state: _Stream, part_id: str, name: str, delta: str) -> None:
        """Gather a delta; publish what was gathered once DELTA_SECONDS have passed."""
        if state.pending_delta is not None and state.pending_delta != (part_id, name):
            await self._flush_deltas(state)
        state.pending_delta = (part_id, name)
        state.pending_text.append(delta)
        if time.monotonic() - state.last_publish >= DELTA_SECONDS:
            await self._flush_deltas(state)

    async def _flush_deltas(self, state: _Stream) -> None:
        if state.pending_delta is None:
            return
        part_id, name = state.pending_delta
        event = Event(
            None,
            time.time(),
            "part.delta",
            self.session.id,
            {"part_id": part_id, "field": name, "delta": "".join(state.pending_text)},
        )
        state.pending_delta = None
        state.pending_text = []
        state.last_publish = time.monotonic()
        await self._feed.send(Publish((event,)))

    async def _text(self, state: _Stream, delta: str) -> None:
        if state.text is None:
            state.text = TextPart(
                id=ids.part_id(),
                session_id=self.session.id,
                message_id=state.message.id,
                text="",
                start=time.time(),
            )
            state.last_flush = time.monotonic()
            self._post_part(state.text, "part.created")
        state.text_buffer.append(delta)
        await self._publish_delta(state, state.text.id, "text", delta)
        if time.monotonic() - state.last_flush > TEXT_FLUSH_SECONDS:
            # Bound what a crash can lose of a long reply to one flush interval.
            state.last_flush = time.monotonic()
            self._post_part(state.text.model_copy(update={"text": "".join(state.text_buffer)}))

    async def _reasoning(self, state: _Stream, delta: str) -> None:
        if state.reasoning is None:
            state.reasoning = ReasoningPart(
                id=ids.part_id(),
                session_id=self.session.id,
                message_id=state.message.id,
                text="",
                start=time.time(),
            )
            self._post_part(state.reasoning, "part.created")
        state.reasoning_buffer.append(delta)
        await self._publish_delta(state, state.reasoning.id, "reasoning", delta)

    def _tool_call(
        self, state: _Stream, event: ToolCallEvent, user_message_id: str, last_step: bool
    ) -> None:
        try:
            parsed = json.loads(event.arguments) if event.arguments.strip() else {}
        except json.JSONDecodeError:
            parsed = None
        call_id, model_call_id = event.id or ids.call_id(), None
        if self._history.call_id_taken(call_id) or any(c.call_id == call_id for c in state.calls):
            # Two results for one id would make the next request invalid: a fresh id, and
            # the model's own kept beside it in the ledger so a rebuilt history is the same.
            call_id, model_call_id = ids.call_id(), call_id
            log.info("tool call id already used: given a fresh one", model_call_id=model_call_id)
        part = ToolPart(
            id=ids.part_id(),
            session_id=self.session.id,
            message_id=state.message.id,
            call_id=call_id,
            model_call_id=model_call_id,
            tool=event.name,
            state=ToolPending(
                input=parsed if isinstance(parsed, dict) else {}, raw=event.arguments
            ),
        )
        self._post_part(part, "part.created")
        state.calls.append(
            PlannedCall(
                part_id=part.id,
                call_id=part.call_id,
                tool=event.name,
                arguments=event.arguments,
                model_call_id=model_call_id,
                doom_loop=self._repeats(state, event, user_message_id),
                refusal=STEP_LIMIT_REFUSAL if last_step else None,
            )
        )

    def _repeats(self, state: _Stream, event: ToolCallEvent, user_message_id: str) -> bool:
        """True when this call would be the third identical one in a row."""
        wanted = DOOM_LOOP_THRESHOLD - 1
        previous = [(c.tool, _canonical(c.arguments)) for c in state.calls][-wanted:]
        if len(previous) < wanted:
            earlier = self._history.recent_tool_calls(user_message_id, wanted - len(previous))
            previous = [
                (p.tool, json.dumps(p.state.input, sort_keys=True, separators=(",", ":")))
                for p in earlier
            ] + previous
        this = (event.name, _canonical(event.arguments))
        return len(previous) == wanted and all(p == this for p in previous)

    def _post_part(
        self, part: Part, kind: Literal["part.created", "part.updated"] = "part.updated"
    ) -> None:
        self._post([NewEvent(kind, self.session.id, part.model_dump(mode="json"))])

    def _close_stream_parts(self, state: _Stream) -> None:
        now = time.time()
        if state.text is not None:
            self._post_part(
                state.text.model_copy(update={"text": "".join(state.text_buffer), "end": now})
            )
            state.text = None
        if state.reasoning is not None:
            self._post_part(
                state.reasoning.model_copy(
                    update={"text": "".join(state.reasoning_buffer), "end": now}
                )
            )
            state.reasoning = None

    def _finish_message(self, state: _Stream, *, error: str | None = None) -> None:
        finish = state.finish
        tokens = finish.usage if finish else Tokens()
        cost = finish.cost if finish else 0.0
        reason = finish.reason if finish else "error"
        message = state.message.model_copy(
            update={
                "finish": None if error else reason,
                "error": error,
                "tokens": tokens,
                "cost": cost,
                "completed": time.time(),
            }
        )
        done = StepFinishPart(
            id=ids.part_id(),
            session_id=self.session.id,
            message_id=message.id,
            reason=reason if not error else "error",
            tokens=tokens,
            cost=cost,
        )
        self._post(
            [
                NewEvent("part.created", self.session.id, done.model_dump(mode="json")),
                NewEvent("message.updated", self.session.id, message.model_dump(mode="json")),
            ]
        )
        self._on_usage(tokens, cost)
        if self._budget is not None:
            self._budget.add(tokens, cost)
