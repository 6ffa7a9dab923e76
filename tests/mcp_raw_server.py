"""An MCP server speaking JSON-RPC by hand, for what the SDK's own server refuses to send.

It lists, beside a good tool, one whose input schema has ``"type": "string"`` (which the
SDK's client rejects with the whole listing) and one whose array has no ``items`` (which
OpenAI rejects with the whole request). ``python tests/mcp_raw_server.py [--noisy]``;
``--noisy`` writes a line that is not JSON to stdout first, as servers that log there do.
"""

from __future__ import annotations

import json
import sys

TOOLS = [
    {
        "name": "good",
        "description": "Doubles x.",
        "inputSchema": {"type": "object", "properties": {"x": {"type": "integer"}}},
    },
    {"name": "stringly", "description": "Not an object.", "inputSchema": {"type": "string"}},
    {
        "name": "itemless",
        "description": "An array without items.",
        "inputSchema": {"type": "object", "properties": {"xs": {"type": "array"}}},
    },
]


def answer(request: dict[str, object]) -> dict[str, object] | None:
    method = request.get("method")
    params = request.get("params") or {}
    assert isinstance(params, dict)
    if "id" not in request:
        return None  # a notification
    if method == "initialize":
        result: dict[str, object] = {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "raw", "version": "1"},
        }
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif method == "tools/call":
        x = int((params.get("arguments") or {}).get("x", 0))  # type: ignore[union-attr]
        result = {"content": [{"type": "text", "text": str(2 * x)}], "isError": False}
    elif method == "ping":
        result = {}
    else:
        return {"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32601, "message": "no"}}
    return {"jsonrpc": "2.0", "id": request["id"], "result": result}


def main() -> None:
    if "--noisy" in sys.argv:  # what a server that logs to stdout does
        print("Server starting... (not JSON)", flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        reply = answer(json.loads(line))
        if reply is not None:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
