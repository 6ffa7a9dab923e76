"""What a daemon holds for sessions it is not running (issue 12, item 12).

Each session used to keep its actor, and with it a provider whose HTTP client had loaded
its own copy of the CA bundle (~0.8 MB of OpenSSL memory, invisible to tracemalloc), for
as long as the process lived. Now providers share one TLS context, and an idle session's
actor lets go after ``session_idle_seconds``. ``benchmarks/daemon.py`` has the figure
for 1,000 sessions through a real daemon.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from harness.config import Config
from harness.messages.model import InboxItem
from harness.messages.provider import ProviderRequest, StreamEvent
from harness.providers.openai import OpenAIProvider
from harness.providers.scripted import ScriptedProvider
from harness.runtime import open_harness


def rss_kb() -> int:
    for line in Path(f"/proc/{os.getpid()}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise LookupError("VmRSS")


async def test_http_providers_share_one_tls_context() -> None:
    providers = [OpenAIProvider("m", base_url="http://127.0.0.1:9/v1")]  # the first loads it
    before = rss_kb()
    providers += [OpenAIProvider("m", base_url="http://127.0.0.1:9/v1") for _ in range(50)]
    grown = rss_kb() - before
    try:
        # A context each was ~40 MB for 50; shared, it is the clients' own few kB each.
        assert grown < 10_000, f"50 providers took {grown} kB"
    finally:
        for provider in providers:
            await provider.aclose()


class Closing(ScriptedProvider):
    """A scripted model that says when the session let it go."""

    closed = 0

    async def aclose(self) -> None:
        Closing.closed += 1

    @asynccontextmanager
    async def stream(self, request: ProviderRequest) -> AsyncIterator[AsyncIterator[StreamEvent]]:
        async with super().stream(request) as events:
            yield events


async def test_an_idle_session_lets_its_actor_and_provider_go(
    tmp_path: Path, project: Path
) -> None:
    Closing.closed = 0
    made: list[Closing] = []

    def factory(model: str) -> Closing:
        base = ScriptedProvider.from_turns([{"text": "first"}, {"text": "second"}])
        made.append(Closing(base.turns, record=True))
        return made[-1]

    config = Config(
        home=tmp_path / "home",
        model="scripted:unused",
        provider_factory=factory,
        interactive=False,
        session_idle_seconds=0.2,
    )
    async with open_harness(config) as h:
        session = await h.create_session(project)
        assert (await h.run(session.id, "one")).answer == "first"
        with trio.fail_after(5):
            while Closing.closed == 0:
                await trio.sleep(0.02)
        # Nothing runs, so there is nothing to cancel; the next prompt starts afresh from
        # the ledger and carries on the same conversation.
        assert await h.cancel(session.id) is False
        assert (await h.run(session.id, "two")).answer == "second"
        assert len(made) == 2
        assert [len(p.requests[0].messages) for p in made] == [1, 3]


async def test_an_idle_actor_lets_go_without_reading_an_inbox_it_saw_empty(
    tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The idle check asks the inbox mark first (issue 18): nothing added since the
    inbox was seen empty, no read. A prompt sent after the actor let go still runs."""
    Closing.closed = 0

    def factory(model: str) -> Closing:
        base = ScriptedProvider.from_turns([{"text": "first"}, {"text": "second"}])
        return Closing(base.turns, record=True)

    config = Config(
        home=tmp_path / "home",
        model="scripted:unused",
        provider_factory=factory,
        interactive=False,
        session_idle_seconds=0.2,
    )
    async with open_harness(config) as h:
        session = await h.create_session(project)
        assert (await h.run(session.id, "one")).answer == "first"
        reads: list[str] = []
        inbox = h.ledger.inbox

        def counted(session_id: str) -> list[InboxItem]:
            reads.append(session_id)
            return inbox(session_id)

        monkeypatch.setattr(h.ledger, "inbox", counted)
        with trio.fail_after(5):
            while Closing.closed == 0:
                await trio.sleep(0.02)
        assert reads == []
        assert (await h.run(session.id, "two")).answer == "second"
