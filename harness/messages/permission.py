"""Permission requests and decisions: what crosses between a tool call and the gate."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from harness.messages.model import Rule

Reply = Literal["once", "always", "reject"]


@dataclass(slots=True, frozen=True)
class PermissionNeed:
    """One thing a call needs allowed before it runs.

    ``pattern`` is what rules are matched against (a path, a command); ``always`` is the
    pattern stored when the user answers "always" (a directory glob, a command prefix).

    Where the text alone cannot say what will happen (a shell command), two more fields
    tell the rule engine (harness/permissions/ruleset.py): ``opaque`` means the subject
    could be anything (``$X args``, a line the parser did not understand), so no allow rule
    matches it except ``*`` and every deny rule does; ``covers`` is a wildcard pattern that
    every possible value matches (``rm*`` for ``/bin/rm $F``), and a deny rule that could
    match one of those values applies.
    """

    permission: str
    pattern: str
    always: str
    metadata: dict[str, Any] = field(default_factory=dict)
    opaque: bool = False
    covers: str | None = None


class PermissionRequest(BaseModel):
    """A pending ask, as the API lists it and the ``permission.asked`` event carries it."""

    # Built on first use (defer_build): not needed before a run's first request.
    model_config = ConfigDict(extra="forbid", defer_build=True)

    id: str
    session_id: str
    permission: str
    pattern: str
    always: str
    tool: str
    call_id: str
    message_id: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    created: float


@dataclass(slots=True, frozen=True)
class PermissionDecision:
    """The gate's answer to one need.

    ``source`` says who decided: a configured ``rule``, a stored ``always`` approval, the
    user's ``reply``, ``yes`` when ``--yes`` answered an ask, or ``no-terminal`` when nobody
    could be asked. ``message`` is the
    user's feedback on a rejection; a rejection with feedback lets the loop continue.
    """

    allowed: bool
    source: Literal["rule", "approved", "reply", "yes", "no-terminal", "cancelled"]
    rule: Rule | None = None
    reply: Reply | None = None
    message: str | None = None
    request_id: str | None = None
