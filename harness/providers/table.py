"""The provider table: every kind of model string, in one place.

A model string is a prefix and an argument: ``mistral/devstral-medium-latest``,
``openai/qwen2.5-coder``, ``scripted:<file>``, ``replay:<cassette>``. Each prefix has one
``ProviderKind`` here: how to build its provider, what its argument is, and the limits and
prices known for its models. Adding a provider is adding one entry (and its factory).

Factories are named by ``"module:function"`` and imported only when a session first needs
one: the mistralai SDK alone costs about 0.5 s, and provider modules may read this table
(their default prices) without an import cycle. The same shape can later be filled from a
configuration file (a named provider: a prefix, a factory, a base URL, its prices).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from harness.providers.errors import BadRequestError
from harness.providers.pricing import Price, PriceTable

if TYPE_CHECKING:
    from harness.providers.base import Provider


@dataclass(frozen=True, slots=True)
class ProviderKind:
    """One prefix of a model string and what it takes to serve it."""

    prefix: str  # "mistral/" or "scripted:": what a model string starts with
    factory: str  # "module:function" building the provider (see harness/providers/factories)
    argument: str = "<model>"  # what follows the prefix, as usage messages name it
    path: bool = False  # the argument is a file, resolved against the caller's directory
    http: bool = False  # talks HTTP: ``--record`` can tape it and a cassette replay it
    key_env: str | None = None  # the environment variable holding its API key
    key_required: bool = False  # the provider refuses to start without a key
    # model name → (context, output) tokens, the published limits when last checked.
    limits: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    # Every model of the kind is limited under the kind's name (``model_limits={"scripted":
    # ...}``): a scripted file's path says nothing about a window.
    shared_limits: bool = False
    # model name → USD per million tokens. They change and may be stale: pass your own
    # PriceTable to correct them. Unknown models cost 0.0 ("no price", not "free").
    prices: Mapping[str, Price] = field(default_factory=dict)
    # A named provider of a configuration file: its server and extra request headers.
    base_url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.prefix[:-1]

    @property
    def usage(self) -> str:
        return self.prefix + self.argument

    def build(self) -> Callable[..., Provider]:
        module, _, function = self.factory.partition(":")
        return cast("Callable[..., Provider]", getattr(importlib.import_module(module), function))


_MISTRAL_LIMITS = {
    "mistral-large-latest": (128_000, 16_384),
    "mistral-medium-latest": (128_000, 16_384),
    "mistral-small-latest": (128_000, 16_384),
    "devstral-medium-latest": (128_000, 16_384),
    "devstral-small-latest": (128_000, 16_384),
    "codestral-latest": (256_000, 16_384),
    "magistral-medium-latest": (40_000, 16_384),
    "magistral-small-latest": (40_000, 16_384),
    "ministral-8b-latest": (128_000, 8_192),
    "ministral-3b-latest": (128_000, 8_192),
    "open-mistral-nemo": (128_000, 8_192),
}

# Mistral's list prices as last known here (input/output).
_MISTRAL_PRICES = {
    "mistral-large-latest": Price(0.5, 1.5),
    "mistral-medium-latest": Price(0.4, 2.0),
    "mistral-small-latest": Price(0.1, 0.3),
    "devstral-medium-latest": Price(0.4, 2.0),
    "devstral-small-latest": Price(0.1, 0.3),
    "codestral-latest": Price(0.3, 0.9),
    "magistral-medium-latest": Price(2.0, 5.0),
    "magistral-small-latest": Price(0.5, 1.5),
}

_FACTORIES = "harness.providers.factories"

PROVIDERS: dict[str, ProviderKind] = {
    kind.name: kind
    for kind in (
        ProviderKind(
            "mistral/",
            f"{_FACTORIES}:mistral",
            http=True,
            key_env="MISTRAL_API_KEY",
            key_required=True,
            limits=_MISTRAL_LIMITS,
            prices=_MISTRAL_PRICES,
        ),
        ProviderKind("openai/", f"{_FACTORIES}:openai", http=True, key_env="OPENAI_API_KEY"),
        ProviderKind(
            "scripted:", f"{_FACTORIES}:scripted", "<file>", path=True, shared_limits=True
        ),
        ProviderKind("replay:", f"{_FACTORIES}:replay", "<cassette>", path=True),
    )
}


# The named providers of the harness running in this context (``[providers.NAME]``). A
# context variable, not an entry in PROVIDERS: two harnesses of one process may name
# different providers, and Trio tasks inherit the context their harness was opened in.
_NAMED: ContextVar[Mapping[str, ProviderKind] | None] = ContextVar(
    "harness_named_providers", default=None
)


def kinds() -> Mapping[str, ProviderKind]:
    """The built-in kinds and the named ones of the current harness."""
    named = _NAMED.get()
    return {**PROVIDERS, **named} if named else PROVIDERS


@contextmanager
def named_providers(named: Mapping[str, ProviderKind]) -> Iterator[None]:
    """Serve ``NAME/<model>`` by ``named`` for the tasks started inside the block."""
    token = _NAMED.set(dict(named))
    try:
        yield
    finally:
        _NAMED.reset(token)


def named_kind(
    name: str,
    kind: str,
    *,
    base_url: str | None,
    key_env: str | None,
    headers: Mapping[str, str],
    models: Mapping[str, tuple[int | None, int | None, float, float]],
) -> ProviderKind:
    """A ``[providers.NAME]`` entry as a kind: the built-in ``kind``'s factory under a new
    prefix, with the file's server, key variable, headers, limits and prices."""
    base = PROVIDERS[kind]
    limits = {m: (c, o) for m, (c, o, _, _) in models.items() if c is not None and o is not None}
    prices = {m: Price(i, o) for m, (_, _, i, o) in models.items()}
    return ProviderKind(
        f"{name}/",
        base.factory,
        http=True,
        key_env=key_env,
        key_required=key_env is not None,
        limits=limits,
        prices=prices,
        base_url=base_url,
        headers=dict(headers),
    )


