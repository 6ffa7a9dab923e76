"""Question: the questions the model asks the user, pending until answered (``question`` tool).

A question set reaches the user the way a permission ask does: it becomes a pending
request (``que_…``) recorded as a durable ``question.asked`` event, listed by the API,
and answered through ``AnswerQuestion`` (terminal prompt in ``harness run``, the daemon
API, ``harness answer``). With nobody to ask (``interactive=False``) it fails at once.
Cancelling the session (``ClearSession``) or the asking call (``WithdrawQuestion``)
drops what was pending.

Kept apart from the Permission actor: a question has no rules, no approvals and no
"always", its answer is data for the model rather than a decision, and the two share
only the shape of a pending request.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import structlog
import trio

from harness.messages import ids, mailbox
from harness.messages.events import NewEvent
from harness.messages.mailbox import (
    AnswerQuestion,
    AskQuestion,
    ClearSession,
    ListQuestions,
    QuestionMessage,
    WithdrawQuestion,
)
from harness.messages.question import (
    QuestionInfo,
    QuestionOutcome,
    QuestionRequest,
    check_answers,
)
from harness.storage.port import LedgerPort

log = structlog.get_logger("harness.question")


@dataclass(slots=True)
class _Pending:
    request: QuestionRequest
    ask: AskQuestion


class Question:
    def __init__(self, ledger: LedgerPort, *, interactive: bool) -> None:
        self._ledger = ledger
        self._interactive = interactive
        self.mailbox, self._receive = trio.open_memory_channel[QuestionMessage](math.inf)
        self._pending: dict[str, _Pending] = {}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            async with self._receive:
                async for message in self._receive:
                    self._handle(message)
        finally:
            for pending in self._pending.values():
                self._tell(pending.ask, QuestionOutcome("cancelled"))
            self._pending.clear()

    def _handle(self, message: QuestionMessage) -> None:
        if isinstance(message, AskQuestion):
            self._ask(message)
        elif isinstance(message, AnswerQuestion):
            message.done.send_nowait(self._answer(message))
        elif isinstance(message, ListQuestions):
            message.reply.send_nowait(
                [
                    p.request
                    for p in self._pending.values()
                    if message.session_id in (None, p.request.session_id)
                ]
            )
        elif isinstance(message, WithdrawQuestion):
            self._drop(message.request_id, "withdrawn")
        elif isinstance(message, ClearSession):
            for pending in list(self._pending.values()):
                if pending.request.session_id == message.session_id:
                    self._drop(pending.request.id, "cancelled")

    def _ask(self, ask: AskQuestion) -> None:
        if not self._interactive:
            self._tell(ask, QuestionOutcome("no-terminal"))
            return
        request = QuestionRequest(
            id=ask.request_id,
            session_id=ask.session_id,
            message_id=ask.message_id,
            call_id=ask.call_id,
            questions=list(ask.questions),
            created=time.time(),
        )
        self._pending[request.id] = _Pending(request, ask)
        self._ledger.post([NewEvent.of("question.asked", ask.session_id, request)])
        log.info("question asked", request_id=request.id, questions=len(request.questions))

    def _answer(self, message: AnswerQuestion) -> str | None:
        pending = self._pending.get(message.request_id)
        if pending is None:
            return "not_found"
        request = pending.request
        if message.answers is None:
            outcome = QuestionOutcome("rejected", message=message.message)
            event = NewEvent(
                "question.rejected",
                request.session_id,
                {"id": request.id, "reason": "rejected", "message": message.message},
            )
        else:
            answers = [[label.strip() for label in answer] for answer in message.answers]
            problem = check_answers(request.questions, answers)
            if problem is not None:
                return problem  # still pending: the user may answer again
            outcome = QuestionOutcome("answered", answers=answers)
            event = NewEvent(
                "question.replied", request.session_id, {"id": request.id, "answers": answers}
            )
        del self._pending[request.id]
        if not message.remote:
            self._ledger.post([event])
        self._tell(pending.ask, outcome)
        log.info("question settled", request_id=request.id, outcome=outcome.source)
        return None

    def _drop(self, request_id: str, reason: str) -> None:
        pending = self._pending.pop(request_id, None)
        if pending is None:
            return
        session_id = pending.request.session_id
        self._ledger.post(
            [NewEvent("question.rejected", session_id, {"id": request_id, "reason": reason})]
        )
        self._tell(pending.ask, QuestionOutcome("cancelled"))

    @staticmethod
    def _tell(ask: AskQuestion, outcome: QuestionOutcome) -> None:
        # The asker may have been cancelled and gone: its answer is simply dropped.
        with contextlib.suppress(
            trio.BrokenResourceError, trio.ClosedResourceError, trio.WouldBlock
        ):
            ask.reply.send_nowait(outcome)


class SessionQuestions:
    """The ``Questions`` a session gives its tool calls: asks through the Question actor."""

    def __init__(self, session_id: str, mailbox: trio.MemorySendChannel[QuestionMessage]) -> None:
        self._session_id = session_id
        self._mailbox = mailbox

    async def ask(
        self, *, call_id: str, message_id: str, questions: Sequence[QuestionInfo]
    ) -> QuestionOutcome:
        request_id = ids.question_id()
        try:
            return await mailbox.ask(
                self._mailbox,
                lambda reply: AskQuestion(
                    request_id, self._session_id, message_id, call_id, questions, reply
                ),
            )
        finally:
            # Answered already, or the call was cancelled: either way nothing stays pending.
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                self._mailbox.send_nowait(WithdrawQuestion(request_id))
