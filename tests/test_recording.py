"""Recording a reply (harness/actors/recording.py): what was streamed stays in the record."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from harness import Config, open_harness
from harness.messages.events import TurnResult
from harness.messages.model import AssistantMessage, TextPart
from harness.messages.provider import Finish, ProviderRequest, StreamEvent, TextDelta

ANSWER = "the whole answer, streamed before the cancel"


class StallsAfterFinish:
    """Streams a reply up to its Finish, then holds the stream open: a slow end of stream."""

    name = "stall"

    def __init__(self) -> None:
        self.finished = trio.Event()

    @asynccontextmanager
    async def stream(self, request: ProviderRequest) -> AsyncIterator[AsyncIterator[StreamEvent]]:
        yield self._events()

    async def _events(self) -> AsyncIterator[StreamEvent]:
        yield TextDelta(ANSWER)
        yield Finish("stop")
        self.finished.set()  # the runner asked for more: it has the Finish
        await trio.sleep_forever()

    async def aclose(self) -> None:
        return None


async def test_a_cancel_after_the_finish_keeps_the_streamed_text(
    tmp_path: Path, project: Path
) -> None:
    provider = StallsAfterFinish()
    config = Config(
        home=tmp_path / "home",
        model="scripted:stall",
        provider_factory=lambda model: provider,
        interactive=False,
    )
    results: list[TurnResult] = []
    async with open_harness(config) as h:
        session = await h.create_session(project)

        async def run() -> None:
            results.append(await h.run(session.id, "answer"))

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run)
                await provider.finished.wait()
                assert await h.cancel(session.id)
        transcript = h.ledger.messages(session.id)
    assert [r.reason for r in results] == ["cancelled"]
    [step] = [m for m in transcript if isinstance(m.info, AssistantMessage)]
    [text] = [p for p in step.parts if isinstance(p, TextPart)]
    assert text.text == ANSWER
    assert text.end is not None
