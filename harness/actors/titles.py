"""Session titles: derived from the first prompt, or written by a small model when asked.

A run sends no side requests by default, so a new session's title is the first line of
its first prompt; with ``title_model`` set, a model is asked for a better one off the
turn's critical path, and its answer replaces the derived title when it arrives.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from harness.config import Config
from harness.messages.provider import ProviderRequest, TextDelta, UserTurn
from harness.providers import create_provider, split_model
from harness.providers.base import Provider

TITLE_PROMPT = (
    "Write a short title, at most 50 characters, for a coding session that starts with the "
    "user's message below. Use the user's language. Answer with the title only: no quotes, "
    "no punctuation at the end."
)
TITLE_TIMEOUT = 30.0  # seconds: a title is a nicety, never worth a hung task


def derive_title(text: str, limit: int = 50) -> str:
    """The first line of the first prompt, cut on a word boundary to ``limit`` characters."""
    line = " ".join(text.strip().splitlines()[0].split()) if text.strip() else ""
    if len(line) <= limit:
        return line
    cut = line[: limit - 1].rsplit(" ", 1)[0] or line[: limit - 1]
    return cut + "…"


async def model_title(
    config: Config,
    session_id: str,
    prompt: str,
    in_use: Callable[[], Provider | None],
) -> str:
    """The title ``config.title_model`` writes for ``prompt`` ("" when it says nothing).

    Raises ``ProviderError`` or ``trio.TooSlowError``. The client is closed afterwards
    unless it is the one the session's turns use (``in_use``), which a test's provider
    factory may hand out for every model.
    """
    model = config.title_model or ""
    with trio.fail_after(TITLE_TIMEOUT):
        provider = (
            config.provider_factory(model)
            if config.provider_factory is not None
            else create_provider(model, base_url=config.base_url)
        )
        try:
            request = ProviderRequest(
                model=split_model(model)[1],
                system=(TITLE_PROMPT,),
                messages=(UserTurn(prompt[:2000]),),
                tools=(),
                tool_choice="none",
                session_id=session_id,
            )
            pieces: list[str] = []
            async with provider.stream(request) as events:
                async for event in events:
                    if isinstance(event, TextDelta):
                        pieces.append(event.text)
        finally:
            if provider is not in_use():
                await provider.aclose()
    return derive_title(" ".join("".join(pieces).strip().strip('"').split()))
