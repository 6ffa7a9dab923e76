"""The tools an MCP server brings (DESIGN §12), and the two harness adds for them.

- ``NAME_tool``: one per tool a server lists. Its schema is the server's, its arguments
  go to the server unchanged (the server validates them), its permission is its own name.
- ``NAME_resources``: lists and reads the server's resources, for a server that has any.
- ``mcp_search``: in tool-search mode (the servers' schemas would take more tokens than
  ``mcp_search_threshold``), finds MCP tools by words and loads the schemas of those it
  finds, so the next step offers them.

Nothing here talks to a server: the tools hold a ``McpServerHandle`` (the client actor,
harness/actors/mcp_client.py), so the tools layer stays free of actors and of the SDK.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from pydantic import ConfigDict, Field

from harness.tools.base import PermissionNeed, Tool, ToolContext, ToolOutput, ToolParams

SEARCH_TOOL = "mcp_search"
MAX_SHOWN = 300  # characters of a call's arguments shown when permission is asked


class McpServerHandle(Protocol):
    """What a server's tools ask of its client."""

    name: str

    async def call_tool(
        self, tool: str, arguments: dict[str, Any], ctx: ToolContext
    ) -> ToolOutput: ...

    async def resources(self, uri: str | None, ctx: ToolContext) -> ToolOutput: ...


