"""MCP client actors (DESIGN §12): one per configured server per harness.

``McpHub`` holds a harness's servers; it runs in the harness's nursery, so a server's
connection outlives the turn that started it and is shared by every session. A server is
started lazily: when a session's turn starts (``prepare``), or when one of its tools is
called after it died (restarted on next use). Its connection lives in a task of the hub's
own (the SDK's task groups must be entered and left by one task), and is the only place
its state changes; a call runs in the calling tool's task, on the connection's
``ClientSession``, which correlates concurrent requests. So a cancelled session cancels its
call where it runs: the SDK sends ``notifications/cancelled`` and the call returns at once,
and the server, shared, goes on.

What can go wrong is an event and a clear tool error, never a failed turn:
``mcp.failed`` (a start that failed or took longer than ``startup_timeout``),
``mcp.exited`` (a server that stopped, with why), ``mcp.warning`` (a tool left out: a
schema a provider would reject, a name already taken). A stdio server's process group is
in the ledger (``mcp.process``) from before its first message, so a harness restarted
after ``kill -9`` reaps it (``recovery.reap_mcp_servers``).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import mcp.types as mt
import structlog
import trio
from mcp import ClientSession
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from harness.actors.mcp_hub import McpHub as Hub
from harness.actors.mcp_hub import McpUnavailable, ServerStatus, State
from harness.mcp.naming import tool_name
from harness.mcp.results import read_text, result_text
from harness.mcp.schemas import schema_problem, schema_tokens
from harness.mcp.spec import McpServerSpec, MissingVariable, expand
from harness.mcp.stdio import StdioServer, open_stdio
from harness.messages.events import EventType, NewEvent
from harness.secrets import tool_environment
from harness.storage.ledger import Ledger
from harness.tools.base import Tool, ToolContext, ToolFailure, ToolOutput
from harness.tools.mcp import (
    McpToolInfo,
    mcp_tool,
    resources_tool,
)
from harness.tools.process import process_identity

log = structlog.get_logger("harness.mcp")
# This harness process, as its MCP servers' records name it (recovery.reap_mcp_servers).
OWNER = process_identity(os.getpid())

MAX_PAGES = 50  # of tools/list, prompts/list: a server that pages forever is cut off
HARNESS_INFO = mt.Implementation(name="harness", version="0.1.0")


def _reason(error: BaseException) -> str:
    """One line for a failure inside the SDK's task groups."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    if isinstance(error, FileNotFoundError):
        return f"the command was not found: {error.filename or error}"
    if isinstance(error, MCPError):
        return f"the server answered with an error: {error.message}"
    text = str(error) or type(error).__name__
    return f"{type(error).__name__}: {text}" if not isinstance(error, McpUnavailable) else text


def _cancelled(error: BaseException) -> bool:
    if isinstance(error, trio.Cancelled):
        return True
    if isinstance(error, BaseExceptionGroup):
        return any(_cancelled(inner) for inner in error.exceptions)
    return False


