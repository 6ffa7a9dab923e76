"""ToolExecutor: the one path every tool call takes (DESIGN §1 rule 2).

validate the arguments → ask Permission for each need (a need the rules alone allow or
deny is answered here: harness/permissions/decision.py) → record ``running`` durably →
execute inside the caller's cancel scope → truncate → record the result, bound to the
call id. A call that fails any stage never reaches the next one: invalid arguments never
run, an unapproved command never starts a process. The calls of one step run
concurrently; the answer lists their outcomes in the order the model made them.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import trio
from pydantic import ValidationError
from structlog.contextvars import bind_contextvars, reset_contextvars

from harness.logs import get_logger
from harness.messages.events import NewEvent, StopReason
from harness.messages.mailbox import (
    AskPermission,
    CallOutcome,
    ExecuteCalls,
    PermissionMessage,
    PlannedCall,
    ask,
)
from harness.messages.model import (
    PermissionAction,
    Rule,
    ToolCompleted,
    ToolError,
    ToolPart,
    ToolRunning,
    ToolState,
)
from harness.messages.names import shown
from harness.messages.permission import PermissionDecision, PermissionNeed
from harness.permissions.decision import decided_event, rule_decision
from harness.permissions.ruleset import decide
from harness.secrets import has_secrets, redact, redact_file
from harness.snapshots import Blob, CallSnapshot, patch_part
from harness.storage.port import LedgerPort
from harness.tools.base import (
    Questions,
    Subtasks,
    Todos,
    Tool,
    ToolContext,
    ToolFailure,
    ToolParams,
    ToolRejected,
    ignored_note,
    parse_arguments,
)
from harness.tools.process import process_identity
from harness.tools.sandbox import Sandbox
from harness.tools.truncate import truncate_output

log = get_logger("harness.tools")


def describe_validation_error(tool: str, error: ValidationError) -> str:
    problems = []
    for item in error.errors():
        where = ".".join(str(piece) for piece in item["loc"]) or "arguments"
        problems.append(f"{where}: {item['msg']}")
    return f"invalid arguments for tool '{tool}': " + "; ".join(problems)


def describe_denial(need: PermissionNeed, decision: PermissionDecision) -> str:
    subject = f"{need.permission} on '{need.pattern}'"
    if decision.source == "no-terminal" and decision.message:
        return f"the call was rejected: {decision.message}"
    if decision.source == "cancelled":
        return "cancelled"
    if decision.source == "reply":
        if decision.message:
            return f"the user rejected this call ({subject}) with this feedback: {decision.message}"
        return f"the user rejected this call ({subject}); do not retry it"
    rule = decision.rule
    shown = f" (rule {rule.permission}:{rule.pattern} → {rule.action})" if rule else ""
    return f"a permission rule denies {subject}{shown}; the call was not run"


def _within(granted: str, pattern: str) -> bool:
    """Whether a granted path pattern (``/a/b`` or ``/a/b/*``) covers ``pattern``.

    Taken literally: a directory whose name holds ``*`` or ``?`` must not turn into a
    wildcard that covers its neighbours.
    """
    if granted.endswith("/*"):
        return pattern.startswith(granted[:-1]) and len(pattern) > len(granted) - 1
    return pattern == granted


class ToolExecutor:
    def __init__(
        self,
        *,
        session_id: str,
        directory: Path,
        project: str,
        tools: Mapping[str, Tool[Any]],
        disabled: Container[str] = frozenset(),
        layers: Sequence[Sequence[Rule]],
        ledger: LedgerPort,
        permission: trio.MemorySendChannel[PermissionMessage],
        output_dir: Path,
        subtasks: Subtasks | None = None,
        todos: Todos | None = None,
        questions: Questions | None = None,
        yes: bool = False,
        sandbox: Sandbox | None = None,
    ) -> None:
        self._session_id = session_id
        self._yes = yes  # --yes: what would ask is allowed, in the tools' own checks too
        self._directory = directory
        # The workspace boundary for this turn's calls, resolved once (tools/paths.py):
        # each call still resolves its own target through every link.
        self._root = os.path.realpath(directory)
        self._project = project
        self._tools = tools
        self._disabled = disabled  # hidden from the model by a blanket deny rule
        self._layers = layers
        self._ledger = ledger
        self._permission = permission
        self._output_dir = output_dir
        self._subtasks = subtasks
        self._todos = todos
        self._questions = questions
        self._sandbox = sandbox
        self.mailbox, self._receive = trio.open_memory_channel[ExecuteCalls](math.inf)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async with self._receive:
            async for request in self._receive:
                # bind/reset rather than bound_contextvars: the same restore of what was
                # bound before, without a generator-based context manager every step.
                tokens = bind_contextvars(message_id=request.message_id)
                try:
                    await self._step(request)
                finally:
                    reset_contextvars(**tokens)

    async def _step(self, request: ExecuteCalls) -> None:
        """Run one step's calls (several at once) and answer with their outcomes, in order."""
        snapshots: list[CallSnapshot] = []  # this step's file-changing calls
        outcomes: list[CallOutcome | None] = [None] * len(request.calls)
        if len(request.calls) == 1:
            await self._one(request.message_id, request.calls[0], outcomes, 0, snapshots)
        else:
            async with trio.open_nursery() as nursery:
                for index, call in enumerate(request.calls):
                    nursery.start_soon(
                        self._one, request.message_id, call, outcomes, index, snapshots
                    )
        if snapshots:
            self._post_patch(request.message_id, snapshots)
        request.reply.send_nowait([o for o in outcomes if o is not None])

    def _post_patch(self, message_id: str, snapshots: list[CallSnapshot]) -> None:
        """End a step that changed files with its ``patch`` part."""
        part = patch_part(self._session_id, message_id, self._directory, snapshots)
        if part is not None:
            self._ledger.post([NewEvent.of("part.created", self._session_id, part)])

    def _touched_paths(self, tool: Tool[Any], args: ToolParams, context: ToolContext) -> list[Path]:
        try:
            return tool.touched_paths(args, context)
        except ToolFailure:
            return []  # the call will fail on the same input, before touching anything

    async def _one(
        self,
        message_id: str,
        call: PlannedCall,
        outcomes: list[CallOutcome | None],
        index: int,
        snapshots: list[CallSnapshot],
    ) -> None:
        # Spans for the log: step (message) -> tool call -> child session.
        tokens = bind_contextvars(
            call_id=call.call_id, span_id=call.call_id, parent_span_id=message_id
        )
        try:
            outcomes[index] = await self._execute(message_id, call, snapshots)
        finally:
            reset_contextvars(**tokens)

    def _record(self, message_id: str, call: PlannedCall, state: ToolState) -> NewEvent:
        part = ToolPart(
            id=call.part_id,
            session_id=self._session_id,
            message_id=message_id,
            call_id=call.call_id,
            model_call_id=call.model_call_id,
            tool=call.tool,
            state=state,
        )
        return NewEvent.of("part.updated", self._session_id, part)

    def _fail(
        self,
        message_id: str,
        call: PlannedCall,
        error: str,
        *,
        input: dict[str, Any] | None = None,
        start: float | None = None,
        stop: StopReason | None = None,
    ) -> CallOutcome:
        now = time.time()
        state = ToolError(input=input or {}, error=error, start=start or now, end=now)
        self._ledger.post([self._record(message_id, call, state)])
        log.info("tool failed", call_id=call.call_id, tool=call.tool, error=error[:200])
        return CallOutcome(call.call_id, ok=False, stop=stop)

    async def _execute(
        self, message_id: str, call: PlannedCall, snapshots: list[CallSnapshot]
    ) -> CallOutcome:
        try:
            raw = json.loads(call.arguments) if call.arguments.strip() else {}
        except json.JSONDecodeError as error:
            raw = None
            bad_json = f"arguments for tool '{call.tool}' are not valid JSON: {error}"
        # Whatever happens next, the ledger keeps the arguments the model sent.
        kept = raw if isinstance(raw, dict) else {}
        if call.refusal is not None:
            return self._fail(message_id, call, call.refusal, input=kept)
        if call.tool in self._disabled:
            return self._fail(
                message_id,
                call,
                f"a permission rule denies the tool '{call.tool}'; the call was not run",
                input=kept,
                stop="denied",
            )
        tool = self._tools.get(call.tool)
        if tool is None:
            available = ", ".join(sorted(self._tools))
            return self._fail(
                message_id,
                call,
                f"unknown tool '{call.tool}'; available tools: {available}",
                input=kept,
            )
        if raw is None:
            return self._fail(message_id, call, bad_json)
        if not isinstance(raw, dict):
            return self._fail(
                message_id, call, f"arguments for tool '{call.tool}' must be a JSON object"
            )
        try:
            args, ignored = parse_arguments(tool.params, raw)
        except ValidationError as error:
            return self._fail(
                message_id, call, describe_validation_error(call.tool, error), input=raw
            )
        context = ToolContext(
            session_id=self._session_id,
            message_id=message_id,
            call_id=call.call_id,
            directory=self._directory,
            output_dir=self._output_dir,
            subtasks=self._subtasks,
            todos=self._todos,
            questions=self._questions,
            check=self._check,
            sandbox=self._sandbox,
            root=self._root,
        )
        try:
            needs = tool.permissions(args, context)
        except ToolFailure as error:
            return self._fail(message_id, call, str(error), input=raw)
        if call.doom_loop:
            pattern = call.tool
            needs = [PermissionNeed("doom_loop", pattern, pattern, {"input": raw}), *needs]
        for need in needs:
            decision = await self._ask(message_id, call, need)
            if not decision.allowed:
                stop: StopReason | None = None
                if not decision.message or decision.source == "no-terminal":
                    stop = "doom_loop" if need.permission == "doom_loop" else "denied"
                return self._fail(
                    message_id, call, describe_denial(need, decision), input=raw, stop=stop
                )
        note = ignored_note(ignored) if ignored else ""
        check = self._granted_check(needs)
        return await self._run(message_id, call, tool, args, raw, context, check, snapshots, note)

    def _redact_saved_output(self, call_id: str) -> None:
        if not has_secrets():
            return
        # In strings, not pathlib: this runs after every call, and two Path joins, parents
        # and comparisons cost more than the two stat calls.
        directory = str(self._output_dir)
        for suffix in (".log", ".txt"):  # bash's stream, the truncation's copy
            path = os.path.join(directory, f"{call_id}{suffix}")
            # The id is the model's: one that names another directory is not looked at.
            if os.path.dirname(path) == directory and os.path.exists(path):
                redact_file(Path(path))

    def _granted_check(
        self, granted: Sequence[PermissionNeed]
    ) -> Callable[[str, str], PermissionAction]:
        """``_check``, where what the user just allowed this call also counts as allowed.

        A grep of ``/elsewhere`` approved once (``external_directory`` on ``/elsewhere/*``)
        may then open the files under it; an ask becomes allow only within the patterns
        granted, and a deny stays a deny.
        """

        def check(permission: str, pattern: str) -> PermissionAction:
            action = self._check(permission, pattern)
            if action == "ask" and any(
                need.permission == permission and _within(need.pattern, pattern)
                for need in granted
            ):
                return "allow"
            return action

        return check

    def _check(self, permission: str, pattern: str) -> PermissionAction:
        # Stored "always" approvals live in the Permission actor and are not consulted: a
        # tool's own check errs towards skipping what an approval would have allowed.
        action, _, _ = decide(permission, pattern, self._layers)
        return "allow" if action == "ask" and self._yes else action

    async def _ask(
        self, message_id: str, call: PlannedCall, need: PermissionNeed
    ) -> PermissionDecision:
        """The gate's answer to ``need``: the rules' own when they allow or deny it,
        recorded here as the Permission actor would; else the actor's (approvals, asks)."""
        decision = rule_decision(need, self._layers)
        if decision is not None:
            await trio.lowlevel.checkpoint_if_cancelled()  # as the ask's own, before it
            event = decided_event(self._session_id, call.call_id, call.tool, need, decision)
            self._ledger.post([event])
            return decision
        answer: PermissionDecision = await ask(
            self._permission,
            lambda reply: AskPermission(
                session_id=self._session_id,
                message_id=message_id,
                call_id=call.call_id,
                tool=call.tool,
                need=need,
                layers=self._layers,
                project=self._project,
                reply=reply,
            ),
        )
        return answer

    async def _run(
        self,
        message_id: str,
        call: PlannedCall,
        tool: Tool[Any],
        args: ToolParams,
        raw: dict[str, Any],
        context: ToolContext,
        check: Callable[[str, str], PermissionAction],
        snapshots: list[CallSnapshot],
        note: str = "",
    ) -> CallOutcome:
        """Run an allowed call; ``note`` (arguments that were ignored) ends its result.

        ``check`` is the gate's answer with what was granted to this call counted in. A
        call that may change files adds its snapshot to ``snapshots``, its step's.
        """
        start = time.time()
        title = shown(tool.title(args))
        kept = tool.running_metadata(args)

        async def report_process(pgid: int) -> None:
            # Durable before the command runs on: a restart after a crash finds the group.
            identity = process_identity(pgid)
            metadata = {**kept, "process": identity} if identity is not None else kept
            state = ToolRunning(input=raw, title=title, metadata=metadata, start=start)
            await self._ledger.write([self._record(message_id, call, state)])

        # One copy of the context for the run (a dataclass replace is ~4 µs).
        context = replace(context, check=check, report_process=report_process)
        running = [
            self._record(
                message_id, call, ToolRunning(input=raw, title=title, metadata=kept, start=start)
            )
        ]
        snapshot: CallSnapshot | None = None
        if tool.read_only:
            # Nothing to protect: a read-only call interrupted by a crash is simply re-run.
            self._ledger.post(running)
        else:
            # Durable before the side effect begins: after a crash, a call still "running"
            # in the ledger is known to have maybe happened, and is never re-run blindly.
            # The files the tool says it will modify are snapshotted in the same write.
            blobs: list[Blob] = []
            paths = self._touched_paths(tool, args, context)
            if paths:
                snapshot = CallSnapshot.capture(self._session_id, message_id, call.call_id, paths)
                before, blobs = snapshot.before_event()
                running.append(before)
            await self._ledger.write(running, blobs=blobs)
        log.debug("tool started", call_id=call.call_id, tool=call.tool, title=title)
        try:
            result = await tool.execute(args, context)
        except ToolFailure as error:
            # A refusal by the user (a dismissed question) stops the loop like a denial.
            stop: StopReason | None = "denied" if isinstance(error, ToolRejected) else None
            return self._fail(
                message_id, call, str(error) + note, input=raw, start=start, stop=stop
            )
        except Exception as error:
            log.exception("tool raised", call_id=call.call_id, tool=call.tool)
            return self._fail(
                message_id,
                call,
                f"tool '{call.tool}' failed: {type(error).__name__}: {error}{note}",
                input=raw,
                start=start,
            )
        finally:
            # A tool's own copy of its output (bash's full log) is redacted like the rest,
            # also when the call failed or was cancelled half way.
            self._redact_saved_output(call.call_id)
            if snapshot is not None:
                # Also on a failure or a cancel: what the files became is recorded either way.
                changed, blobs = snapshot.after_event()
                self._ledger.post([changed], blobs=blobs)
                snapshots.append(snapshot)
        # Before truncation, so the full copy saved under tool-output/ is clean too. A name
        # that is not UTF-8 in the output (a listing) is shown as \xff from here on.
        output, extra = truncate_output(
            redact(shown(result.output)), output_dir=self._output_dir, call_id=call.call_id
        )
        state = ToolCompleted(
            input=raw,
            output=output + note,
            title=result.title or title,
            metadata={**result.metadata, **extra},
            start=start,
            end=time.time(),
        )
        self._ledger.post([self._record(message_id, call, state)])
        log.info("tool completed", call_id=call.call_id, tool=call.tool)
        return CallOutcome(call.call_id, ok=True)
