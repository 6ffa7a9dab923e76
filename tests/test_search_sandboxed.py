"""grep's ripgrep runs in the session's sandbox, like every subprocess a tool starts."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import trio

from harness import Config, open_harness
from harness.messages.model import ToolCompleted, ToolPart
from harness.providers.scripted import ScriptedProvider

pytestmark = pytest.mark.skipif(
    shutil.which("rg") is None or shutil.which("bwrap") is None, reason="needs rg and bwrap"
)


async def test_grep_through_the_loop_uses_ripgrep_inside_the_sandbox(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "app.py").write_text("def load_config():\n    return 1\n")
    provider = ScriptedProvider.from_turns(
        [
            {"tool_calls": [{"name": "grep", "arguments": {"pattern": r"def \w+_config\("}}]},
            {"text": "found"},
        ]
    )
    config = Config(
        home=tmp_path / "home",
        model=f"scripted:{tmp_path / 'unused.json'}",
        provider_factory=lambda model: provider,
        interactive=False,
        sandbox="workspace-write",
    )
    async with open_harness(config) as h:
        assert h.sandbox.mode == "workspace-write"
        session = await h.create_session(project)
        with trio.fail_after(15):
            result = await h.run(session.id, "find it")
        [part] = [
            p for m in await h.messages(session.id) for p in m.parts if isinstance(p, ToolPart)
        ]
    assert result.reason == "answered"
    assert isinstance(part.state, ToolCompleted)
    assert part.state.metadata.get("engine") == "ripgrep", part.state.metadata
    assert "src/app.py" in part.state.output and "def load_config" in part.state.output