class McpClient:
    """One server: its connection, its tools, its state."""

    def __init__(
        self,
        name: str,
        spec: McpServerSpec,
        hub: Hub,
        environ: Mapping[str, str],
        *,
        scope: str | None = None,
    ) -> None:
        self.name = name
        self.spec = spec
        # The one session an ACP client gave this server to (None: configured, shared).
        # Its ``env`` and ``headers`` are the client's literal values, not ``${VAR}``s.
        self.scope = scope
        self._hub = hub
        self._environ = environ
        self.state: State = "idle" if spec.enabled else "disabled"
        self.last_error: str | None = None
        self.infos: dict[str, McpToolInfo] = {}  # by the name the model sees
        self.tools: dict[str, Tool[Any]] = {}
        self.prompts: list[str] = []
        self.has_resources = False
        self.warnings: list[str] = []
        self._session: ClientSession | None = None
        self._ready = trio.Event()
        self._done = trio.Event()
        self._done.set()
        self._stop = trio.CancelScope()
        self._lock = trio.Lock()
        self._stale = False  # tools/list_changed: list again at the next step
        self._owner = ""  # the session whose events tell of this server
        self._directory = Path.cwd()

    @property
    def running(self) -> bool:
        return self.state == "running"

    @property
    def schema_tokens(self) -> int:
        return sum(info.tokens for info in self.infos.values())

    def status(self) -> ServerStatus:
        return ServerStatus(
            self.name,
            self.spec.transport,
            self.state,
            len(self.infos),
            self.schema_tokens,
            self.last_error,
            list(self.prompts),
            self.has_resources,
            list(self.warnings),
        )

    # --- life -------------------------------------------------------------------------------

    async def ensure(self, session_id: str, directory: Path) -> None:
        """Running when this returns, or ``McpUnavailable`` saying why not."""
        if self.running:
            return
        if self.state == "disabled":
            raise McpUnavailable(f"the MCP server '{self.name}' is disabled (enabled = false)")
        async with self._lock:
            if self.state not in ("starting", "running"):
                self._owner, self._directory = session_id, directory
                self.state = "starting"
                self._ready, self._done = trio.Event(), trio.Event()
                self._stop = trio.CancelScope()
                self._hub.nursery.start_soon(self._connection)
            # A caller cancelled here leaves the start going: the next one waits for it.
            await self._ready.wait()
        if not self.running:
            raise McpUnavailable(
                f"the MCP server '{self.name}' is not available: {self.last_error}"
            )

    async def _connection(self) -> None:
        """The server's whole life: start, serve, stop; the only task that changes state."""
        process: StdioServer | None = None
        reason = "the connection ended"
        timeout = self.spec.startup_timeout
        started_at = time.monotonic()
        try:
            with self._stop, trio.CancelScope(deadline=trio.current_time() + timeout) as startup:
                async with self._transport() as (read, write, process):
                    if process is not None:
                        # Durable before the first message: a kill -9 from here on leaves a
                        # group the next harness finds (recovery.reap_mcp_servers).
                        # ``owner``: this harness, so a daemon sharing the ledger never
                        # reaps a server whose harness still runs.
                        record = {"process": process.identity, "pid": process.pid, "owner": OWNER}
                        await self._post("mcp.process", record)
                    session = ClientSession(
                        read, write, message_handler=self._on_message, client_info=HARNESS_INFO
                    )
                    async with session:
                        result = await session.initialize()
                        await self._load(session, result.capabilities)
                        startup.deadline = math.inf
                        self._session = session
                        self.state, self.last_error = "running", None
                        self._post_soon(
                            "mcp.started",
                            {
                                "transport": self.spec.transport,
                                "pid": process.pid if process is not None else None,
                                "tools": len(self.infos),
                                "schema_tokens": self.schema_tokens,
                                "seconds": round(time.monotonic() - started_at, 3),
                            },
                        )
                        self._ready.set()
                        if process is not None:
                            await process.exited.wait()
                            reason = _exit_reason(process)
                        else:
                            await trio.sleep_forever()
            if startup.cancelled_caught:
                reason = f"did not start within {timeout:g} s (startup_timeout)"
            elif self._stop.cancelled_caught:
                reason = self.last_error or "stopped"
        except BaseException as error:
            if _cancelled(error):
                reason = "the harness stopped"
                raise
            reason = _reason(error)
            if process is not None and process.process.returncode is not None:
                reason = _exit_reason(process)
            log.warning("mcp server failed", server=self.name, reason=reason)
        finally:
            self._finish(reason, process)

    def _finish(self, reason: str, process: StdioServer | None) -> None:
        was_running = self.state == "running"
        self._session = None
        self.state = "exited" if was_running else "failed"
        if reason != "the harness stopped":
            self.last_error = reason
        identity = process.identity if process is not None else None
        data: dict[str, Any] = {"reason": reason, "process": identity}
        if process is not None:
            data["code"] = process.process.returncode
        self._post_soon("mcp.exited" if was_running else "mcp.failed", data)
        self._ready.set()
        self._done.set()

    @contextlib.asynccontextmanager
    async def _transport(self) -> AsyncIterator[tuple[Any, Any, StdioServer | None]]:
        spec = self.spec
        try:
            if spec.command is not None:
                env = {**tool_environment(environ=self._environ), **self._expand(spec.env)}
                cwd = Path(spec.cwd).expanduser() if spec.cwd else self._directory
                log_name = self.name if self.scope is None else f"{self.scope}-{self.name}"
                stderr = self._hub.home / "logs" / f"mcp-{log_name}.stderr"
                async with open_stdio(spec.command, cwd=cwd, env=env, stderr=stderr) as server:
                    yield server.read, server.write, server
                return
            headers = self._expand(spec.headers)
        except MissingVariable as error:
            raise McpUnavailable(str(error)) from None
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        assert spec.url is not None
        async with (
            create_mcp_http_client(headers=headers) as client,
            streamable_http_client(spec.url, http_client=client) as (read, write),
        ):
            yield read, write, None

    def _expand(self, values: Mapping[str, str]) -> dict[str, str]:
        # A client's values are literal: a ``${VAR}`` in them must not read harness's
        # environment (a key the client was never given).
        return dict(values) if self.scope is not None else expand(values, self._environ)

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, mt.ToolListChangedNotification):
            self._stale = True
        elif isinstance(message, Exception):
            log.debug("mcp transport message", server=self.name, error=str(message))

    async def stop(self) -> None:
        self._stop.cancel()
        await self._done.wait()

    # --- tools ------------------------------------------------------------------------------

    async def _load(self, session: ClientSession, capabilities: mt.ServerCapabilities) -> None:
        listed: list[mt.Tool] = []
        bad: list[tuple[str, str]] = []
        if capabilities.tools is not None:
            listed, bad = await self._list_tools(session)
        self.has_resources = capabilities.resources is not None
        self._take_tools(listed, bad)
        self.prompts = []
        if capabilities.prompts is not None:
            prompts = await session.list_prompts()
            self.prompts = [p.name for p in prompts.prompts]

    async def _list_tools(
        self, session: ClientSession
    ) -> tuple[list[mt.Tool], list[tuple[str, str]]]:
        """Every page of ``tools/list``: the tools, and those that could not be read.

        The SDK validates a listing whole, so one tool it finds malformed (a schema whose
        type is not "object") would lose every tool of the server. Then the listing is
        asked for again raw and read tool by tool, and only the bad one is left out.
        """
        try:
            tools: list[mt.Tool] = []
            cursor: str | None = None
            for _ in range(MAX_PAGES):
                page = await session.list_tools(params=mt.PaginatedRequestParams(cursor=cursor))
                tools += page.tools
                cursor = page.next_cursor
                if not cursor:
                    break
            return tools, []
        except ValidationError:
            pass
        tools, bad = [], []
        cursor = None
        for _ in range(MAX_PAGES):
            # The dispatcher's raw request: the one way past the listing's validation.
            raw = await session._dispatcher.send_raw_request(
                "tools/list", {"cursor": cursor} if cursor else None, {}
            )
            for item in raw.get("tools") or []:
                try:
                    tools.append(mt.Tool.model_validate(item, by_name=False))
                except ValidationError as error:
                    name = str(item.get("name", "?")) if isinstance(item, dict) else "?"
                    problem = error.errors()[0]
                    where = ".".join(str(p) for p in problem["loc"])
                    bad.append((name, f"{where}: {problem['msg']}"))
            cursor = raw.get("nextCursor")
            if not isinstance(cursor, str) or not cursor:
                break
        # What the SDK keeps of a listing (output schemas for checking results): without
        # it, every call would list the tools again and fail the same way.
        session._absorb_tool_listing(mt.ListToolsResult(tools=tools), complete=True)
        return tools, bad

    def _take_tools(self, listed: Sequence[mt.Tool], bad: Sequence[tuple[str, str]] = ()) -> None:
        infos: dict[str, McpToolInfo] = {}
        self.warnings = []
        taken = self._hub.taken_names(self.name, self.scope)
        for unread, why in bad:
            self._warn(unread, why)
        for tool in listed:
            name = tool_name(self.name, tool.name)
            problem = schema_problem(tool.input_schema)
            if problem is None and (name in taken or name in infos):
                problem = f"its name {name} is already taken"
            if problem is not None:
                self._warn(tool.name, problem)
                continue
            annotations = tool.annotations
            description = tool.description or tool.title or tool.name
            infos[name] = McpToolInfo(
                server=self.name,
                remote=tool.name,
                name=name,
                description=description,
                schema=tool.input_schema,
                read_only=bool(annotations and annotations.read_only_hint),
                idempotent=bool(annotations and annotations.idempotent_hint),
                tokens=schema_tokens(name, description, tool.input_schema),
            )
        self.infos = infos
        tools: dict[str, Tool[Any]] = {name: mcp_tool(info, self) for name, info in infos.items()}
        resources = tool_name(self.name, "resources")
        if self.has_resources and resources not in tools and resources not in taken:
            tools[resources] = resources_tool(resources, self)
        self.tools = tools
        self._hub.changed()

    def _warn(self, tool: str, problem: str) -> None:
        self.warnings.append(f"tool '{tool}' left out: {problem}")
        self._post_soon("mcp.warning", {"tool": tool, "reason": problem})
        log.warning("mcp tool left out", server=self.name, tool=tool, reason=problem)

    async def refresh(self) -> None:
        """After ``tools/list_changed``: list the tools again (at the start of a step)."""
        session = self._session
        if not self._stale or session is None:
            return
        self._stale = False
        try:
            with trio.fail_after(self.spec.timeout):
                listed, bad = await self._list_tools(session)
        except (MCPError, trio.TooSlowError, ValidationError) as error:
            self._post_soon("mcp.warning", {"reason": f"tools/list failed: {_reason(error)}"})
            return
        self._take_tools(listed, bad)

    async def call_tool(
        self, tool: str, arguments: dict[str, Any], ctx: ToolContext
    ) -> ToolOutput:
        session = await self._session_for(ctx)
        with trio.move_on_after(self.spec.timeout) as timer:
            try:
                result = await session.call_tool(tool, arguments)
            except MCPError as error:
                raise await self._call_failure(error, tool) from None
            except (ValidationError, RuntimeError) as error:
                raise ToolFailure(
                    f"the MCP server '{self.name}' answered '{tool}' with a result harness "
                    f"cannot read: {_reason(error)}"
                ) from None
        if timer.cancelled_caught:
            raise ToolFailure(
                f"the MCP server '{self.name}' did not answer '{tool}' within "
                f"{self.spec.timeout:g} s (its timeout); the call was cancelled"
            )
        text = result_text(result)
        if result.is_error:
            raise ToolFailure(text)
        return ToolOutput(text, metadata={"mcp": {"server": self.name, "tool": tool}})

    async def resources(self, uri: str | None, ctx: ToolContext) -> ToolOutput:
        session = await self._session_for(ctx)
        with trio.move_on_after(self.spec.timeout) as timer:
            try:
                if uri is None:
                    listed = await session.list_resources()
                    lines = [
                        f"{r.uri} ({r.mime_type or 'unknown type'}): {r.name}"
                        + (f" — {r.description}" if r.description else "")
                        for r in listed.resources
                    ]
                    return ToolOutput("\n".join(lines) or "(no resources)")
                return ToolOutput(read_text(await session.read_resource(uri)))
            except MCPError as error:
                raise await self._call_failure(error, uri or "resources/list") from None
        assert timer.cancelled_caught
        raise ToolFailure(
            f"the MCP server '{self.name}' did not answer within {self.spec.timeout:g} s "
            "(its timeout); the request was cancelled"
        )

    async def _session_for(self, ctx: ToolContext) -> ClientSession:
        try:
            await self.ensure(ctx.session_id, ctx.directory)
        except McpUnavailable as error:
            raise ToolFailure(str(error)) from None
        session = self._session
        if session is None:
            raise ToolFailure(f"the MCP server '{self.name}' is not available: it just stopped")
        return session

    async def _call_failure(self, error: MCPError, what: str) -> ToolFailure:
        if error.code != mt.CONNECTION_CLOSED:
            return ToolFailure(f"the MCP server '{self.name}' answered with an error: {error}")
        # The connection's task is the one that says why; give it a moment to see it.
        with trio.move_on_after(2.0):
            await self._done.wait()
        why = self.last_error or "closed the connection"
        return ToolFailure(
            f"the MCP server '{self.name}' stopped during '{what}' ({why}); the call's result "
            "is lost. It is started again on next use."
        )

    # --- events -----------------------------------------------------------------------------

    def _event(self, kind: EventType, data: dict[str, Any]) -> NewEvent:
        return NewEvent(kind, self._owner, {"server": self.name, **data})

    async def _post(self, kind: EventType, data: dict[str, Any]) -> None:
        await self._hub.ledger.write([self._event(kind, data)])

    def _post_soon(self, kind: EventType, data: dict[str, Any]) -> None:
        # A ledger already closed (a harness torn down around a dying server) loses the
        # record, not the shutdown.
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            self._hub.ledger.post([self._event(kind, data)])


