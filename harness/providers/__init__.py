"""Providers: turn a model string into a Provider.

``scripted:<file>``, ``mistral/<model>``, ``openai/<model>`` and ``replay:<cassette>`` (a
session recorded with ``record=``, played back through the recorded provider's own code).
SDK-backed providers and httpx are imported only when asked for: importing the mistralai
SDK alone costs about 0.5 s.
"""

from __future__ import annotations

import os
from pathlib import Path

from harness.providers.base import Provider
from harness.providers.errors import BadRequestError

KNOWN_PREFIXES = ("scripted:", "replay:", "mistral/", "openai/")


def split_model(model: str) -> tuple[str, str]:
    """``"mistral/devstral-medium-latest"`` → ``("mistral", "devstral-medium-latest")``."""
    for kind in ("scripted", "replay"):
        if model.startswith(f"{kind}:"):
            return kind, model.removeprefix(f"{kind}:")
    provider, sep, name = model.partition("/")
    if not sep or not name or provider not in ("mistral", "openai"):
        raise BadRequestError(
            f"unknown model {model!r}: use mistral/<model>, openai/<model>, "
            "scripted:<file> or replay:<cassette>"
        )
    return provider, name


def create_provider(
    model: str, *, base_url: str | None = None, record: Path | None = None
) -> Provider:
    """Build the provider a session's model string names. Raises ProviderError subclasses.

    ``record`` appends every HTTP exchange of a real provider to that cassette file.
    """
    kind, name = split_model(model)
    if kind == "replay":
        from harness.providers.cassette import ReplayProvider

        return ReplayProvider(Path(name).expanduser())
    if kind == "scripted":
        from harness.providers.scripted import ScriptedProvider, ScriptError

        try:
            return ScriptedProvider.from_file(Path(name).expanduser())
        except ScriptError as error:
            raise BadRequestError(str(error)) from error
    transport = None
    if record is not None:
        from harness.providers.cassette import recording_transport

        transport = recording_transport(record, provider=kind, model=name, base_url=base_url)
    if kind == "mistral":
        from harness.providers.mistral import MistralProvider

        return MistralProvider(
            name,
            api_key=os.environ.get("MISTRAL_API_KEY"),
            base_url=base_url,
            transport=transport,
        )
    from harness.providers.openai import OpenAIProvider

    return OpenAIProvider(
        name, api_key=os.environ.get("OPENAI_API_KEY"), base_url=base_url, transport=transport
    )
