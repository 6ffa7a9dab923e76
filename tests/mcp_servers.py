"""MCP servers written with the SDK (``MCPServer``), one per fault a client must survive.

Run as ``python tests/mcp_servers.py KIND [ARG]`` (stdio). Kinds:

- ``basic``: echo (readOnlyHint), note (writes a file: not read-only), slow (sleeps,
  idempotentHint), image, structured, resource, fail (isError), huge (a 300 KB result),
  crash (the process exits during the call), pid; a resource and a prompt.
- ``bad_schema``: lists one tool whose input schema a provider would reject.
- ``list_changed``: ``grow`` adds a read-only tool and sends ``tools/list_changed``.
- ``stubborn``: ignores SIGTERM and a closed stdin, and forks a child that does too.
- ``slow_start ARG``: sleeps ARG seconds before it answers anything.
- ``broken``: writes to stderr and exits 3 at once.
"""

from __future__ import annotations

import base64
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import (
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    TextContent,
    TextResourceContents,
    Tool,
    ToolAnnotations,
)

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 60).decode()
READ_ONLY = ToolAnnotations(read_only_hint=True)


def _mark(path: str, line: str) -> None:
    with open(path, "a") as handle:
        handle.write(line + "\n")


def basic() -> MCPServer:
    server = MCPServer("basic")

    @server.tool(annotations=READ_ONLY)
    def echo(text: str) -> str:
        """Say the text back."""
        return f"echo: {text}"

    @server.tool()
    def note(path: str, text: str) -> str:
        """Write text to a file."""
        Path(path).write_text(text)
        return f"wrote {len(text)} characters"

    @server.tool(annotations=ToolAnnotations(idempotent_hint=True))
    async def slow(seconds: float, marker: str = "") -> str:
        """Sleep, then answer (records each start, and a cancel, in the marker file)."""
        if marker:
            _mark(marker, "started")
        try:
            await anyio.sleep(seconds)
        except anyio.get_cancelled_exc_class():
            if marker:
                _mark(marker, "cancelled")
            raise
        return f"slept {seconds}"

    @server.tool()
    async def slow_write(seconds: float, marker: str) -> str:
        """Like slow, but not idempotent: a restart must not run it again."""
        _mark(marker, "started")
        await anyio.sleep(seconds)
        return "done"

    @server.tool()
    def image() -> list[Any]:
        """A tiny image with a caption."""
        return [TextContent(text="a tiny image"), ImageContent(data=PNG, mime_type="image/png")]

    @server.tool()
    def resource() -> list[Any]:
        """An embedded resource."""
        contents = TextResourceContents(uri="memo://one", mime_type="text/plain", text="memo text")
        return [EmbeddedResource(resource=contents)]

    @server.tool()
    def structured(city: str) -> dict[str, Any]:
        """Weather as structured content."""
        return {"city": city, "temperature": 21}

    @server.tool()
    def fail(why: str) -> CallToolResult:
        """Answer with isError."""
        return CallToolResult(content=[TextContent(text=f"it failed: {why}")], is_error=True)

    @server.tool()
    def huge() -> str:
        """A result far over the truncation limit."""
        return "".join(f"line {i} " + "x" * 60 + "\n" for i in range(5000))

    @server.tool()
    def crash() -> str:
        """The process dies during the call."""
        os._exit(7)

    @server.tool(annotations=READ_ONLY)
    def pid() -> str:
        """The server's process id."""
        return str(os.getpid())

    @server.resource("memo://one", mime_type="text/plain")
    def memo() -> str:
        return "memo text"

    @server.prompt()
    def review(code: str) -> str:
        """Review some code."""
        return f"Review this: {code}"

    return server


class BadSchemaServer(MCPServer):
    async def list_tools(self) -> list[Tool]:  # type: ignore[override]
        tools = await super().list_tools()
        bad = Tool(name="bad", description="no items", input_schema={
            "type": "object", "properties": {"xs": {"type": "array"}}})
        return [*tools, bad]


def bad_schema() -> MCPServer:
    server = BadSchemaServer("bad-schema")

    @server.tool(annotations=READ_ONLY)
    def good(x: int) -> str:
        """A fine tool."""
        return str(x * 2)

    return server


def list_changed() -> MCPServer:
    server = MCPServer("changing")

    @server.tool()
    async def grow(ctx: Context) -> str:
        """Add the tool 'extra' and tell the client."""

        def extra() -> str:
            """The tool that appeared."""
            return "extra here"

        server.add_tool(extra, annotations=READ_ONLY)
        await ctx.session.send_tool_list_changed()
        return "grown"

    return server


def stubborn() -> MCPServer:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.fork() == 0:  # a child in the same group, just as deaf
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(1)
    server = MCPServer("stubborn")

    @server.tool(annotations=READ_ONLY)
    def pid() -> str:
        """The server's process id."""
        return str(os.getpid())

    @server.tool()
    async def hang() -> str:
        """Never answers."""
        await anyio.sleep(3600)
        return "never"

    return server


def main() -> None:
    # ``--marker=...`` only makes the command line findable in /proc by the tests.
    args = [a for a in sys.argv[1:] if not a.startswith("--marker=")]
    kind = args[0]
    if kind == "broken":
        print("broken server: missing configuration FOO", file=sys.stderr)
        sys.exit(3)
    if kind == "slow_start":
        time.sleep(float(args[1]))
        kind = "basic"
    servers = {"basic": basic, "bad_schema": bad_schema, "list_changed": list_changed}
    servers["stubborn"] = stubborn
    server = servers[kind]()
    server.run("stdio")
    if kind == "stubborn":
        while True:  # stdin closed: stay anyway
            time.sleep(1)


if __name__ == "__main__":
    main()
