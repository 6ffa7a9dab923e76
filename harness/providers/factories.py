"""The factories the provider table names, one per kind.

Each imports its provider only when called: ``harness --help`` and a scripted run never
load httpx or the mistralai SDK.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.providers.base import Provider
from harness.providers.errors import BadRequestError


def mistral(model: str, *, record: Path | None = None, **options: Any) -> Provider:
    from harness.providers.mistral import MistralProvider

    return MistralProvider(model, **_taped("mistral", model, record, options))


def openai(model: str, *, record: Path | None = None, **options: Any) -> Provider:
    from harness.providers.openai import OpenAIProvider

    return OpenAIProvider(model, **_taped("openai", model, record, options))


def _taped(kind: str, model: str, record: Path | None, options: dict[str, Any]) -> dict[str, Any]:
    """The options, with a transport that appends every exchange to ``record``."""
    if record is None:
        return options
    from harness.providers.cassette import recording_transport

    base_url = options.get("base_url")
    transport = recording_transport(record, provider=kind, model=model, base_url=base_url)
    return {**options, "transport": transport}


def scripted(path: str) -> Provider:
    from harness.providers.scripted import ScriptedProvider, ScriptError

    try:
        return ScriptedProvider.from_file(Path(path).expanduser())
    except ScriptError as error:
        raise BadRequestError(str(error)) from error


def replay(path: str) -> Provider:
    from harness.providers.cassette import ReplayProvider

    return ReplayProvider(Path(path).expanduser())