class McpArguments(ToolParams):
    """Whatever the model sent: the server's schema is the one that counts."""

    model_config = ConfigDict(extra="allow")

    def arguments(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


@dataclass(frozen=True, slots=True)
class McpToolInfo:
    """A server's tool as listed, with what harness derived from it."""

    server: str
    remote: str  # the tool's name on the server
    name: str  # the name the model sees (harness/mcp/naming.py)
    description: str
    schema: dict[str, Any]
    read_only: bool  # annotated readOnlyHint
    idempotent: bool  # annotated idempotentHint: may be re-run after a crash
    tokens: int  # what its spec costs per request


class McpTool(Tool[McpArguments]):
    """A tool of an MCP server; made per listed tool by ``mcp_tool``."""

    params = McpArguments
    info: ClassVar[McpToolInfo]
    handle: ClassVar[McpServerHandle]

    def permissions(self, args: McpArguments, ctx: ToolContext) -> list[PermissionNeed]:
        # By the full name, like every tool: a rule or "always" for ``github_create_issue``
        # covers exactly that tool (OpenCode #6892: MCP calls that no rule could reach).
        # The pattern is the arguments, so whoever is asked sees what the call would do;
        # "always" approves the tool whatever its arguments.
        shown = json.dumps(args.arguments(), separators=(",", ":"), ensure_ascii=False)
        if len(shown) > MAX_SHOWN:
            shown = shown[: MAX_SHOWN - 1] + "…"
        metadata = {"server": self.info.server, "tool": self.info.remote}
        return [PermissionNeed(self.name, shown, "*", metadata)]

    def title(self, args: McpArguments) -> str:
        return f"{self.info.server}: {self.info.remote}"

    def running_metadata(self, args: McpArguments) -> dict[str, Any]:
        return {"mcp": {"server": self.info.server, "idempotent": self.info.idempotent}}

    async def execute(self, args: McpArguments, ctx: ToolContext) -> ToolOutput:
        return await self.handle.call_tool(self.info.remote, args.arguments(), ctx)


def mcp_tool(info: McpToolInfo, handle: McpServerHandle) -> McpTool:
    """The tool the model calls as ``info.name`` (a class per tool: names are class-level)."""
    cls = type(
        f"McpTool_{info.name}",
        (McpTool,),
        {"name": info.name, "description": info.description, "info": info, "handle": handle},
    )
    tool: McpTool = cls()
    return tool


class ResourcesParams(ToolParams):
    uri: str | None = Field(
        default=None, description="The resource to read; leave out to list the resources."
    )


class McpResourcesTool(Tool[ResourcesParams]):
    """``NAME_resources``: list or read one server's resources (read-only)."""

    params = ResourcesParams
    server: ClassVar[str]
    handle: ClassVar[McpServerHandle]

    def permissions(self, args: ResourcesParams, ctx: ToolContext) -> list[PermissionNeed]:
        return [PermissionNeed(self.name, args.uri or "*", args.uri or "*")]

    def title(self, args: ResourcesParams) -> str:
        return f"{self.server}: {args.uri or 'resources'}"

    async def execute(self, args: ResourcesParams, ctx: ToolContext) -> ToolOutput:
        return await self.handle.resources(args.uri, ctx)


def resources_tool(name: str, handle: McpServerHandle) -> McpResourcesTool:
    description = (
        f"List the resources of the MCP server '{handle.name}' (no arguments), or read one "
        "by its uri."
    )
    cls = type(
        f"McpResources_{name}",
        (McpResourcesTool,),
        {"name": name, "description": description, "server": handle.name, "handle": handle},
    )
    tool: McpResourcesTool = cls()
    return tool


class SearchParams(ToolParams):
    query: str = Field(
        description="Words to look for in MCP tools' names and descriptions, or 'select:NAME' "
        "(comma-separated names) to load those tools."
    )
    limit: int = Field(default=5, ge=1, le=20, description="At most this many tools.")


class McpCatalog(Protocol):
    """The MCP tools of one session, and which of them it has loaded (tool-search mode)."""

    def mcp_tools(self) -> Sequence[McpToolInfo]: ...

    def load(self, names: Sequence[str]) -> None: ...


def search(tools: Sequence[McpToolInfo], query: str, limit: int) -> list[McpToolInfo]:
    """The tools that match ``query`` best: every word counts, a word in the name twice."""
    if query.startswith("select:"):
        wanted = [w.strip() for w in query[len("select:") :].split(",") if w.strip()]
        by_name = {t.name: t for t in tools}
        return [by_name[w] for w in wanted if w in by_name][:limit]
    words = [w for w in re.split(r"[^a-z0-9]+", query.lower()) if w]
    scored: list[tuple[int, str, McpToolInfo]] = []
    for tool in tools:
        name = tool.name.lower()
        text = tool.description.lower()
        score = sum(2 * (w in name) + (w in text) for w in words)
        if score:
            scored.append((-score, tool.name, tool))
    return [tool for _, _, tool in sorted(scored, key=lambda s: (s[0], s[1]))[:limit]]


class McpSearchTool(Tool[SearchParams]):
    name = SEARCH_TOOL
    description = (
        "Find tools of the connected MCP servers (their schemas are not loaded up front, to "
        "save context). Returns the matching tools with their parameters; they can be "
        "called from the next step on."
    )
    params = SearchParams
    read_only = True

    def __init__(self, catalog: McpCatalog) -> None:
        self._catalog = catalog

    def permissions(self, args: SearchParams, ctx: ToolContext) -> list[PermissionNeed]:
        return [PermissionNeed(SEARCH_TOOL, "*", "*")]

    def title(self, args: SearchParams) -> str:
        return f"search MCP tools: {args.query}"

    async def execute(self, args: SearchParams, ctx: ToolContext) -> ToolOutput:
        found = search(self._catalog.mcp_tools(), args.query, args.limit)
        if not found:
            names = ", ".join(sorted(t.name for t in self._catalog.mcp_tools())) or "none"
            return ToolOutput(f"no MCP tool matches {args.query!r}; the MCP tools are: {names}")
        self._catalog.load([t.name for t in found])
        blocks = [
            f"{t.name}: {t.description}\nparameters: {json.dumps(t.schema, separators=(',', ':'))}"
            for t in found
        ]
        return ToolOutput(
            "Loaded; call them from the next step on:\n\n" + "\n\n".join(blocks),
            metadata={"loaded": [t.name for t in found]},
        )

