"""Asking the model and recording its reply: provider events become parts and live deltas.

A step and a compaction ask the model the same way: an assistant message is recorded,
a request is built from the ledger's history, the reply is streamed into the message
and the message is finished with the usage it cost. ``Recorder`` does that for one turn
and ``Reply`` holds one message's streaming state, so the runner only decides what the
reply means.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from typing import Literal, Protocol

import structlog
import trio

from harness.history import History
from harness.messages import ids
from harness.messages.events import Event, NewEvent
from harness.messages.mailbox import FeedMessage, PlannedCall, Publish
from harness.messages.model import (
    AssistantMessage,
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
    ChatMessage,
    Finish,
    ProviderRequest,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    ToolCallEvent,
    ToolSpec,
)
from harness.providers.base import Provider
from harness.providers.errors import ProviderError
from harness.providers.retry import RetryNotice, RetryPolicy, stream_with_retries

log = structlog.get_logger("harness.runner")

TEXT_FLUSH_SECONDS = 1.0
# Live deltas are gathered for this long (20 updates a second) before they are published:
# a model streams a chunk per token, and an event per token to every subscriber costs
# more than it shows (with 100 sessions streaming, prompt ack p99 went from 88 to 6 ms).
DELTA_SECONDS = 0.05

# How long the message a step opens may wait to be committed (``Recorder.open``): the
# bound a crash already has on what it loses of a streaming reply (DESIGN §4).
OPEN_WITHIN_SECONDS = TEXT_FLUSH_SECONDS

UsageSink = Callable[[Tokens, float], None]
RetrySink = Callable[[RetryNotice], Awaitable[None]]


class Post(Protocol):
    """The ledger's fire-and-forget write (``LedgerPort.post``)."""

    def __call__(self, events: Sequence[NewEvent], *, within: float | None = None) -> None: ...


