"""question: ask the user one or more questions and get their answers back.

The question reaches the user the way a permission ask does (terminal prompt in
``harness run``, or the daemon API and ``harness answer``). The session provides the
asking through ``ToolContext.questions``. With nobody to ask (no terminal) the call fails
at once with an error the model sees, and the turn goes on; a question the user rejects
stops the turn, like a rejected permission.
"""

from __future__ import annotations

import json

from pydantic import Field

from harness.messages.question import NO_TERMINAL, Answers, QuestionInfo
from harness.tools.base import (
    PermissionNeed,
    Tool,
    ToolContext,
    ToolFailure,
    ToolOutput,
    ToolParams,
    ToolRejected,
)


class QuestionParams(ToolParams):
    questions: list[QuestionInfo] = Field(
        min_length=1, max_length=10, description="The questions to ask, in order"
    )


def _quoted(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def format_answers(questions: list[QuestionInfo], answers: Answers) -> str:
    """``"Which DB?"="Postgres", "Features?"="auth, billing"``."""
    pairs = []
    for info, answer in zip(questions, answers, strict=True):
        text = ", ".join(answer) if answer else "Unanswered"
        pairs.append(f"{_quoted(info.question)}={_quoted(text)}")
    return ", ".join(pairs)


class QuestionTool(Tool[QuestionParams]):
    name = "question"
    description = (
        "Ask the user questions when a requirement is unclear or a choice is theirs to "
        "make (which approach, which library, what to name something). Give each question "
        "a few short options with a description each; set multiple when several may be "
        "chosen. The user may also answer in their own words. Do not ask what you can find "
        "out yourself by reading the project."
    )
    params = QuestionParams
    # Asking again after a restart is harmless: nothing was changed by asking.
    read_only = True

    def permissions(self, args: QuestionParams, ctx: ToolContext) -> list[PermissionNeed]:
        return [PermissionNeed("question", "*", "*")]

    def title(self, args: QuestionParams) -> str:
        count = len(args.questions)
        return f"asked {count} question{'s' if count != 1 else ''}"

    async def execute(self, args: QuestionParams, ctx: ToolContext) -> ToolOutput:
        if ctx.questions is None:
            raise ToolFailure("there is nobody to ask here; decide yourself and say what you chose")
        questions = list(args.questions)
        outcome = await ctx.questions.ask(
            call_id=ctx.call_id, message_id=ctx.message_id, questions=questions
        )
        if outcome.source == "answered" and outcome.answers is not None:
            return ToolOutput(
                output=(
                    f"User answered: {format_answers(questions, outcome.answers)}. "
                    "Continue with these answers in mind."
                ),
                title=self.title(args),
                metadata={"answers": outcome.answers},
            )
        if outcome.source == "no-terminal":
            raise ToolFailure(f"the question could not be asked: {NO_TERMINAL}")
        if outcome.source == "rejected" and outcome.message:
            raise ToolFailure(f"the user dismissed the question: {outcome.message}")
        if outcome.source == "rejected":
            raise ToolRejected("the user dismissed the question; do not ask it again")
        raise ToolFailure("cancelled")