def model_usage() -> str:
    """``mistral/<model>, openai/<model>, scripted:<file> or replay:<cassette>``."""
    usages = [kind.usage for kind in kinds().values()]
    return ", ".join(usages[:-1]) + " or " + usages[-1]


def kind_of(model: str) -> ProviderKind | None:
    """The kind a model string names, or None when no prefix matches (or nothing follows)."""
    for kind in kinds().values():
        if model.startswith(kind.prefix) and (kind.path or model != kind.prefix):
            return kind
    return None


def split_model(model: str) -> tuple[str, str]:
    """``"mistral/devstral-medium-latest"`` → ``("mistral", "devstral-medium-latest")``."""
    kind = kind_of(model)
    if kind is None:
        raise BadRequestError(f"unknown model {model!r}: use {model_usage()}")
    return kind.name, model.removeprefix(kind.prefix)


def resolve_model(model: str) -> str:
    """The model string with a file argument made absolute: a daemon's working directory
    is not its client's. Other strings, unknown ones included, come back as they are."""
    kind = kind_of(model)
    if kind is None or not kind.path:
        return model
    return kind.prefix + str(Path(model.removeprefix(kind.prefix)).expanduser().resolve())


def create_provider(
    model: str, *, base_url: str | None = None, record: Path | None = None
) -> Provider:
    """Build the provider a session's model string names. Raises ProviderError subclasses.

    ``record`` appends every HTTP exchange of a real provider to that cassette file.
    """
    name, argument = split_model(model)
    kind = kinds()[name]
    if not kind.http:
        return kind.build()(argument)
    api_key = os.environ.get(kind.key_env) if kind.key_env else None
    if kind.base_url is not None and kind.key_env and not api_key:
        raise BadRequestError(f"provider {name!r}: the variable {kind.key_env} is not set")
    options: dict[str, Any] = {"headers": kind.headers} if kind.headers else {}
    return kind.build()(
        argument,
        api_key=api_key,
        base_url=base_url or kind.base_url,
        record=record,
        prices=default_prices(name),
        **options,
    )


def http_provider(
    name: str, model: str, *, base_url: str | None, transport: Any, api_key: str | None
) -> Provider:
    """An HTTP provider of kind ``name`` over ``transport``: how a cassette replays."""
    return PROVIDERS[name].build()(
        model,
        api_key=api_key,
        base_url=base_url,
        transport=transport,
        prices=default_prices(name),
    )


def http_kinds() -> tuple[str, ...]:
    """The kinds a cassette may have recorded."""
    return tuple(name for name, kind in PROVIDERS.items() if kind.http)


def default_prices(name: str) -> PriceTable:
    """The prices known for a kind's models."""
    return PriceTable(kinds()[name].prices)


def known_limits() -> dict[str, tuple[int, int]]:
    """Every model with published limits, by its full model string."""
    return {
        kind.prefix + model: limits
        for kind in kinds().values()
        for model, limits in kind.limits.items()
    }


def limits_key(model: str) -> str:
    """The name a model's limits are overridden under: its kind for shared limits."""
    kind = kind_of(model)
    return kind.name if kind is not None and kind.shared_limits else model
