"""Request bodies of the daemon API (DESIGN §9), validated at the socket.

Unknown fields are refused, so a typo (``"delivry"``) is a 422 naming the field rather
than a silently ignored setting.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from harness.messages.model import Delivery, Rule
from harness.messages.permission import Reply


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class CreateSessionBody(_Body):
    directory: str | None = None
    model: str | None = None
    agent: str | None = None
    title: str = ""
    permission: list[Rule] = Field(default_factory=list)


class RevertBody(_Body):
    """``POST /v1/sessions/{id}/revert``: put the workspace back as before this message."""

    message_id: str = Field(min_length=1, max_length=200)


class PromptBody(_Body):
    text: str = Field(min_length=1)
    delivery: Delivery = "queue"
    message_id: str | None = Field(default=None, min_length=1, max_length=200)


class PermissionReplyBody(_Body):
    reply: Reply
    message: str | None = None
    # A client with nobody to ask rejects on their behalf: the record then says so, with
    # the flag that would allow the call, as an embedded run's record does.
    no_terminal: bool = False


class QuestionReplyBody(_Body):
    """``{answers: [[label, ...], ...]}`` (one list per question) or ``{reject: true}``.

    A rejection with a ``message`` lets the model carry on with that message; a bare one
    stops the turn, like a rejected permission.
    """

    answers: list[list[str]] | None = None
    reject: bool = False
    message: str | None = None

    @model_validator(mode="after")
    def _one_of(self) -> QuestionReplyBody:
        if self.reject == (self.answers is not None):
            raise ValueError("give either answers (one list per question) or reject: true")
        return self
