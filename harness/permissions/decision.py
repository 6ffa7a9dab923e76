"""The gate's decision of one need when the rules alone decide it, and its record.

A need the rules allow or deny is decided by them whatever else happens: a stored
"always" approval only ever turns an ask into allow, ``--yes`` answers asks alone, and
nobody is asked (``ruleset.decide``). Such a need is answered where the call is, in the
ToolExecutor's task, instead of a round trip to the Permission actor and back (two
scheduler rounds and a reply channel a call, issue 14's ninth pass); a need the rules
leave to ask goes to the actor, which owns the approvals, the pending asks and the
replies. Either way the decision is recorded by ``decided_event``, the one place that
says what a ``permission.decided`` event holds.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.messages.events import NewEvent
from harness.messages.model import Rule
from harness.messages.permission import PermissionDecision, PermissionNeed
from harness.permissions.ruleset import decide_need


def rule_decision(
    need: PermissionNeed, layers: Sequence[Sequence[Rule]]
) -> PermissionDecision | None:
    """The decision when the rules allow or deny ``need``; None when they ask.

    The same as the Permission actor's for such a need: with no ask among the layers'
    answers, approvals change nothing (``decide`` consults them for asks only), so the
    action and the rule are those ``decide_need`` gives with any approvals."""
    action, rule, _ = decide_need(need, layers)
    if action == "ask":
        return None
    return PermissionDecision(action == "allow", "rule", rule=rule)


def decided_event(
    session_id: str, call_id: str, tool: str, need: PermissionNeed, decision: PermissionDecision
) -> NewEvent:
    """The ``permission.decided`` record of one need's decision, whoever decided it."""
    return NewEvent(
        "permission.decided",
        session_id,
        {
            "call_id": call_id,
            "tool": tool,
            "permission": need.permission,
            "pattern": need.pattern,
            "allowed": decision.allowed,
            "source": decision.source,
            "rule": decision.rule.model_dump() if decision.rule else None,
            "reply": decision.reply,
            "request_id": decision.request_id,
        },
    )
