"""A cancel that comes while a claimed turn is still being built (its system prompt,
skills, MCP servers) cancels it once it runs: it was answered "no turn" and lost, though
the turn was durable. Through another daemon of a shared ledger, that lost a durable
``cancel.requested`` (issue 18, tests/test_cluster.py's deletion through another daemon).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import ScriptedHarness

from harness.actors.turn_builder import TurnBuilder


async def test_a_cancel_while_the_turn_is_built_cancels_it(
    scripted_harness: ScriptedHarness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    building, go_on = trio.Event(), trio.Event()
    turn = TurnBuilder.turn

    async def slow_turn(self: TurnBuilder, *args: Any, **kwargs: Any) -> Any:
        building.set()
        await go_on.wait()
        return await turn(self, *args, **kwargs)

    monkeypatch.setattr(TurnBuilder, "turn", slow_turn)
    async with scripted_harness([{"text": "never said"}]) as (h, provider):
        session = await h.create_session(tmp_path)
        async with h.subscribe(session.id) as events:
            await h.prompt(session.id, "go")
            with trio.fail_after(10):
                await building.wait()
            assert await h.cancel(session.id) is True
            go_on.set()
            with trio.fail_after(10):
                async for event in events:
                    if event.type == "turn.finished":
                        assert event.data["reason"] == "cancelled", event.data
                        break
        assert provider.requests == []  # the model was never asked
