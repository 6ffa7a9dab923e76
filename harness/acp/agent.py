"""The ACP agent: its methods on an embedded harness, and ``serve_acp`` on stdin/stdout.

Sessions are ordinary harness sessions: created with ``Harness.create_session``, in the
ledger, listed by ``harness sessions`` and resumable with ``harness run --session``. A
prompt goes in through ``Harness.prompt`` and the turn is followed on the harness's feed,
as ``harness run`` follows it; its events become ``session/update`` notifications
(``updates.Translator``) and its permission asks and questions become
``session/request_permission`` requests to the client.

What a session gets from configuration is what ``harness run --dir CWD`` would give it:
defaults < global file < the project file of its ``cwd`` < ``HARNESS_*`` < the flags of
``harness acp``. What configures the harness itself (named providers, budget, sandbox)
comes from the directory ``harness acp`` started in, as for a run there.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog
import trio
from acp import schema
from acp.meta import AGENT_METHODS, PROTOCOL_VERSION
from pydantic import ValidationError

from harness.acp import jsonrpc
from harness.acp.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    RESOURCE_NOT_FOUND,
    Connection,
    Params,
    RpcError,
)
from harness.acp.updates import Translator, dump, notification, tool_kind
from harness.agents import UnknownAgentError
from harness.config import Config, ConfigError
from harness.config_files import daemon_cannot_apply, load_settings, project_path, read_project
from harness.mcp.spec import SERVER_NAME, McpServerSpec
from harness.messages.events import Event, TurnResult, finished_turn, wait_turn_finished
from harness.messages.model import Rule
from harness.messages.permission import Reply
from harness.providers.errors import ProviderError
from harness.runtime import Harness, HarnessError, open_harness
from harness.secrets import redact_data
from harness.storage.ledger import LedgerError

log = structlog.get_logger("harness.acp")


# How a harness turn's stop reason reads in ACP's five.
STOP_REASONS: dict[str, schema.StopReason] = {
    "answered": "end_turn",
    "max_steps": "max_turn_requests",
    "doom_loop": "max_turn_requests",
    "budget": "max_tokens",
    "overflow": "max_tokens",
    "denied": "refusal",
    "cancelled": "cancelled",
}
# The options of every permission ask, and the harness reply each one means.
PERMISSION_REPLIES: dict[str, Reply] = {
    "allow_once": "once",
    "allow_always": "always",
    "reject_once": "reject",
}
CANNOT_REACH = "the editor could not be asked"
LIST_PAGE = 50  # sessions per session/list page
SHUTDOWN_SECONDS = 10.0  # how long a closing agent waits for its cancelled turns to be recorded
CANNOT_ASK = (
    "the editor can only choose among options: go on with your best judgement and state "
    "the assumptions you make"
)


@dataclass(frozen=True)
class SessionFlags:
    """What the flags of ``harness acp`` set for every session, over the files."""

    model: str | None = None
    agent: str | None = None
    base_url: str | None = None
    rules: tuple[Rule, ...] = ()
    max_steps: int | None = None


@dataclass
class _Session:
    id: str
    directory: str
    mcp_servers: list[dict[str, Any]] = field(default_factory=list)
    max_steps: int | None = None
    prompting: bool = False
    cancel_requested: bool = False


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("harness")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def _mcp_summary(servers: list[dict[str, Any]]) -> list[str]:
    # Names and transports only: a server's env and headers may hold credentials.
    return [f"{s.get('name')} ({s.get('type', 'stdio')})" for s in servers]


class AcpAgent:
    """The agent side of ACP for one client connection, over one harness."""

    def __init__(self, h: Harness, connection: Connection, flags: SessionFlags) -> None:
        self.h = h
        self.connection = connection
        self.flags = flags
        self.sessions: dict[str, _Session] = {}
        # The project file the harness-wide settings were read from (see _session_settings).
        started_in = project_path(Path.cwd())
        self._started_in = started_in.resolve() if started_in is not None else None
        self._sandbox_noticed = False

    @property
    def methods(self) -> dict[str, jsonrpc.Handler]:
        return {
            "initialize": self.initialize,
            "authenticate": self.authenticate,
            "session/new": self.new_session,
            "session/load": self.load_session,
            "session/prompt": self.prompt,
            "session/list": self.list_sessions,
        }

    @property
    def notifications(self) -> dict[str, jsonrpc.NotificationHandler]:
        return {"session/cancel": self.cancel}

    # --- initialize ---------------------------------------------------------------------

    async def initialize(self, params: Params) -> dict[str, Any]:
        request = schema.InitializeRequest.model_validate(params)
        log.info(
            "acp initialize",
            client=request.client_info.name if request.client_info else None,
            protocol=request.protocol_version,
        )
        # We speak version 1; a client asking for another decides whether that will do.
        response = schema.InitializeResponse(
            protocol_version=PROTOCOL_VERSION,
            agent_capabilities=schema.AgentCapabilities(
                load_session=True,
                prompt_capabilities=schema.PromptCapabilities(embedded_context=True),
                # stdio always; streamable HTTP too; the deprecated SSE transport not.
                mcp_capabilities=schema.McpCapabilities(http=True, sse=False),
                session_capabilities=schema.SessionCapabilities(
                    list=schema.SessionListCapabilities()
                ),
            ),
            auth_methods=[],
            agent_info=schema.Implementation(name="harness", title="harness", version=_version()),
        )
        return dump(response)

    async def authenticate(self, params: Params) -> dict[str, Any]:
        # No auth method is offered: the model's key comes from the environment.
        schema.AuthenticateRequest.model_validate(params)
        return dump(schema.AuthenticateResponse())

    # --- sessions -----------------------------------------------------------------------

    def _session_settings(
        self, directory: Path
    ) -> tuple[str | None, str | None, list[Rule], int | None]:
        """Model, agent, rules and step limit for a session in ``directory``."""
        try:
            project = read_project(directory)
            settings = load_settings(directory)
        except ConfigError as error:
            raise RpcError(INVALID_PARAMS, str(error)) from None
        if project is not None and project[0] != self._started_in:
            local = daemon_cannot_apply(project[1])
            if local:
                raise RpcError(
                    INVALID_PARAMS,
                    f"{project[0]}: {', '.join(local)} configure the whole harness: start "
                    f"`harness acp` in {directory} to use them",
                )
        flags = self.flags
        model = flags.model or settings.get("model")
        agent = flags.agent or settings.get("agent")
        rules = [*settings.rules, *flags.rules]  # a flag's rule, last, wins
        max_steps = flags.max_steps or settings.get("max_steps")
        return model, agent, rules, max_steps

    def _client_servers(self, params: Params) -> dict[str, McpServerSpec]:
        specs = client_servers(params.get("mcpServers"))
        clash = sorted(set(specs) & set(self.h.config.mcp_servers))
        if clash:
            raise RpcError(
                INVALID_PARAMS,
                f"mcpServers: {clash[0]!r} is the name of a server harness is configured "
                "with: give the client's server another name",
            )
        return specs

    async def new_session(self, params: Params) -> dict[str, Any]:
        request = schema.NewSessionRequest.model_validate(params)
        directory = self._directory(request.cwd)
        specs = self._client_servers(params)  # before a session exists: a bad one makes none
        model, agent, rules, max_steps = self._session_settings(directory)
        try:
            session = await self.h.create_session(
                directory,
                model=model,
                agent=agent,
                permission=rules,
                base_url=self.flags.base_url or self.h.config.base_url,
            )
        except (HarnessError, UnknownAgentError, ProviderError, ConfigError) as error:
            raise RpcError(INVALID_PARAMS, str(error)) from None
        servers = [dump(server) for server in request.mcp_servers]
        # The client's MCP servers join this session's tools only (DESIGN §12, §13).
        await self.h.set_session_mcp_servers(session.id, specs)
        self.sessions[session.id] = _Session(session.id, session.directory, servers, max_steps)
        log.info("acp session", session_id=session.id, mcp_servers=_mcp_summary(servers))
        return dump(schema.NewSessionResponse(session_id=session.id))

    def _directory(self, cwd: str) -> Path:
        path = Path(cwd)
        if "\0" in cwd or not path.is_absolute():
            raise RpcError(INVALID_PARAMS, f"cwd must be an absolute path: {cwd[:200]!r}")
        try:
            if not path.is_dir():
                raise RpcError(INVALID_PARAMS, f"cwd is not a directory: {cwd[:200]}")
        except OSError as error:
            raise RpcError(INVALID_PARAMS, f"cwd {cwd[:200]!r}: {error}") from None
        return path

    async def load_session(self, params: Params) -> dict[str, Any]:
        """Replay an earlier session's history as updates, then take prompts for it."""
        request = schema.LoadSessionRequest.model_validate(params)
        try:
            stored = self.h.session(request.session_id)
        except HarnessError:
            raise RpcError(
                RESOURCE_NOT_FOUND,
                f"no session {request.session_id[:100]}",
                {"uri": request.session_id[:100]},
            ) from None
        if stored.parent_id is not None:
            raise RpcError(INVALID_PARAMS, f"{stored.id} is a subtask's session: load its parent")
        known = self.sessions.get(stored.id)
        if known is not None and known.prompting:
            raise RpcError(INVALID_REQUEST, f"session {stored.id} is running a prompt")
        _, _, _, max_steps = self._session_settings(Path(stored.directory))
        specs = self._client_servers(params)
        servers = [dump(server) for server in request.mcp_servers]
        translator = Translator(stored.id, stored.directory)
        messages = await self.h.messages(stored.id)
        for update in translator.history(messages, self.h.todos(stored.id)):
            await self.connection.notify("session/update", notification(stored.id, update))
        # A client sends its servers again with every load (they are its own, with its
        # credentials; harness keeps none of them across restarts): they replace the ones
        # an earlier session/load of this process gave.
        await self.h.set_session_mcp_servers(stored.id, specs)
        self.sessions[stored.id] = _Session(stored.id, stored.directory, servers, max_steps)
        log.info("acp session loaded", session_id=stored.id, mcp_servers=_mcp_summary(servers))
        return dump(schema.LoadSessionResponse())

    async def list_sessions(self, params: Params) -> dict[str, Any]:
        """The ledger's sessions (not subtasks), the most recently active first, of one
        directory when ``cwd`` is given; ``cursor`` is where the previous page ended."""
        request = schema.ListSessionsRequest.model_validate(params)
        start = 0
        if request.cursor is not None:
            if not request.cursor.isdigit():
                raise RpcError(INVALID_PARAMS, f"not a cursor of ours: {request.cursor[:100]!r}")
            start = int(request.cursor)
        found = [
            session
            for session in self.h.sessions()
            if session.parent_id is None
            and (request.cwd is None or session.directory == request.cwd)
        ]
        found.sort(key=lambda session: (session.updated, session.id), reverse=True)
        page = found[start : start + LIST_PAGE]
        more = start + LIST_PAGE < len(found)
        response = schema.ListSessionsResponse(
            sessions=[
                schema.SessionInfo(
                    session_id=session.id,
                    cwd=session.directory,
                    title=session.title or None,
                    updated_at=datetime.fromtimestamp(session.updated, UTC).isoformat(),
                )
                for session in page
            ],
            next_cursor=str(start + LIST_PAGE) if more else None,
        )
        return dump(response)

    def _open(self, session_id: str) -> _Session:
        session = self.sessions.get(session_id)
        if session is None:
            raise RpcError(
                RESOURCE_NOT_FOUND,
                f"no session {session_id[:100]} in this connection: session/new or "
                "session/load it first",
                {"uri": session_id[:100]},
            )
        return session

    # --- prompts ------------------------------------------------------------------------

    async def prompt(self, params: Params) -> dict[str, Any]:
        request = schema.PromptRequest.model_validate(params)
        session = self._open(request.session_id)
        if session.prompting:
            raise RpcError(INVALID_REQUEST, f"session {session.id} is already running a prompt")
        text = _prompt_text(request.prompt)
        session.prompting, session.cancel_requested = True, False
        try:
            result = await self._follow_turn(session, text)
        finally:
            session.prompting = False
        if result.reason == "error" and not session.cancel_requested:
            raise RpcError(INTERNAL_ERROR, f"the turn failed: {result.error}")
        reason = "cancelled" if session.cancel_requested else STOP_REASONS[result.reason]
        return dump(schema.PromptResponse(stop_reason=reason))

    async def _follow_turn(self, session: _Session, text: str) -> TurnResult:
        """Prompt, then turn the turn's events into updates until it finishes. A client
        slow to read its stdout may make the subscription fall behind: it is then taken
        up again from the ledger, so no tool call, plan or text is lost (only the live
        deltas in between: the finished text parts fill them in)."""
        translator = Translator(session.id, session.directory)
        message_id: str | None = None
        after: int | None = None
        asked: set[str] = set()  # the asks already put to the client, by request id
        async with trio.open_nursery() as asks:
            while True:
                async with self.h.follow(session.id, after) as events:
                    if message_id is None:
                        try:
                            message_id = await self.h.prompt(
                                session.id, text, max_steps=session.max_steps
                            )
                        except HarnessError as error:
                            raise RpcError(INVALID_PARAMS, str(error)) from None
                        for pending in await self._pending_asks(session.id):
                            self._put(session, pending, asks, asked)
                    async for event in events:
                        if event.type == "feed.overflow":
                            log.info("acp client fell behind", session_id=session.id)
                            after = events.last_seq
                            break
                        await self._show(session, translator, event)
                        self._put(session, event, asks, asked)
                        result = finished_turn(event, message_id=message_id)
                        if result is not None:
                            for update in translator.flush():
                                await self.connection.notify(
                                    "session/update", notification(session.id, update)
                                )
                            asks.cancel_scope.cancel()  # an ask still open belongs to the turn
                            return result
                    else:
                        raise RpcError(INTERNAL_ERROR, "the harness stopped before the turn ended")

    async def _pending_asks(self, session_id: str) -> list[Event]:
        """The asks of this session's tree waiting already, as the events that made them:
        a turn resumed when this process started (the last one stopped mid-turn) may wait
        for an answer nobody else will forward, and the new prompt queues behind it."""
        family = {session_id, *(child for _, child in self.h.session_tree(session_id))}
        now = time.time()
        found = [
            Event(None, now, "permission.asked", ask.session_id, ask.model_dump(mode="json"))
            for ask in await self.h.pending_permissions()
            if ask.session_id in family
        ]
        found += [
            Event(None, now, "question.asked", ask.session_id, ask.model_dump(mode="json"))
            for ask in await self.h.pending_questions()
            if ask.session_id in family
        ]
        return found

    def _put(self, session: _Session, event: Event, asks: trio.Nursery, asked: set[str]) -> None:
        """Put an ask to the client, once (it may come both listed and as an event)."""
        if event.type not in ("permission.asked", "question.asked"):
            return
        if event.data["id"] in asked:
            return
        asked.add(event.data["id"])
        if event.type == "permission.asked":
            asks.start_soon(self._ask_permission, session, event)
        else:
            asks.start_soon(self._ask_questions, session, event)

    async def _show(self, session: _Session, translator: Translator, event: Event) -> None:
        for update in translator.updates(event):
            await self.connection.notify("session/update", notification(session.id, update))
        if event.type == "sandbox.unavailable" and not self._sandbox_noticed:
            # Where an editor keeps its agent's log: commands ran unsandboxed.
            self._sandbox_noticed = True
            print(f"harness: {event.data.get('notice')}", file=sys.stderr, flush=True)
        elif event.type == "turn.started" and session.cancel_requested:
            await self.h.cancel(session.id)  # the cancel came before the turn began

    async def cancel(self, params: Params) -> None:
        request = schema.CancelNotification.model_validate(params)
        session = self.sessions.get(request.session_id)
        if session is None or not session.prompting:
            return
        session.cancel_requested = True
        await self.h.cancel(session.id)

    async def cancel_turns(self) -> None:
        """The client is gone: cancel the turns of its sessions still running and wait
        until each has recorded its end (the open calls as cancelled), as ``harness run``
        does on Ctrl-C, rather than leave them for the next start to find interrupted."""
        running = [
            session_id
            for session_id in self.sessions
            if self.h.session(session_id).status in ("busy", "retry")
        ]
        async with trio.open_nursery() as nursery:
            for session_id in running:
                nursery.start_soon(self._cancel_and_wait, session_id)

    async def _cancel_and_wait(self, session_id: str) -> None:
        async with self.h.subscribe(session_id) as events:
            if await self.h.cancel(session_id):
                await wait_turn_finished(events, session_id=session_id)

    # --- asks ---------------------------------------------------------------------------

    async def _ask_permission(self, session: _Session, event: Event) -> None:
        try:
            await self._put_permission(session, event)
        except Exception:  # the prompt goes on; the call is rejected if it still can be
            log.exception("acp permission ask failed", session_id=session.id)
            with contextlib.suppress(Exception):
                await self.h.reply_permission(str(event.data["id"]), "reject", CANNOT_REACH)

    async def _put_permission(self, session: _Session, event: Event) -> None:
        data = event.data
        tool = str(data.get("tool", ""))
        always = str(data.get("always", ""))
        # What the gate asks about (a command, a path), which a tool's title may not say.
        title = f"{data.get('permission')}: {str(data.get('pattern', ''))[:300]}"
        request = schema.RequestPermissionRequest(
            session_id=session.id,
            tool_call=schema.ToolCallUpdate(
                tool_call_id=str(data.get("call_id", "")),
                title=title,
                kind=tool_kind(tool),
                status="pending",
            ),
            options=[
                schema.PermissionOption(
                    option_id="allow_once", name="Allow once", kind="allow_once"
                ),
                schema.PermissionOption(
                    option_id="allow_always",
                    name=f"Always allow {always[:200]}",
                    kind="allow_always",
                ),
                schema.PermissionOption(option_id="reject_once", name="Reject", kind="reject_once"),
            ],
        )
        reply: Reply = "reject"
        message: str | None = None
        choice = await self._choose(request)
        if choice in PERMISSION_REPLIES:
            reply = PERMISSION_REPLIES[choice]
        elif choice is not None:
            message = f"the editor answered with an option that was not offered: {choice[:100]}"
        await self.h.reply_permission(str(data["id"]), reply, message)

    async def _choose(self, request: schema.RequestPermissionRequest) -> str | None:
        """The option the client chose; None when it cancelled, failed or answered
        something that is not a permission outcome."""
        try:
            answer = await self.connection.request("session/request_permission", dump(request))
            outcome = schema.RequestPermissionResponse.model_validate(answer).outcome
        except (RpcError, jsonrpc.ConnectionClosed, ValueError) as error:
            log.info("acp permission request failed", error=str(error)[:200])
            return None
        return outcome.option_id if isinstance(outcome, schema.AllowedOutcome) else None

    async def _ask_questions(self, session: _Session, event: Event) -> None:
        try:
            await self._put_questions(session, event)
        except Exception:
            log.exception("acp question failed", session_id=session.id)
            with contextlib.suppress(Exception):
                await self.h.reject_question(str(event.data["id"]), CANNOT_REACH)

    async def _put_questions(self, session: _Session, event: Event) -> None:
        """The ``question`` tool's questions, each as a choice among its options; a
        question without options cannot be put to an ACP client, so the model is told."""
        data = event.data
        answers: list[list[str]] = []
        for index, info in enumerate(data.get("questions") or []):
            labels = [str(option["label"]) for option in info.get("options") or []]
            if not labels:
                await self.h.reject_question(str(data["id"]), CANNOT_ASK)
                return
            request = schema.RequestPermissionRequest(
                session_id=session.id,
                tool_call=schema.ToolCallUpdate(
                    tool_call_id=str(data.get("call_id", "")),
                    title=str(info.get("question", ""))[:1000],
                    kind="other",
                    status="pending",
                ),
                options=[
                    *(
                        schema.PermissionOption(
                            option_id=f"option-{n}", name=label, kind="allow_once"
                        )
                        for n, label in enumerate(labels)
                    ),
                    schema.PermissionOption(
                        option_id="dismiss", name="Dismiss", kind="reject_once"
                    ),
                ],
            )
            choice = await self._choose(request)
            if choice is None or not choice.startswith("option-"):
                await self.h.reject_question(str(data["id"]))  # dismissed: the turn stops
                return
            number = choice.removeprefix("option-")
            if not number.isdigit() or int(number) >= len(labels):
                await self.h.reject_question(str(data["id"]), CANNOT_ASK)
                return
            answers.append([labels[int(number)]])
            log.debug("acp question answered", index=index)
        await self.h.answer_question(str(data["id"]), answers)


