"""``[mcp.NAME]`` of a configuration file: how to reach one MCP server (DESIGN §12).

A stdio server is a ``command`` (a list, never a shell line) with optional ``env`` and
``cwd``; a streamable HTTP server is a ``url`` with optional ``headers``. ``${VAR}`` in
``env`` and ``headers`` values is read from harness's environment when the server starts,
so a file holds the variable's name, never the token.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_STARTUP_TIMEOUT = 30.0  # seconds: npx/uvx servers fetch packages on first start
DEFAULT_CALL_TIMEOUT = 120.0
# Past this many tokens of MCP tool schemas, the model gets a search tool instead of
# every schema (docs/mcp.md, "Tool search"). Claude Code's 67k-token complaints start
# around a dozen servers; 10k is about 40 ordinary tools.
DEFAULT_SEARCH_THRESHOLD = 10_000

_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
SERVER_NAME = r"^[A-Za-z0-9_-]{1,32}$"


class McpServerSpec(BaseModel):
    # Built on first use (defer_build): not needed before a run's first request.
    model_config = ConfigDict(extra="forbid", strict=True, defer_build=True)

    command: list[str] | None = Field(default=None, min_length=1)
    env: dict[str, str] = {}
    cwd: str | None = None
    url: str | None = Field(default=None, pattern=r"^https?://")
    headers: dict[str, str] = {}
    enabled: bool = True
    startup_timeout: float = Field(default=DEFAULT_STARTUP_TIMEOUT, gt=0)
    timeout: float = Field(default=DEFAULT_CALL_TIMEOUT, gt=0)

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerSpec:
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one of command (stdio) or url (streamable HTTP)")
        if self.command is not None and self.headers:
            raise ValueError("headers are for a url server; a command server takes env")
        if self.url is not None and (self.env or self.cwd):
            raise ValueError("env and cwd are for a command server")
        if self.command is not None and not self.command[0]:
            raise ValueError("command[0] is empty")
        return self

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "http"

    def variables(self) -> list[str]:
        """The environment variables its ``env`` and ``headers`` name (credentials)."""
        values = [*self.env.values(), *self.headers.values()]
        return sorted({name for value in values for name in _VARIABLE.findall(value)})


class MissingVariable(ValueError):
    """A ``${VAR}`` names a variable that is not set: the server cannot start."""


def expand(values: Mapping[str, str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``values`` with each ``${VAR}`` replaced by the variable's value."""
    env = os.environ if environ is None else environ

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in env:
            raise MissingVariable(f"${{{name}}} is not set in harness's environment")
        return env[name]

    return {key: _VARIABLE.sub(one, value) for key, value in values.items()}
