"""A harness for tests/test_mcp.py to kill with SIGKILL in the middle of an MCP call.

``python tests/mcp_crash_child.py SETUP_JSON``: opens a harness (scripted model) with the
MCP servers of the setup, prints the session id, prompts, and waits to be killed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import trio

from harness.config import Config
from harness.mcp.spec import McpServerSpec
from harness.messages.model import Rule
from harness.providers.scripted import ScriptedProvider
from harness.runtime import open_harness


async def main(setup: dict[str, object]) -> None:
    provider = ScriptedProvider.from_turns(setup["turns"])  # type: ignore[arg-type]
    servers = {
        name: McpServerSpec.model_validate(spec)
        for name, spec in setup["servers"].items()  # type: ignore[attr-defined]
    }
    config = Config(
        home=Path(str(setup["home"])),
        model="scripted:test",
        provider_factory=lambda model: provider,
        interactive=False,
        mcp_servers=servers,
        rules=[Rule(permission="*", pattern="*", action="allow")],
    )
    async with open_harness(config) as h:
        session = await h.create_session(str(setup["project"]))
        print(session.id, flush=True)
        await h.prompt(session.id, "go")
        await trio.sleep_forever()


if __name__ == "__main__":
    trio.run(main, json.loads(sys.argv[1]))
