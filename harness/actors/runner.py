"""Runner: the loop of DESIGN §1, one step at a time, for one turn of one session.

Every step starts by reading the ledger (``History.sync``) and decides from it alone
whether the turn is answered; the runner's own variables only say whether this step
was already compacted. So a runner started on a ledger left by a killed process picks
up exactly where the ledger says the turn was.

A step: record an assistant message → stream the model's reply into parts → hand the
tool calls to the ToolExecutor (which records their results) → decide. Each step (and a
compaction, a re-run) answers the loop with an outcome (``messages.outcome``): go on, or
stop with a reason, which ``run_turn`` turns into the ``TurnResult`` in one place. The
turn ends when the last assistant message is finished with no tool call left for the
model to see, or on a limit, a denial, an error or a cancel — each recorded as the reason.

Asking the model and recording the reply as parts is ``recording.Recorder``'s; the
compaction turn is ``context.compaction.compact``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace

import trio

from harness.actors.recording import Post, Recorder, RetrySink, UsageSink
from harness.context.budget import BUDGET_PROMPT, Budget
from harness.context.compaction import compact
from harness.context.limits import DEFAULT_LIMITS, ModelLimits
from harness.history import History, estimate_tokens, text_of
from harness.logs import get_logger
from harness.messages.events import StopReason, TurnResult
from harness.messages.mailbox import CallOutcome, ExecuteCalls, FeedMessage, PlannedCall
from harness.messages.model import Session, Tokens, ToolPart
from harness.messages.outcome import Next, Overflow, StepOutcome, Stop
from harness.messages.provider import ToolSpec
from harness.providers.base import Provider
from harness.providers.errors import ContextOverflowError
from harness.providers.retry import RetryPolicy

log = get_logger("harness.runner")

MAX_STEPS_PROMPT = (
    "MAXIMUM STEPS REACHED. You have used every step this task was allowed, so tools are "
    "disabled now. Do not call any tool. Answer with text only: say that the step limit "
    "was reached, summarise what was done, list what remains, and recommend next steps."
)
STEP_LIMIT_REFUSAL = "tools are disabled: the step limit was reached; answer with text only"
DOOM_LOOP_THRESHOLD = 3
# Tokens of each tool's parameter schema, by the schema object (kept, so that its id is
# not reused while cached): a turn's runner counted the same ~14 schemas through
# json.dumps again at every turn start (issue 18). Bounded for MCP servers that list
# fresh schemas on every change.
_SCHEMA_TOKENS: dict[int, tuple[dict[str, object], int]] = {}
_SCHEMA_TOKENS_MAX = 1024


def _schema_tokens(parameters: dict[str, object]) -> int:
    cached = _SCHEMA_TOKENS.get(id(parameters))
    if cached is not None and cached[0] is parameters:
        return cached[1]
    tokens = estimate_tokens(json.dumps(parameters))
    if len(_SCHEMA_TOKENS) >= _SCHEMA_TOKENS_MAX:
        _SCHEMA_TOKENS.clear()
    _SCHEMA_TOKENS[id(parameters)] = (parameters, tokens)
    return tokens


@dataclass(frozen=True, slots=True)
class ContextPolicy:
    """How the runner keeps the history within the model's window."""

    limits: ModelLimits = DEFAULT_LIMITS
    keep_tokens: int = 8_000  # recent history kept verbatim after a compaction
    prune_protect: int | None = 40_000  # newest tool output (tokens) never pruned


@dataclass(frozen=True, slots=True)
class LastStep:
    """Why the next step is the last one (tools disabled) and what the model is told."""

    reason: StopReason
    prompt: str