def client_servers(raw: object) -> dict[str, McpServerSpec]:
    """A client's ``mcpServers`` as harness server specs, by name; -32602 saying which
    one is wrong and why. Read from the raw parameters: the schema's union takes a stdio
    server without a ``command`` for nothing at all and drops it."""
    if raw is None:
        return {}
    if not isinstance(raw, list):
        raise RpcError(INVALID_PARAMS, "mcpServers must be a list")
    specs: dict[str, McpServerSpec] = {}
    for index, item in enumerate(raw):
        where = f"mcpServers[{index}]"
        if not isinstance(item, dict):
            raise RpcError(INVALID_PARAMS, f"{where}: not an object")
        kind = item.get("type", "stdio")
        try:
            if kind == "http":
                http = schema.HttpMcpServer.model_validate(item)
                name = http.name
                spec = McpServerSpec(
                    url=http.url, headers={h.name: h.value for h in http.headers}
                )
            elif kind == "stdio":
                stdio = schema.McpServerStdio.model_validate(item)
                name = stdio.name
                spec = McpServerSpec(
                    command=[stdio.command, *stdio.args],
                    env={variable.name: variable.value for variable in stdio.env},
                )
            else:
                raise RpcError(
                    INVALID_PARAMS,
                    f"{where}: the {str(kind)[:20]!r} transport is not supported "
                    "(harness speaks stdio and http)",
                )
        except ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'server'}: {e['msg']}"
                for e in error.errors()[:5]
            )
            raise RpcError(INVALID_PARAMS, f"{where}: {problems}") from None
        if not re.fullmatch(SERVER_NAME, name):
            raise RpcError(
                INVALID_PARAMS,
                f"{where}: the name {name[:40]!r} must be 1-32 of A-Z a-z 0-9 _ - "
                "(its tools are offered as NAME_tool)",
            )
        if name in specs:
            raise RpcError(INVALID_PARAMS, f"{where}: a second server named {name!r}")
        specs[name] = spec
    return specs


