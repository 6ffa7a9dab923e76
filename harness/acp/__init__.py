"""The Agent Client Protocol (DESIGN §13 "Editors"): ``harness acp`` for Zed, JetBrains,
Neovim and Emacs clients.

- ``jsonrpc``: JSON-RPC 2.0 over a pair of byte streams, newline-delimited, in Trio. It
  owns the envelope (parse errors, invalid requests, unknown methods) and the ids of the
  requests we send the client (``session/request_permission``).
- ``updates``: harness events and stored parts as ACP ``session/update`` payloads.
- ``agent``: the ACP methods on an embedded harness (``open_harness``), and
  ``serve_acp``, the whole agent on stdin/stdout.

The messages are the ``acp.schema`` pydantic models of the PyPI package
``agent-client-protocol``; its runtime (connections, routers) is asyncio-only, so only its
schema module is used, and imported when ``harness acp`` starts, never by ``harness --help``.
"""
