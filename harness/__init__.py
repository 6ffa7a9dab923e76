"""harness: a coding-agent runtime as a tree of Trio actors over a SQLite ledger.

Embedding::

    async with harness.open_harness(harness.Config(home=...)) as h:
        session = await h.create_session(directory=".")
        result = await h.run(session.id, "read pyproject.toml and name the project")

Names are imported on first use, so ``harness --help`` does not pay for Trio, pydantic
and apsw.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.config import Config
    from harness.messages.events import TurnResult
    from harness.runtime import Harness, HarnessError, open_harness

__all__ = ["Config", "Harness", "HarnessError", "TurnResult", "open_harness"]

_WHERE = {
    "Config": "harness.config",
    "Harness": "harness.runtime",
    "HarnessError": "harness.runtime",
    "open_harness": "harness.runtime",
    "TurnResult": "harness.messages.events",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
