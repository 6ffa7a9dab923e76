"""harness: a coding-agent runtime as a tree of Trio actors over a SQLite ledger.

Embedding::

    async with harness.open_harness(harness.Config(home=...)) as h:
        session = await h.create_session(directory=".")
        result = await h.run(session.id, "read pyproject.toml and name the project")

Reading a ledger without starting anything (what the CLI does when no daemon answers)::

    reader = harness.open_reader(harness.Config(home=...))
    for session in reader.sessions(): ...

This module is the public API: the command line (``harness.cli``, ``harness.commands``)
uses nothing else of ours but the daemon client (``harness.client``). Names are imported
on first use, so ``harness --help`` does not pay for Trio, pydantic and apsw.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.acp.agent import SessionFlags, serve_acp
    from harness.actors.mcp_client import probe as probe_mcp_servers
    from harness.actors.permission import no_terminal_hint
    from harness.agent_files import agent_sources, global_catalog, project_catalog
    from harness.agents import UnknownAgentError
    from harness.config import (
        Config,
        ConfigError,
        SocketPathError,
        default_home,
        usable_socket_path,
    )
    from harness.config_files import (
        ConfigFileError,
        config_from_files,
        config_overrides,
        daemon_cannot_apply,
        load_settings,
        read_project,
    )
    from harness.context.system import prefetch_environment
    from harness.frontmatter import use_store as use_front_matter_store
    from harness.lean_imports import install as install_lean_imports
    from harness.logs import configure_logging
    from harness.messages.events import Event, EventLike, TurnResult, with_queued
    from harness.messages.ids import message_id as new_message_id
    from harness.messages.model import Rule
    from harness.messages.question import NO_TERMINAL
    from harness.permissions.ruleset import parse_rule_flag
    from harness.private import open_private, private_dir
    from harness.providers import resolve_model
    from harness.providers.errors import ProviderError
    from harness.reader import NoLedgerError, Reader, open_reader
    from harness.runtime import Harness, HarnessError, open_harness
    from harness.secrets import RedactingStream, has_secrets, redact
    from harness.server import DaemonRunning, serve
    from harness.skills import discover as discover_skills
    from harness.snapshots import RevertConflict, RevertResult, SessionBusy, SnapshotError
    from harness.storage.backend import open_ledger
    from harness.storage.ledger import LedgerError
    from harness.terminal_text import printable, printable_data
    from harness.tools.base import ToolContext
    from harness.tools.python_tool import ToolDefinitionError, tool
    from harness.tools.sandbox import start_probe as start_sandbox_probe
    from harness.trace import render_trace

__all__ = [
    "NO_TERMINAL",
    "Config",
    "ConfigError",
    "ConfigFileError",
    "DaemonRunning",
    "Event",
    "EventLike",
    "Harness",
    "HarnessError",
    "LedgerError",
    "NoLedgerError",
    "ProviderError",
    "Reader",
    "RedactingStream",
    "RevertConflict",
    "RevertResult",
    "Rule",
    "SessionBusy",
    "SessionFlags",
    "SnapshotError",
    "SocketPathError",
    "ToolContext",
    "ToolDefinitionError",
    "TurnResult",
    "UnknownAgentError",
    "agent_sources",
    "config_from_files",
    "config_overrides",
    "configure_logging",
    "daemon_cannot_apply",
    "default_home",
    "discover_skills",
    "global_catalog",
    "has_secrets",
    "install_lean_imports",
    "load_settings",
    "new_message_id",
    "no_terminal_hint",
    "open_harness",
    "open_ledger",
    "open_private",
    "open_reader",
    "parse_rule_flag",
    "prefetch_environment",
    "printable",
    "printable_data",
    "private_dir",
    "probe_mcp_servers",
    "project_catalog",
    "read_project",
    "redact",
    "render_trace",
    "resolve_model",
    "serve",
    "serve_acp",
    "start_sandbox_probe",
    "tool",
    "usable_socket_path",
    "use_front_matter_store",
    "with_queued",
]

# name → (module, attribute there)
_WHERE = {
    "Config": ("harness.config", "Config"),
    "ConfigError": ("harness.config", "ConfigError"),
    "ConfigFileError": ("harness.config_files", "ConfigFileError"),
    "config_overrides": ("harness.config_files", "config_overrides"),
    "load_settings": ("harness.config_files", "load_settings"),
    "config_from_files": ("harness.config_files", "config_from_files"),
    "read_project": ("harness.config_files", "read_project"),
    "daemon_cannot_apply": ("harness.config_files", "daemon_cannot_apply"),
    "global_catalog": ("harness.agent_files", "global_catalog"),
    "agent_sources": ("harness.agent_files", "agent_sources"),
    "discover_skills": ("harness.skills", "discover"),
    "with_queued": ("harness.messages.events", "with_queued"),
    "EventLike": ("harness.messages.events", "EventLike"),
    "project_catalog": ("harness.agent_files", "project_catalog"),
    "use_front_matter_store": ("harness.frontmatter", "use_store"),
    "SocketPathError": ("harness.config", "SocketPathError"),
    "default_home": ("harness.config", "default_home"),
    "usable_socket_path": ("harness.config", "usable_socket_path"),
    "Harness": ("harness.runtime", "Harness"),
    "HarnessError": ("harness.runtime", "HarnessError"),
    "open_harness": ("harness.runtime", "open_harness"),
    "Event": ("harness.messages.events", "Event"),
    "TurnResult": ("harness.messages.events", "TurnResult"),
    "Rule": ("harness.messages.model", "Rule"),
    "new_message_id": ("harness.messages.ids", "message_id"),
    "NO_TERMINAL": ("harness.messages.question", "NO_TERMINAL"),
    "no_terminal_hint": ("harness.actors.permission", "no_terminal_hint"),
    "parse_rule_flag": ("harness.permissions.ruleset", "parse_rule_flag"),
    "UnknownAgentError": ("harness.agents", "UnknownAgentError"),
    "ProviderError": ("harness.providers.errors", "ProviderError"),
    "resolve_model": ("harness.providers", "resolve_model"),
    "NoLedgerError": ("harness.reader", "NoLedgerError"),
    "Reader": ("harness.reader", "Reader"),
    "open_reader": ("harness.reader", "open_reader"),
    "open_ledger": ("harness.storage.backend", "open_ledger"),
    "LedgerError": ("harness.storage.ledger", "LedgerError"),
    "RevertConflict": ("harness.snapshots", "RevertConflict"),
    "RevertResult": ("harness.snapshots", "RevertResult"),
    "SessionBusy": ("harness.snapshots", "SessionBusy"),
    "SnapshotError": ("harness.snapshots", "SnapshotError"),
    "DaemonRunning": ("harness.server", "DaemonRunning"),
    "serve": ("harness.server", "serve"),
    "serve_acp": ("harness.acp.agent", "serve_acp"),
    "SessionFlags": ("harness.acp.agent", "SessionFlags"),
    "configure_logging": ("harness.logs", "configure_logging"),
    # What the CLI's processes leave out of their libraries' imports (issue 14).
    "install_lean_imports": ("harness.lean_imports", "install"),
    "start_sandbox_probe": ("harness.tools.sandbox", "start_probe"),
    "prefetch_environment": ("harness.context.system", "prefetch_environment"),
    "open_private": ("harness.private", "open_private"),
    "private_dir": ("harness.private", "private_dir"),
    "probe_mcp_servers": ("harness.actors.mcp_client", "probe"),
    "RedactingStream": ("harness.secrets", "RedactingStream"),
    "has_secrets": ("harness.secrets", "has_secrets"),
    "redact": ("harness.secrets", "redact"),
    "render_trace": ("harness.trace", "render_trace"),
    # Model, tool and file text made safe for a terminal (the CLI prints it through these).
    "printable": ("harness.terminal_text", "printable"),
    "printable_data": ("harness.terminal_text", "printable_data"),
    # Python tools (DESIGN §12): ``@harness.tool`` and the context a tool may ask for.
    "tool": ("harness.tools.python_tool", "tool"),
    "ToolContext": ("harness.tools.base", "ToolContext"),
    "ToolDefinitionError": ("harness.tools.python_tool", "ToolDefinitionError"),
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    import importlib

    module, attribute = where
    return getattr(importlib.import_module(module), attribute)
