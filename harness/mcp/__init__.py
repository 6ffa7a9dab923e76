"""MCP servers (DESIGN §12): what harness knows of them without importing the SDK.

``spec`` is the ``[mcp.NAME]`` table, ``naming`` the tool names the model sees, ``schemas``
the check a tool's input schema must pass and the tokens it costs, ``results`` a call's
result as the text the model reads, ``stdio`` the transport that runs a server in its own
process group. The ``mcp`` SDK itself is imported only by ``stdio``, ``results`` and the
client actor (harness/actors/mcp_client.py), so a harness with no server configured never
loads it.
"""