def _prompt_text(blocks: list[Any]) -> str:
    """A prompt's content blocks as the text the model reads: text as is, a linked file by
    its URI, an embedded text resource fenced with its URI."""
    pieces: list[str] = []
    for block in blocks:
        if isinstance(block, schema.TextContentBlock):
            pieces.append(block.text)
        elif isinstance(block, schema.ResourceContentBlock):
            pieces.append(f"[{block.name}]({block.uri})")
        elif isinstance(block, schema.EmbeddedResourceContentBlock):
            resource = block.resource
            if not isinstance(resource, schema.TextResourceContents):
                unsupported = f"binary resource {resource.uri[:200]}: not supported"
                raise RpcError(INVALID_PARAMS, unsupported)
            pieces.append(f"{resource.uri}:\n```\n{resource.text}\n```")
        else:
            raise RpcError(INVALID_PARAMS, f"{block.type} content is not supported")
    text = "\n\n".join(piece for piece in pieces if piece)
    if not text.strip():
        raise RpcError(INVALID_PARAMS, "the prompt is empty")
    return text


# --- stdin/stdout -----------------------------------------------------------------------


@asynccontextmanager
async def _stdio() -> AsyncIterator[tuple[trio.lowlevel.FdStream, trio.lowlevel.FdStream]]:
    """The protocol's own copies of stdin and stdout; fd 0 becomes /dev/null and fd 1
    stderr, so nothing else in this process (a print, a child) can read or write the
    protocol's bytes."""
    protocol_in, protocol_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    receive, send = trio.lowlevel.FdStream(protocol_in), trio.lowlevel.FdStream(protocol_out)
    try:
        yield receive, send
    finally:
        with trio.CancelScope(shield=True):
            # Each FdStream puts back the blocking mode it found. On a terminal both are
            # one file, shared with the shell, and the second found it non-blocking
            # already: closed in reverse order, the file ends as the shell left it.
            await send.aclose()
            await receive.aclose()