class Runner:
    """Runs one turn of one session: the loop, its steps and what each step hands on."""

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
        ledger_post: Post,
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
        tool_source: Callable[[], Awaitable[Sequence[ToolSpec]]] | None = None,
        compact_only: bool = False,
    ) -> None:
        self.session = session
        # Tools that can change between steps (MCP servers: started, listed again after
        # tools/list_changed, loaded by mcp_search): asked for at each step instead.
        self._tool_source = tool_source
        self._compact_only = compact_only
        self._system = tuple(system)
        self._system_sources = tuple(system_sources)
        self._tool_specs = tuple(tool_specs)
        self._max_steps = max_steps
        self._history = ledger_history
        self._flush = ledger_flush
        self._take_steered = take_steered
        self._executor = executor  # unbounded: a step's calls never wait to be handed over
        self._outcomes_send, self._outcomes = trio.open_memory_channel[list[CallOutcome]](
            math.inf
        )
        self._on_usage = on_usage
        self._context = context or ContextPolicy()
        self._budget = budget
        self._show_request = show_request
        self._recorder = Recorder(
            session=session,
            model_name=model_name,
            provider=provider,
            retry_policy=retry_policy,
            on_retry=on_retry,
            history=ledger_history,
            post=ledger_post,
            feed=feed,
            on_usage=self._count_usage,
            prune_protect=self._context.prune_protect,
        )
        # What every request carries besides the history: counted once (again when the
        # tools change).
        self._fixed_tokens = self._count_fixed()

    def _count_fixed(self) -> int:
        return sum(estimate_tokens(text) for text in self._system) + sum(
            _schema_tokens(spec.parameters) + estimate_tokens(spec.description)
            for spec in self._tool_specs
        )

    async def _refresh_tools(self) -> None:
        if self._tool_source is None:
            return
        specs = await self._tool_source()
        if specs is not self._tool_specs:  # the source hands out the same tuple until a change
            self._tool_specs = tuple(specs)
            self._fixed_tokens = self._count_fixed()

    # --- the loop ---------------------------------------------------------------------------

    async def run_turn(self, user_message_id: str) -> TurnResult:
        """Take steps until one says stop; where the turn is comes from the ledger alone."""
        try:
            return await self._run_turn(user_message_id)
        finally:
            self._history.close()  # the ledger keeps nothing more for it

    async def _run_turn(self, user_message_id: str) -> TurnResult:
        compacted_at = 0  # the step a compaction last ran for: at most once per step
        if self._compact_only:
            return await self._compact_on_request(user_message_id)
        while True:
            await self._take_steered()
            await self._flush()
            await self._refresh_tools()
            await self._history.catch_up()
            step = self._history.step_count(user_message_id) + 1
            outcome = await self._advance(user_message_id, step, compacted_at != step)
            if isinstance(outcome, Stop):
                return await self._result(user_message_id, outcome)
            if outcome.compacted:
                compacted_at = step

    async def _advance(self, user_message_id: str, step: int, may_compact: bool) -> Next | Stop:
        """What the ledger says comes next: the answer, interrupted calls, a compaction
        when the history no longer fits, or a step."""
        history = self._history
        answer = history.answer_if_done(user_message_id)
        if answer is not None:
            return Stop("answered", answer=answer)
        leftover = history.unanswered_calls(user_message_id)
        if leftover:
            return await self._rerun(leftover)
        if self._too_big():
            if not may_compact:
                return Stop("overflow", "the context is still too large after compaction")
            return await self._compact(user_message_id, step)
        outcome = await self._step(user_message_id, step, self._last_step(step))
        if isinstance(outcome, Overflow):
            # The provider said the request does not fit: compact, then retry the step.
            if not may_compact:
                return Stop("overflow", outcome.error)
            return await self._compact(user_message_id, step)
        return outcome

    async def _result(self, user_message_id: str, stop: Stop) -> TurnResult:
        answer = stop.answer
        if answer is None:
            # The last step's text, once what it posted is in the ledger. An answer
            # found in the history needs neither (nothing was posted since the read):
            # the session actor's flush after ``turn.finished`` covers the turn's writes.
            await self._flush()
            await self._history.catch_up()
            answer = self._last_text(user_message_id)
        return TurnResult(user_message_id, stop.reason, answer, stop.error)

    def _last_step(self, step: int) -> LastStep | None:
        spent = self._budget.spent() if self._budget is not None else None
        if spent is not None:
            return LastStep("budget", BUDGET_PROMPT.format(reason=spent))
        if self._max_steps is not None and step >= self._max_steps:
            return LastStep("max_steps", MAX_STEPS_PROMPT)
        return None

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
        history = self._history
        steps = reversed(history.turn_steps(user_message_id))
        return next((text for s in steps if (text := text_of(history.parts_of(s.id)))), "")

    def _count_usage(self, tokens: Tokens, cost: float) -> None:
        self._on_usage(tokens, cost)
        if self._budget is not None:
            self._budget.add(tokens, cost)

    # --- one step ---------------------------------------------------------------------------

    async def _step(self, user_message_id: str, step: int, last: LastStep | None) -> StepOutcome:
        """One model reply and its tool calls. The last step (step limit, budget) has its
        tools disabled and a prompt that says why."""
        recorder = self._recorder
        with recorder.open(user_message_id, step) as reply:
            request = recorder.request(
                step,
                self._system if last is None else (*self._system, last.prompt),
                tools=self._tool_specs if last is None else (),
                tool_choice="auto" if last is None else "none",
            )
            log.info("step started", messages=len(request.messages))
            if self._show_request:
                await recorder.publish_request(request, self._system_sources)
            error = await recorder.read(reply, request)
            if error is not None:
                reply.finish_message(error=str(error))
                log.warning("provider error", error=str(error))
                if isinstance(error, ContextOverflowError):
                    return Overflow(str(error))
                return Stop("error", str(error))
            if reply.finish is None:
                error_text = "the model's reply ended without a finish reason"
                reply.finish_message(error=error_text)
                return Stop("error", error_text)
            reply.finish_message()
            if reply.tool_calls:
                refusal = None if last is None else STEP_LIMIT_REFUSAL
                calls = self._planned(user_message_id, reply.tool_calls, refusal)
                stop = await self._execute(reply.message.id, calls)
                if stop is not None:
                    return stop
        return Next() if last is None else Stop(last.reason)

    async def _compact(self, user_message_id: str, step: int) -> Next | Stop:
        keep = self._context.keep_tokens
        return await compact(
            self._recorder, user_message_id, step, keep, estimate=self._estimate, flush=self._flush
        )

    async def _compact_on_request(self, user_message_id: str) -> TurnResult:
        """A turn the user asked for (chat's ``/compact``): summarize everything, keep
        nothing verbatim, and end; the summary's message is the turn's only step."""
        await self._flush()
        await self._history.catch_up()
        before = self._estimate()
        outcome = await compact(
            self._recorder,
            user_message_id,
            1,
            0,
            estimate=self._estimate,
            flush=self._flush,
            require_shrink=False,
        )
        if isinstance(outcome, Stop):
            return await self._result(user_message_id, outcome)
        after = self._estimate()
        answer = f"compacted: about {before} → {after} tokens"
        return await self._result(user_message_id, Stop("answered", answer=answer))

    async def _rerun(self, parts: list[ToolPart]) -> Next | Stop:
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
        stop = await self._execute(parts[0].message_id, calls)
        return stop if stop is not None else Next()

    async def _execute(self, message_id: str, calls: list[PlannedCall]) -> Stop | None:
        """Hand the calls to the ToolExecutor; a stop when one call's outcome ends the turn.

        The answer comes on the runner's channel for the turn: ``ask``'s channel a
        request cost ~4.4 µs and ~20 Python calls a step. An answer that does not list
        these calls is an earlier ask's, abandoned (there is none today: a cancel ends
        the runner and its executor together), and is dropped as ``ask`` would drop it.
        """
        await trio.lowlevel.checkpoint_if_cancelled()  # a cancelled runner sends nothing
        self._executor.send_nowait(ExecuteCalls(message_id, calls, self._outcomes_send))
        wanted = [call.call_id for call in calls]
        while True:
            outcomes = await self._outcomes.receive()
            if [outcome.call_id for outcome in outcomes] == wanted:
                return next((Stop(o.stop) for o in outcomes if o.stop is not None), None)

    def _planned(
        self, user_message_id: str, calls: list[PlannedCall], refusal: str | None
    ) -> list[PlannedCall]:
        """The recorded calls as the executor is to run them: refused, or doom-loop checked."""
        planned: list[PlannedCall] = []
        for call in calls:
            doom_loop = self._repeats(planned, call, user_message_id)
            if doom_loop or refusal is not None:
                call = replace(call, doom_loop=doom_loop, refusal=refusal)
            planned.append(call)
        return planned

    def _repeats(self, before: list[PlannedCall], call: PlannedCall, user_message_id: str) -> bool:
        """True when this call would be the third identical one in a row."""
        wanted = DOOM_LOOP_THRESHOLD - 1
        previous = [(c.tool, _canonical(c.arguments)) for c in before][-wanted:]
        if len(previous) < wanted:
            earlier = self._history.recent_tool_calls(user_message_id, wanted - len(previous))
            previous = [
                (p.tool, _canonical_json(p.state.input))
                for p in earlier
            ] + previous
        this = (call.tool, _canonical(call.arguments))
        return len(previous) == wanted and all(p == this for p in previous)


# ``json.dumps(…, sort_keys=True, separators=(",", ":"))``, its encoder made once rather
# than per call: the doom-loop check encodes three calls' arguments a step.
_canonical_json = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode


def _canonical(arguments: str) -> str:
    try:
        return _canonical_json(json.loads(arguments))
    except json.JSONDecodeError:
        return arguments