def _exit_reason(process: StdioServer) -> str:
    code = process.process.returncode
    killed = code is not None and code < 0
    how = f"killed by signal {-code}" if killed and code is not None else f"exited with code {code}"
    # Its last lines: the error a traceback ends with, not the whole of it.
    tail = " | ".join(process.stderr_tail().splitlines()[-3:])
    return f"{how}: {tail[-400:]}" if tail else how


def make_client(hub: Hub, name: str, spec: McpServerSpec, scope: str | None) -> McpClient:
    return McpClient(name, spec, hub, hub.environ, scope=scope)


class McpHub(Hub):
    """A hub whose servers are this module's clients (``harness mcp``'s probe, tests)."""

    def __init__(self, servers: Mapping[str, McpServerSpec], **options: Any) -> None:
        super().__init__(servers, client_factory=make_client, **options)


def summary(hub: Hub) -> dict[str, Any]:
    """What ``harness mcp --json`` prints: each server, and whether tool search is on."""
    return {
        "servers": [status.to_dict() for status in hub.status()],
        "schema_tokens": hub.schema_tokens(),
        "search_threshold": hub.search_threshold,
        "tool_search": hub.searching(),
    }


async def probe(
    servers: Mapping[str, McpServerSpec],
    *,
    home: Path,
    directory: Path,
    search_threshold: int,
) -> dict[str, Any]:
    """Start every configured server once, as a session's first turn would, and report.

    For ``harness mcp`` without a daemon: the servers' records go to a scratch ledger (the
    real one may be held by a running harness), and every server is stopped before this
    returns, its process group with it.
    """
    import tempfile

    with tempfile.TemporaryDirectory(prefix="harness-mcp-") as scratch:
        ledger = Ledger(Path(scratch) / "ledger.db")
        hub = McpHub(servers, ledger=ledger, home=home, search_threshold=search_threshold)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ledger.run_writer, None)
                await nursery.start(hub.run)
                await hub.prepare("", directory)
                report = summary(hub)
                for client in hub.clients.values():
                    await client.stop()
                ledger.close_writer()
                nursery.cancel_scope.cancel()
        finally:
            ledger.close()
    return report