async def serve_acp(config: Config, flags: SessionFlags) -> None:
    """``harness acp``: the agent on stdin/stdout until the client closes stdin."""
    # The protocol's streams first: whatever starts after them cannot write on stdout.
    async with _stdio() as (receive, send), contextlib.AsyncExitStack() as stack:
        # What the editor gets passes redaction, as whatever the CLI prints does: live
        # text is never stored, so the ledger's redaction has not seen it.
        connection = Connection(receive, send, scrub=redact_data)
        try:
            h = await stack.enter_async_context(open_harness(config, session_mcp=True))
        except LedgerError as error:
            await _refuse(connection, str(error))
            raise SystemExit(1) from None
        agent = AcpAgent(h, connection, flags)
        log.info("acp serving", model=config.model)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_stop_on_signal, nursery.cancel_scope)
            await connection.serve(agent.methods, agent.notifications)
            nursery.cancel_scope.cancel()
        with trio.move_on_after(SHUTDOWN_SECONDS):
            await agent.cancel_turns()
    log.info("acp stopped")


async def _refuse(connection: Connection, reason: str) -> None:
    """No harness to serve with (its ledger is another process's): say why on stderr and
    in answer to every request, where an editor shows it, until the client gives up."""
    print(f"harness: {reason}", file=sys.stderr, flush=True)

    async def refused(params: Params) -> None:
        raise RpcError(INTERNAL_ERROR, f"harness cannot start: {reason}")

    methods = dict.fromkeys(AGENT_METHODS.values(), refused)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_stop_on_signal, nursery.cancel_scope)
        await connection.serve(methods, {})
        nursery.cancel_scope.cancel()


async def _stop_on_signal(scope: trio.CancelScope) -> None:
    """An editor closing its agent sends SIGTERM (or SIGHUP with its terminal): stop as
    when stdin closes, so running turns are recorded as cancelled and their commands'
    process groups killed, rather than left for the next start to reap."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP) as signals:
        async for number in signals:
            log.info("acp signal", signal=signal.Signals(number).name)
            scope.cancel()
            return
