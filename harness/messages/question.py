"""Questions the model asks the user (the ``question`` tool), as the API and events carry them.

A question set is pending until the user answers it (one list of labels per question) or
rejects it. ``QuestionRequest`` is what ``GET /v1/questions`` lists and the durable
``question.asked`` event carries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Answers = list[list[str]]  # one list of chosen labels (or free text) per question

# Why a question fails at once in a run with nobody to answer it; the model reads it.
NO_TERMINAL = (
    "there is no terminal to ask the user (a non-interactive run): go on with your best "
    "judgement and state the assumptions you make"
)


class QuestionOption(BaseModel):
    # Built on first use (defer_build): not needed before a run's first request.
    model_config = ConfigDict(extra="forbid", defer_build=True)

    label: str = Field(min_length=1, max_length=200, description="The answer as shown: 1-5 words")
    description: str = Field(default="", max_length=1000, description="What this choice means")


class QuestionInfo(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)

    question: str = Field(min_length=1, max_length=4000, description="The complete question")
    header: str | None = Field(
        default=None, max_length=60, description="A very short label for it (max 30 chars)"
    )
    options: list[QuestionOption] = Field(
        default_factory=list,
        max_length=20,
        description="The choices; the user may also type an answer of their own",
    )
    multiple: bool = Field(default=False, description="Whether several options may be chosen")


class QuestionRequest(BaseModel):
    """A pending question set."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    id: str
    session_id: str
    message_id: str
    call_id: str
    questions: list[QuestionInfo]
    created: float


@dataclass(slots=True, frozen=True)
class QuestionOutcome:
    """How a question set ended, for the tool that asked.

    ``source``: the user ``answered`` or ``rejected`` it (with an optional ``message`` the
    model sees), nobody could be asked (``no-terminal``), or the call was ``cancelled``.
    """

    source: Literal["answered", "rejected", "no-terminal", "cancelled"]
    answers: Answers | None = None
    message: str | None = None


def check_answers(questions: list[QuestionInfo], answers: Answers) -> str | None:
    """Why ``answers`` do not fit ``questions`` (a message for the user), or None."""
    if len(answers) != len(questions):
        return f"expected {len(questions)} answer(s), one per question, and got {len(answers)}"
    for number, (info, answer) in enumerate(zip(questions, answers, strict=True), 1):
        if any(not label.strip() for label in answer):
            return f"answer {number} contains an empty choice"
        if not info.multiple and len(answer) > 1:
            return f"question {number} takes one answer, and got {len(answer)}: {answer}"
    return None
