"""Permission: the gate every tool call passes before it may act (DESIGN §8).

Evaluates a need against the session's merged ruleset and its ancestors' (the strictest
answer wins; a stored "always" approval turns an ask into allow, never a deny). An
``ask`` becomes a pending request that waits for a reply through ``ReplyPermission``
(terminal prompt, API), or is rejected at once when nobody can be asked
(``interactive=False``: a script, CI). With ``yes`` (``--yes``) an ask is answered "allow"
at once: it answers asks only, so a deny from any layer (defaults, agent, config, session,
a parent session) still stands. Every decision is recorded in the ledger with the rule that
matched. A need the rules alone allow or deny never comes here: the ToolExecutor answers
it itself, with the same decision and record (harness/permissions/decision.py), since no
approval, reply or ``--yes`` could change it.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass

import structlog
import trio

from harness.messages import ids
from harness.messages.events import NewEvent
from harness.messages.mailbox import (
    AskPermission,
    ClearSession,
    ListPending,
    PermissionMessage,
    ReplyPermission,
)
from harness.messages.model import Rule
from harness.messages.permission import PermissionDecision, PermissionRequest
from harness.permissions.decision import decided_event
from harness.permissions.ruleset import decide_need
from harness.storage.port import LedgerPort

log = structlog.get_logger("harness.permission")


@dataclass(slots=True)
class _Pending:
    request: PermissionRequest
    ask: AskPermission


def no_terminal_hint(permission: str, always: str) -> str:
    """The message shown when an ask cannot be asked: it names the flag that allows it."""
    return (
        f"permission '{permission}' for '{always}' needs approval and there is no terminal "
        f"to ask: rerun with --allow '{permission}:{always}' (or --yes to allow what asks)"
    )


class Permission:
    def __init__(self, ledger: LedgerPort, *, interactive: bool, yes: bool = False) -> None:
        self._ledger = ledger
        self._interactive = interactive
        self._yes = yes
        self.mailbox, self._receive = trio.open_memory_channel[PermissionMessage](math.inf)
        self._pending: dict[str, _Pending] = {}
        self._approvals: dict[str, list[Rule]] = {}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            async with self._receive:
                async for message in self._receive:
                    self._handle(message)
        finally:
            for pending in self._pending.values():
                self._answer(pending.ask, PermissionDecision(False, "cancelled"))
            self._pending.clear()

    def _handle(self, message: PermissionMessage) -> None:
        if isinstance(message, AskPermission):
            self._ask(message)
        elif isinstance(message, ReplyPermission):
            message.done.send_nowait(self._reply(message))
        elif isinstance(message, ListPending):
            message.reply.send_nowait(
                [
                    p.request
                    for p in self._pending.values()
                    if message.session_id in (None, p.request.session_id)
                ]
            )
        else:
            self._clear(message)

    def _project_approvals(self, project: str) -> list[Rule]:
        approvals = self._approvals.get(project)
        if approvals is None:
            approvals = self._approvals[project] = self._ledger.approvals(project)
        return approvals

    def _ask(self, ask: AskPermission) -> None:
        need = ask.need
        approvals = self._project_approvals(ask.project)
        action, rule, approved = decide_need(need, ask.layers, approvals)
        if action == "ask" and self._yes:
            self._decide(ask, PermissionDecision(True, "yes"))
            return
        if action != "ask":
            self._decide(
                ask,
                PermissionDecision(
                    action == "allow", "approved" if approved else "rule", rule=rule
                ),
            )
            return
        if not self._interactive:
            message = no_terminal_hint(need.permission, need.always)
            self._decide(ask, PermissionDecision(False, "no-terminal", message=message))
            return
        request = PermissionRequest(
            id=ids.permission_id(),
            session_id=ask.session_id,
            permission=need.permission,
            pattern=need.pattern,
            always=need.always,
            tool=ask.tool,
            call_id=ask.call_id,
            message_id=ask.message_id,
            metadata=need.metadata,
            created=time.time(),
        )
        self._pending[request.id] = _Pending(request, ask)
        self._ledger.post([NewEvent.of("permission.asked", ask.session_id, request)])
        log.info("permission asked", permission=need.permission, pattern=need.pattern)

    def _reply(self, message: ReplyPermission) -> bool:
        pending = self._pending.pop(message.request_id, None)
        if pending is None:
            return False
        request = pending.request
        replied = {"id": request.id, "reply": message.reply, "message": message.message}
        events = [] if message.remote else [
            NewEvent("permission.replied", request.session_id, replied)
        ]
        if message.reply == "always":
            project = pending.ask.project
            approval = Rule(permission=request.permission, pattern=request.always, action="allow")
            self._project_approvals(project).append(approval)
            events.append(
                NewEvent(
                    "approval.added",
                    request.session_id,
                    {
                        "project": project,
                        "permission": request.permission,
                        "pattern": request.always,
                        "created": time.time(),
                    },
                )
            )
        self._ledger.post(events)
        allowed = message.reply != "reject"
        if not allowed and message.no_terminal:
            hint = no_terminal_hint(request.permission, request.always)
            decision = PermissionDecision(
                False, "no-terminal", reply="reject", message=hint, request_id=request.id
            )
        else:
            decision = PermissionDecision(
                allowed,
                "reply",
                reply=message.reply,
                message=message.message,
                request_id=request.id,
            )
        self._decide(pending.ask, decision)
        if message.reply == "always":
            self._settle_others(request.session_id)
        elif message.reply == "reject":
            # One rejection answers the other asks of the same session too: the user said
            # stop, and the loop is about to stop.
            for other in self._of_session(request.session_id):
                self._pending.pop(other.request.id)
                self._decide(
                    other.ask,
                    PermissionDecision(False, "reply", reply="reject", request_id=other.request.id),
                )
        return True

    def _settle_others(self, session_id: str) -> None:
        """After an "always", allow the other pending asks the new approval now covers."""
        for other in self._of_session(session_id):
            approvals = self._project_approvals(other.ask.project)
            need = other.ask.need
            action, rule, _ = decide_need(need, other.ask.layers, approvals)
            if action == "allow":
                self._pending.pop(other.request.id)
                self._decide(
                    other.ask,
                    PermissionDecision(True, "approved", rule=rule, request_id=other.request.id),
                )

    def _of_session(self, session_id: str) -> list[_Pending]:
        return [p for p in self._pending.values() if p.request.session_id == session_id]

    def _clear(self, message: ClearSession) -> None:
        for pending in self._of_session(message.session_id):
            self._pending.pop(pending.request.id)
            self._answer(pending.ask, PermissionDecision(False, "cancelled"))

    def _decide(self, ask: AskPermission, decision: PermissionDecision) -> None:
        event = decided_event(ask.session_id, ask.call_id, ask.tool, ask.need, decision)
        self._ledger.post([event])
        self._answer(ask, decision)

    @staticmethod
    def _answer(ask: AskPermission, decision: PermissionDecision) -> None:
        # The asker may have been cancelled and gone: its answer is simply dropped.
        with contextlib.suppress(
            trio.BrokenResourceError, trio.ClosedResourceError, trio.WouldBlock
        ):
            ask.reply.send_nowait(decision)
