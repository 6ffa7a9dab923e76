"""The MCP servers of one harness (DESIGN §12), without the SDK until a server exists.

The configured servers are shared by every session; an ACP client's servers belong to
the one session it gave them to (``session_clients``). ``harness acp`` always runs a hub,
so that a session can be given servers; this module imports the SDK (``mcp_client``, half
a second) only when the first server is made, so an agent whose clients send none starts
as fast as before. The clients are in ``harness.actors.mcp_client``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import trio

from harness.mcp.naming import tool_name
from harness.mcp.spec import McpServerSpec
from harness.messages.model import Rule
from harness.storage.port import LedgerPort
from harness.tools.base import Tool
from harness.tools.mcp import SEARCH_TOOL, McpToolInfo

State = Literal["idle", "starting", "running", "failed", "exited", "disabled"]


class McpUnavailable(Exception):
    """The server could not be started: the reason, for the tool error and the event."""


@dataclass
class ServerStatus:
    """One line of ``harness mcp``."""

    name: str
    transport: str
    state: State
    tools: int
    schema_tokens: int
    last_error: str | None
    prompts: list[str] = field(default_factory=list)
    resources: bool = False
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "transport": self.transport,
            "state": self.state,
            "tools": self.tools,
            "schema_tokens": self.schema_tokens,
            "last_error": self.last_error,
            "prompts": self.prompts,
            "resources": self.resources,
            "warnings": self.warnings,
        }


class HubClient(Protocol):
    """What the hub needs of a server's client (``mcp_client.HubClient``)."""

    @property
    def name(self) -> str: ...
    @property
    def scope(self) -> str | None: ...
    @property
    def state(self) -> State: ...
    @property
    def tools(self) -> Mapping[str, Tool[Any]]: ...
    @property
    def infos(self) -> Mapping[str, McpToolInfo]: ...
    @property
    def schema_tokens(self) -> int: ...
    def status(self) -> ServerStatus: ...
    async def ensure(self, session_id: str, directory: Path) -> None: ...
    async def stop(self) -> None: ...
    async def refresh(self) -> None: ...


# Makes a server's client: given by the caller, so that this module needs no SDK.
ClientFactory = Callable[["McpHub", str, McpServerSpec, str | None], HubClient]


class McpHub:
    """The MCP servers of one harness."""

    def __init__(
        self,
        servers: Mapping[str, McpServerSpec],
        *,
        ledger: LedgerPort,
        home: Path,
        search_threshold: int,
        client_factory: ClientFactory,
        environ: Mapping[str, str] | None = None,
        reserved: frozenset[str] = frozenset(),
    ) -> None:
        self._factory = client_factory
        self.ledger = ledger
        self.home = home
        self.search_threshold = search_threshold
        self.reserved = reserved  # the built-in tools' names
        env = os.environ if environ is None else environ
        self.environ = env
        self.clients = {name: self._client(name, spec) for name, spec in servers.items()}
        self.version = 0  # bumped whenever a server's tools change
        # The servers an ACP client gave one session (``harness acp``): seen by that
        # session's turns only, started lazily like the configured ones, stopped when the
        # session's servers are replaced (``session/load``) or the harness stops.
        self.session_clients: dict[str, dict[str, HubClient]] = {}
        self._nursery: trio.Nursery | None = None
        self._loaded: dict[str, set[str]] = {}  # session → tools loaded by mcp_search

    def _client(self, name: str, spec: McpServerSpec, scope: str | None = None) -> HubClient:
        return self._factory(self, name, spec, scope)

    @property
    def nursery(self) -> trio.Nursery:
        assert self._nursery is not None, "McpHub.run has not started"
        return self._nursery

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def changed(self) -> None:
        self.version += 1

    def of(self, session_id: str | None) -> list[HubClient]:
        """The servers a session sees: the configured ones, then its client's own."""
        own = self.session_clients.get(session_id, {}) if session_id is not None else {}
        return [*self.clients.values(), *own.values()]

    async def set_session_servers(
        self, session_id: str, servers: Mapping[str, McpServerSpec]
    ) -> None:
        """Give a session the servers its ACP client sent, in place of any it had.

        The configured servers' names are the client's to avoid (``NAME_tool`` must stay
        one tool): the caller refuses such a name before this.
        """
        old = self.session_clients.pop(session_id, {})
        for client in old.values():
            await client.stop()
        if servers:
            self.session_clients[session_id] = {
                name: self._client(name, spec, scope=session_id)
                for name, spec in servers.items()
            }
        self.changed()

    def taken_names(self, server: str, scope: str | None = None) -> set[str]:
        names = set(self.reserved) | {SEARCH_TOOL}
        for client in self.of(scope):
            if (client.name, client.scope) != (server, scope):
                names |= set(client.tools)
        return names

    async def prepare(self, session_id: str, directory: Path) -> None:
        """At a turn's start: every enabled server running, or failed with an event."""
        async with trio.open_nursery() as nursery:
            for client in self.of(session_id):
                if client.state not in ("running", "disabled"):
                    nursery.start_soon(self._try, client, session_id, directory)

    @staticmethod
    async def _try(client: HubClient, session_id: str, directory: Path) -> None:
        with contextlib.suppress(McpUnavailable):
            await client.ensure(session_id, directory)

    async def refresh(self, session_id: str | None = None) -> None:
        for client in self.of(session_id):
            await client.refresh()

    def tools(self, session_id: str | None = None) -> dict[str, Tool[Any]]:
        tools: dict[str, Tool[Any]] = {}
        for client in self.of(session_id):
            # A configured server started after a client's one may list a name already
            # taken in this session: the first keeps it.
            for name, tool in client.tools.items():
                tools.setdefault(name, tool)
        return tools

    def infos(self, session_id: str | None = None) -> list[McpToolInfo]:
        seen = self.tools(session_id)
        return [
            info
            for c in self.of(session_id)
            for info in c.infos.values()
            if seen.get(info.name) is c.tools.get(info.name)
        ]

    def schema_tokens(self, session_id: str | None = None) -> int:
        return sum(c.schema_tokens for c in self.of(session_id))

    def searching(self, session_id: str | None = None) -> bool:
        """Tool-search mode: the schemas would take more than the threshold."""
        return self.schema_tokens(session_id) > self.search_threshold

    def loaded(self, session_id: str) -> set[str]:
        return self._loaded.setdefault(session_id, set())

    def knows(self, session_id: str) -> bool:
        return session_id in self._loaded

    def default_rules(self, agent: str, session_id: str | None = None) -> list[Rule]:
        """The MCP layer of the defaults (DESIGN §12): a ``readOnlyHint`` tool (and a
        resources tool) is allowed; the ``plan`` agent denies every other MCP tool; the rest
        ask. Rules from config and the session still come after these."""
        rules = [Rule(permission=SEARCH_TOOL, pattern="*", action="allow")]
        for client in self.of(session_id):
            if agent == "plan":
                prefix = tool_name(client.name, "")
                rules.append(Rule(permission=f"{prefix}*", pattern="*", action="deny"))
            for name in client.tools:
                info = client.infos.get(name)
                if info is None or info.read_only:
                    rules.append(Rule(permission=name, pattern="*", action="allow"))
        return rules

    def status(self) -> list[ServerStatus]:
        return [c.status() for c in self.clients.values()]
