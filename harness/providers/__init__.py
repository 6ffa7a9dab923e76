"""Providers: turn a model string into a Provider.

The kinds of model string (``mistral/<model>``, ``openai/<model>``, ``scripted:<file>``,
``replay:<cassette>``: a session recorded with ``record=``, played back through the
recorded provider's own code) are listed once, in ``harness.providers.table``.
SDK-backed providers and httpx are imported only when asked for: importing the mistralai
SDK alone costs about 0.5 s.
"""

from __future__ import annotations

from harness.providers.table import PROVIDERS, create_provider, resolve_model, split_model

__all__ = ["PROVIDERS", "create_provider", "resolve_model", "split_model"]