class Recorder:
    """Asks the model for one turn of one session and records each reply in the ledger."""

    def __init__(
        self,
        *,
        session: Session,
        model_name: str,
        provider: Provider,
        retry_policy: RetryPolicy,
        on_retry: RetrySink,
        history: History,
        post: Post,
        feed: trio.MemorySendChannel[FeedMessage],
        on_usage: UsageSink,
        prune_protect: int | None,
    ) -> None:
        self.session = session
        self.history = history
        self.post = post
        self.feed = feed
        self.on_usage = on_usage
        self._model_name = model_name
        self._provider = provider
        self._retry_policy = retry_policy
        self._on_retry = on_retry
        self._prune_protect = prune_protect

    @contextmanager
    def open(
        self, user_message_id: str, step: int, mode: Literal["step", "compaction"] = "step"
    ) -> Iterator[Reply]:
        """Record a new assistant message; what is logged inside is that message's span."""
        session = self.session
        message = AssistantMessage(
            id=ids.message_id(),
            session_id=session.id,
            parent_id=user_message_id,
            agent=session.agent,
            model=session.model,
            step=step,
            mode=mode,
            created=time.time(),
        )
        events = [NewEvent.of("message.created", session.id, message)]
        if mode == "step":
            start = StepStartPart(
                id=ids.part_id(), session_id=session.id, message_id=message.id, step=step
            )
            events.append(NewEvent.of("part.created", session.id, start))
        # Posted as the model is asked, and needed by nobody before its reply begins
        # (the chat and ACP show parts; a step's parts and deltas say it began): it may
        # wait for the reply's first part, or the step's end, to share their transaction,
        # and that part's own 2 ms bound then holds. With the usual 2 ms it was committed
        # alone whenever the model took longer than that: a transaction more per step
        # (0.1–0.2 ms of CPU), on every step of a real model. A model still silent after
        # OPEN_WITHIN_SECONDS sees it committed then; a crash before loses a step that
        # had recorded nothing else, which the turn asks again.
        self.post(events, within=OPEN_WITHIN_SECONDS)
        # bind/reset: bound_contextvars' restore, without a second generator frame a step.
        tokens = structlog.contextvars.bind_contextvars(
            step=step, message_id=message.id, span_id=message.id, parent_span_id=session.id
        )
        try:
            yield Reply(self, message)
        finally:
            structlog.contextvars.reset_contextvars(**tokens)

    def request(
        self,
        step: int,
        system: tuple[str, ...],
        *,
        tools: Sequence[ToolSpec],
        tool_choice: Literal["auto", "none"],
        ask: ChatMessage | None = None,
    ) -> ProviderRequest:
        """The request for ``step``: the model's view of the ledger, then ``ask`` if any."""
        history = self.history
        messages = history.chat(prune_protect=self._prune_protect)
        return ProviderRequest(
            model=self._model_name,
            system=system,
            messages=(*messages, ask) if ask is not None else tuple(messages),
            tools=tuple(tools),
            tool_choice=tool_choice,
            session_id=self.session.id,
            step=step,
            assistant_turns=history.assistant_turns(),
        )

    async def read(self, reply: Reply, request: ProviderRequest) -> ProviderError | None:
        """Stream the answer to ``request`` into ``reply``; the provider's error if it failed.

        The reply's open parts are closed (its message is left for the caller to finish,
        since what the reply means is the caller's): a stream that fails or is cancelled
        keeps what it streamed.
        """
        try:
            async with stream_with_retries(
                self._provider, request, policy=self._retry_policy, on_retry=self._on_retry
            ) as events:
                async for event in events:
                    await reply.record(event)
                await reply.flush_deltas()
        except ProviderError as error:
            return error
        finally:
            # On a cancel too (even one after the Finish, while the stream is closing):
            # what was streamed is part of the record.
            reply.close_parts()
        return None

    async def publish_request(self, request: ProviderRequest, sources: Sequence[str]) -> None:
        """The exact request, for ``--show-request``: built only when someone asked."""
        data = {
            "step": request.step,
            "model": request.model,
            "system": [
                {"source": source, "text": text}
                for source, text in zip(
                    [*sources, *(["final"] * len(request.system))], request.system, strict=False
                )
            ],
            "messages": [asdict(m) for m in request.messages],
            "tools": [spec.name for spec in request.tools],
            "tool_choice": request.tool_choice,
        }
        event = Event(None, time.time(), "step.request", self.session.id, data)
        await self.feed.send(Publish((event,)))

    def post_part(
        self, part: Part, kind: Literal["part.created", "part.updated"] = "part.updated"
    ) -> None:
        self.post([NewEvent.of(kind, self.session.id, part)])


