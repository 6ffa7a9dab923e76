"""Context windows and output limits per model, in tokens.

The figures for Mistral's models are their published limits at the time of writing; a
model missing here gets a conservative default. ``Config.model_limits`` overrides any
entry (``{"mistral/my-finetune": (32000, 4096)}``), which is also how tests make a tiny
window for the scripted model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ModelLimits:
    context: int  # tokens the whole request (system + history + tools) may take
    output: int  # tokens the reply may take

    @property
    def reserve(self) -> int:
        """Room kept free for the reply: a request larger than context − reserve compacts."""
        return min(20_000, self.output)


DEFAULT_LIMITS = ModelLimits(context=32_000, output=4_096)

KNOWN_LIMITS: dict[str, ModelLimits] = {
    "mistral/mistral-large-latest": ModelLimits(128_000, 16_384),
    "mistral/mistral-medium-latest": ModelLimits(128_000, 16_384),
    "mistral/mistral-small-latest": ModelLimits(128_000, 16_384),
    "mistral/devstral-medium-latest": ModelLimits(128_000, 16_384),
    "mistral/devstral-small-latest": ModelLimits(128_000, 16_384),
    "mistral/codestral-latest": ModelLimits(256_000, 16_384),
    "mistral/magistral-medium-latest": ModelLimits(40_000, 16_384),
    "mistral/magistral-small-latest": ModelLimits(40_000, 16_384),
    "mistral/ministral-8b-latest": ModelLimits(128_000, 8_192),
    "mistral/ministral-3b-latest": ModelLimits(128_000, 8_192),
    "mistral/open-mistral-nemo": ModelLimits(128_000, 8_192),
}


def limits_for(model: str, overrides: Mapping[str, tuple[int, int]] | None = None) -> ModelLimits:
    """Limits of a model string; scripted models are keyed by the prefix ``scripted``."""
    key = "scripted" if model.startswith("scripted:") else model
    if overrides:
        for name in (model, key):
            if name in overrides:
                context, output = overrides[name]
                return ModelLimits(context, output)
    return KNOWN_LIMITS.get(model, DEFAULT_LIMITS)
