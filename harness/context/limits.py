"""Context windows and output limits per model, in tokens.

The figures are the providers' published limits, kept in the provider table; a model
missing there gets a conservative default. ``Config.model_limits`` overrides any
entry (``{"mistral/my-finetune": (32000, 4096)}``), which is also how tests make a tiny
window for the scripted model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from harness.providers.table import known_limits, limits_key


@dataclass(frozen=True, slots=True)
class ModelLimits:
    context: int  # tokens the whole request (system + history + tools) may take
    output: int  # tokens the reply may take

    @property
    def reserve(self) -> int:
        """Room kept free for the reply: a request larger than context − reserve compacts."""
        return min(20_000, self.output)


DEFAULT_LIMITS = ModelLimits(context=32_000, output=4_096)

# The published limits, from the provider table (harness/providers/table.py).
KNOWN_LIMITS: dict[str, ModelLimits] = {
    model: ModelLimits(*limits) for model, limits in known_limits().items()
}


def limits_for(model: str, overrides: Mapping[str, tuple[int, int]] | None = None) -> ModelLimits:
    """Limits of a model string; a kind whose models share limits (``scripted``) is keyed
    by its name."""
    key = limits_key(model)
    if overrides:
        for name in (model, key):
            if name in overrides:
                context, output = overrides[name]
                return ModelLimits(context, output)
    return KNOWN_LIMITS.get(model, DEFAULT_LIMITS)