class Reply:
    """One assistant message as its stream arrives: the parts still open, the calls made.

    A step's text and reasoning become parts, published live as batched deltas; a
    compaction's text is the summary, gathered here and recorded whole by the caller.
    """

    def __init__(self, recorder: Recorder, message: AssistantMessage) -> None:
        self.message = message
        self.finish: Finish | None = None
        self.tool_calls: list[PlannedCall] = []  # recorded as pending tool parts
        self._recorder = recorder
        self._live = message.mode == "step"
        self._text: TextPart | None = None
        self._text_buffer: list[str] = []
        self._reasoning: ReasoningPart | None = None
        self._reasoning_buffer: list[str] = []
        self._last_flush = 0.0
        # Deltas not yet published: (part id, field) and the text gathered for it.
        self._pending_delta: tuple[str, str] | None = None
        self._pending_text: list[str] = []
        self._last_publish = 0.0

    @property
    def text(self) -> str:
        return "".join(self._text_buffer)

    async def record(self, event: StreamEvent) -> None:
        if isinstance(event, Finish):
            self.finish = event
        elif not self._live:
            if isinstance(event, TextDelta):
                self._text_buffer.append(event.text)
        elif isinstance(event, TextDelta):
            await self._on_text(event.text)
        elif isinstance(event, ReasoningDelta):
            await self._on_reasoning(event.text)
        elif isinstance(event, ToolCallEvent):
            self._on_tool_call(event)

    async def flush_deltas(self) -> None:
        if self._pending_delta is None:
            return
        part_id, name = self._pending_delta
        event = Event(
            None,
            time.time(),
            "part.delta",
            self._recorder.session.id,
            {"part_id": part_id, "field": name, "delta": "".join(self._pending_text)},
        )
        self._pending_delta = None
        self._pending_text = []
        self._last_publish = time.monotonic()
        await self._recorder.feed.send(Publish((event,)))

    def close_parts(self) -> None:
        now = time.time()
        post_part = self._recorder.post_part
        if self._text is not None:
            post_part(self._text.model_copy(update={"text": self.text, "end": now}))
            self._text = None
        if self._reasoning is not None:
            text = "".join(self._reasoning_buffer)
            post_part(self._reasoning.model_copy(update={"text": text, "end": now}))
            self._reasoning = None

    def finish_message(self, *, error: str | None = None) -> None:
        recorder = self._recorder
        finish = self.finish
        tokens = finish.usage if finish else Tokens()
        cost = finish.cost if finish else 0.0
        reason = finish.reason if finish else "error"
        message = self.message.model_copy(
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
            session_id=recorder.session.id,
            message_id=message.id,
            reason=reason if not error else "error",
            tokens=tokens,
            cost=cost,
        )
        recorder.post(
            [
                NewEvent.of("part.created", recorder.session.id, done),
                NewEvent.of("message.updated", recorder.session.id, message),
            ]
        )
        recorder.on_usage(tokens, cost)

    async def _publish_delta(self, part_id: str, name: str, delta: str) -> None:
        """Gather a delta; publish what was gathered once DELTA_SECONDS have passed."""
        if self._pending_delta is not None and self._pending_delta != (part_id, name):
            await self.flush_deltas()
        self._pending_delta = (part_id, name)
        self._pending_text.append(delta)
        if time.monotonic() - self._last_publish >= DELTA_SECONDS:
            await self.flush_deltas()

    async def _on_text(self, delta: str) -> None:
        if self._text is None:
            self._text = TextPart(
                id=ids.part_id(),
                session_id=self.message.session_id,
                message_id=self.message.id,
                text="",
                start=time.time(),
            )
            self._last_flush = time.monotonic()
            self._recorder.post_part(self._text, "part.created")
        self._text_buffer.append(delta)
        await self._publish_delta(self._text.id, "text", delta)
        if time.monotonic() - self._last_flush > TEXT_FLUSH_SECONDS:
            # Bound what a crash can lose of a long reply to one flush interval.
            self._last_flush = time.monotonic()
            self._recorder.post_part(self._text.model_copy(update={"text": self.text}))

    async def _on_reasoning(self, delta: str) -> None:
        if self._reasoning is None:
            self._reasoning = ReasoningPart(
                id=ids.part_id(),
                session_id=self.message.session_id,
                message_id=self.message.id,
                text="",
                start=time.time(),
            )
            self._recorder.post_part(self._reasoning, "part.created")
        self._reasoning_buffer.append(delta)
        await self._publish_delta(self._reasoning.id, "reasoning", delta)

    def _on_tool_call(self, event: ToolCallEvent) -> None:
        try:
            parsed = json.loads(event.arguments) if event.arguments.strip() else {}
        except json.JSONDecodeError:
            parsed = None
        call_id, model_call_id = event.id or ids.call_id(), None
        taken = self._recorder.history.call_id_taken(call_id)
        if taken or any(c.call_id == call_id for c in self.tool_calls):
            # Two results for one id would make the next request invalid: a fresh id, and
            # the model's own kept beside it in the ledger so a rebuilt history is the same.
            call_id, model_call_id = ids.call_id(), call_id
            log.info("tool call id already used: given a fresh one", model_call_id=model_call_id)
        part = ToolPart(
            id=ids.part_id(),
            session_id=self.message.session_id,
            message_id=self.message.id,
            call_id=call_id,
            model_call_id=model_call_id,
            tool=event.name,
            state=ToolPending(
                input=parsed if isinstance(parsed, dict) else {}, raw=event.arguments
            ),
        )
        self._recorder.post_part(part, "part.created")
        self.tool_calls.append(
            PlannedCall(part.id, call_id, event.name, event.arguments, model_call_id=model_call_id)
        )
