"""Providers: turn a model string into a Provider.

``scripted:<file>``, ``mistral/<model>`` and ``openai/<model>``. SDK-backed providers are
imported only when asked for: importing the mistralai SDK alone costs about 0.5 s.
"""

from __future__ import annotations

import os
from pathlib import Path

from harness.providers.base import Provider
from harness.providers.errors import BadRequestError

KNOWN_PREFIXES = ("scripted:", "mistral/", "openai/")


def split_model(model: str) -> tuple[str, str]:
    """``"mistral/devstral-medium-latest"`` → ``("mistral", "devstral-medium-latest")``."""
    if model.startswith("scripted:"):
        return "scripted", model.removeprefix("scripted:")
    provider, sep, name = model.partition("/")
    if not sep or not name or provider not in ("mistral", "openai"):
        raise BadRequestError(
            f"unknown model {model!r}: use mistral/<model>, openai/<model> or scripted:<file>"
        )
    return provider, name


def create_provider(model: str, *, base_url: str | None = None) -> Provider:
    """Build the provider a session's model string names. Raises ProviderError subclasses."""
    kind, name = split_model(model)
    if kind == "scripted":
        from harness.providers.scripted import ScriptedProvider, ScriptError

        try:
            return ScriptedProvider.from_file(Path(name).expanduser())
        except ScriptError as error:
            raise BadRequestError(str(error)) from error
    if kind == "mistral":
        from harness.providers.mistral import MistralProvider

        return MistralProvider(name, api_key=os.environ.get("MISTRAL_API_KEY"), base_url=base_url)
    from harness.providers.openai import OpenAIProvider

    return OpenAIProvider(name, api_key=os.environ.get("OPENAI_API_KEY"), base_url=base_url)
