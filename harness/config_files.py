"""Configuration files (DESIGN §11): the global and the project ``config.toml``.

Precedence, lowest first: defaults < global file < project file < ``HARNESS_*`` < flags and
API fields. Each file is checked by a pydantic model with ``extra="forbid"``: an unknown key
or a wrong type is one line naming the file and the dotted key (``ConfigFileError``), never
silently ignored. Every merged value keeps its source, for ``harness config``.

Permission rules are not merged as a table: each file's rules keep their file order and the
project's come after the global's, so the last matching rule wins across both.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.config import DEFAULT_MODEL, Config, ConfigError
from harness.mcp.spec import SERVER_NAME, McpServerSpec
from harness.messages.model import Rule
from harness.project import project_chain

Action = Literal["allow", "ask", "deny"]


class ConfigFileError(ConfigError):
    """A configuration file cannot be used: names the file and the key (CLI exit 1)."""


class _Strict(BaseModel):
    # Built when a file is read: most runs have no configuration file at all.
    model_config = ConfigDict(extra="forbid", strict=True, defer_build=True)


class ModelSpec(_Strict):
    context: int | None = Field(default=None, gt=0)
    output: int | None = Field(default=None, gt=0)
    input_price: float = Field(default=0.0, ge=0)
    output_price: float = Field(default=0.0, ge=0)


class ProviderSpec(_Strict):
    """``[providers.NAME]``: model strings ``NAME/<model>`` served by a kind of API."""

    # Required, except in ``[providers.openai]`` / ``[providers.mistral]``, which hold the
    # built-in providers' limits only (read_file checks).
    kind: Literal["openai", "mistral"] | None = None
    base_url: str | None = None
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    headers: dict[str, str] = {}
    models: dict[str, ModelSpec] = {}
    # One limiter per provider, shared by every session (harness/providers/limiter.py).
    max_concurrent: int | None = Field(default=None, ge=1)
    requests_per_minute: int | None = Field(default=None, ge=1)


class Budget(_Strict):
    tokens: int | None = Field(default=None, gt=0)
    cost: float | None = Field(default=None, gt=0)
    time: float | None = Field(default=None, gt=0)


_TOOL_ENTRY = r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_.]*$"


# --- custom agents (issue 15, item 4; harness/agent_files.py reads them) -------------------


class AgentFields(_Strict):
    """An agent file's front matter (the body is its prompt); every field optional, so a
    file or table may change one field of an agent defined below it."""

    description: str | None = None
    mode: Literal["primary", "subagent", "all"] | None = None
    model: str | None = Field(default=None, min_length=1)
    steps: int | None = Field(default=None, ge=1)
    permission: dict[str, Action | dict[str, Action]] | None = None
    tools: dict[str, bool] | None = None


class AgentSpec(AgentFields):
    """``[agents.NAME]``: the fields of a file, and the prompt its body would hold."""

    prompt: str | None = None


# ---------------------------------------------------------------------------------------


class ConfigFile(_Strict):
    model: str | None = None
    agent: str | None = None
    max_steps: int | None = Field(default=None, ge=1)
    sandbox: Literal["read-only", "workspace-write", "off"] | None = None
    budget: Budget | None = None
    providers: dict[str, ProviderSpec] = {}
    permission: dict[str, Action | dict[str, Action]] = {}
    # Python tools (DESIGN §12): "package.module:function", imported at start-up.
    tools: list[Annotated[str, Field(pattern=_TOOL_ENTRY)]] | None = None
    # MCP servers (DESIGN §12, docs/mcp.md)
    mcp: dict[str, McpServerSpec] = {}
    mcp_search_threshold: int | None = Field(default=None, ge=0)
    agents: dict[str, AgentSpec] = {}
    # The shared PostgreSQL ledger (DESIGN §14, docs/postgresql.md): a URL, no password.
    ledger: str | None = None
    lease_seconds: float | None = Field(default=None, gt=0, le=3600)
    # How long a new turn may wait for a busy daemon (docs/architecture.md, admission).
    admission_seconds: float | None = Field(default=None, ge=0, le=3600)


DEFAULTS: dict[str, Any] = {"model": DEFAULT_MODEL, "agent": "build", "sandbox": "workspace-write"}
# Environment variables that set a file key (the others configure the process, §9).
ENV_KEYS = {"HARNESS_MODEL": "model", "HARNESS_SANDBOX": "sandbox", "HARNESS_LEDGER": "ledger"}
BUILTIN_PROVIDERS = ("mistral", "openai", "scripted", "replay")
# Built-in providers a file may give limits to (``[providers.openai]``), and those keys.
LIMITED_BUILTINS = ("mistral", "openai")
LIMIT_KEYS = frozenset({"max_concurrent", "requests_per_minute"})


@dataclass
class Settings:
    """The merged configuration of one directory, with the source of every value."""

    values: dict[str, Any] = field(default_factory=dict)  # nested as in TOML
    sources: dict[str, str] = field(default_factory=dict)  # dotted key → source
    rules: list[Rule] = field(default_factory=list)  # the files' rules, in order
    providers: dict[str, ProviderSpec] = field(default_factory=dict)
    mcp: dict[str, McpServerSpec] = field(default_factory=dict)  # the project's after the global's

    def get(self, key: str) -> Any:
        return self.values.get(key)

    def set(self, key: str, value: Any, source: str) -> None:
        """A value from a layer above the files (environment, flag)."""
        if value is None:
            return
        self.values[key] = value
        self.sources[key] = source


def global_path(environ: Mapping[str, str] | None = None) -> tuple[Path, bool]:
    """The global file and whether it was named explicitly (then it must exist)."""
    env = os.environ if environ is None else environ
    if env.get("HARNESS_CONFIG"):
        return Path(env["HARNESS_CONFIG"]).expanduser(), True
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "harness" / "config.toml", False


def project_path(directory: Path) -> Path | None:
    """The nearest ``.harness/config.toml`` from ``directory`` up to the repository root;
    outside a repository, the one in ``directory`` only."""
    try:
        for candidate in project_chain(directory):
            path = candidate / ".harness" / "config.toml"
            if path.is_file():
                return path
    except (OSError, ValueError):
        return None
    return None


def read_file(path: Path) -> ConfigFile:
    """One file, checked; ``ConfigFileError`` names the file and the first bad key."""
    import tomllib  # ~5 ms, only when there is a file: most runs have none (issue 14)

    try:
        with path.open("rb") as handle:
            raw = tomllib.load(handle)
    except tomllib.TOMLDecodeError as error:
        raise ConfigFileError(f"{path}: not valid TOML: {error}") from None
    except OSError as error:
        raise ConfigFileError(f"{path}: cannot be read: {error.strerror or error}") from None
    try:
        parsed = ConfigFile.model_validate(raw)
    except ValidationError as error:
        first = error.errors()[0]
        key = ".".join(str(part) for part in first["loc"]) or "(top level)"
        reason = "unknown key" if first["type"] == "extra_forbidden" else first["msg"]
        raise ConfigFileError(f"{path}: {key}: {reason}") from None
    for name in parsed.mcp:
        if not re.match(SERVER_NAME, name):
            raise ConfigFileError(
                f"{path}: mcp.{name}: a server name is 1-32 of A-Z a-z 0-9 _ -"
            )
    for name in parsed.providers:
        if name in LIMITED_BUILTINS:
            extra = sorted(parsed.providers[name].model_fields_set - LIMIT_KEYS)
            if extra:
                raise ConfigFileError(
                    f"{path}: providers.{name}.{extra[0]}: a built-in provider takes only "
                    "max_concurrent and requests_per_minute here"
                )
            continue
        if name in BUILTIN_PROVIDERS or "/" in name or ":" in name:
            raise ConfigFileError(
                f"{path}: providers.{name}: the name is built in or holds '/' or ':'"
            )
        if parsed.providers[name].kind is None:
            raise ConfigFileError(f"{path}: providers.{name}.kind: required: 'openai' or 'mistral'")
        if parsed.providers[name].kind == "mistral" and parsed.providers[name].headers:
            raise ConfigFileError(
                f"{path}: providers.{name}.headers: not supported by kind mistral"
            )
    return parsed


def file_rules(parsed: ConfigFile, source: Path | str | None = None) -> list[Rule]:
    """``[permission]`` as rules, in file order (OpenCode's shape), each naming ``source``
    (the file) so the ledger's decision record says where a rule came from."""
    return permission_rules(parsed.permission, None if source is None else str(source))


def permission_rules(
    table: Mapping[str, Action | Mapping[str, Action]], source: str | None
) -> list[Rule]:
    """A ``permission`` table (a config file's or an agent's) as rules, in table order."""
    from harness.permissions.ruleset import permission_for_tool

    rules: list[Rule] = []
    for permission, value in table.items():
        name = permission_for_tool(permission)
        if isinstance(value, str):
            rules.append(Rule(permission=name, pattern="*", action=value, source=source))
        else:
            rules += [
                Rule(permission=name, pattern=p, action=a, source=source)
                for p, a in value.items()
            ]
    return rules


def _leaves(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(_leaves(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def _merge(into: dict[str, Any], data: Mapping[str, Any]) -> None:
    for key, value in data.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = dict(value) if isinstance(value, Mapping) else value


def read_project(directory: Path) -> tuple[Path, ConfigFile] | None:
    """The project file that applies in ``directory``, checked, or None."""
    path = project_path(directory)
    return None if path is None else (path.resolve(), read_file(path))


def daemon_cannot_apply(parsed: ConfigFile) -> list[str]:
    """Keys of a project file the daemon cannot honour per session: its providers, budget
    and sandbox are the daemon's own (from the global file, read at start), and so are its
    MCP servers, shared by all its sessions, and its ledger; Python tools are imported into
    the daemon's process once, from its global file."""
    keys = (
        "providers", "budget", "sandbox", "mcp", "mcp_search_threshold", "tools", "ledger",
        "lease_seconds", "admission_seconds",
    )
    return [key for key in keys if getattr(parsed, key) not in (None, {}, [])]


def load_settings(
    directory: Path, environ: Mapping[str, str] | None = None, *, project: bool = True
) -> Settings:
    """Defaults < global file < project file < environment, for a session in ``directory``
    (``project=False``: the daemon at start, which reads a session's file later)."""
    env = os.environ if environ is None else environ
    settings = Settings(values=dict(DEFAULTS), sources=dict.fromkeys(DEFAULTS, "default"))
    files: list[Path] = []
    path, explicit = global_path(env)
    if path.is_file() or explicit:
        files.append(path)
    found = project_path(directory) if project else None
    if found is not None and found.resolve() not in {f.resolve() for f in files}:
        files.append(found)
    for file in files:
        parsed = read_file(file)
        if file is found and (parsed.ledger is not None or parsed.lease_seconds is not None):
            # A cloned repository must not point the user's ledger, transcripts and all,
            # at a database of its choosing.
            raise ConfigFileError(
                f"{file}: ledger: only the global config file may name the ledger"
            )
        data = parsed.model_dump(exclude_none=True, exclude_defaults=True)
        data.pop("permission", None)
        _merge(settings.values, data)
        source = str(file.resolve())
        settings.sources.update(dict.fromkeys(_leaves(data), source))
        if parsed.permission:
            _merge(settings.values.setdefault("permission", {}), parsed.permission)
            rules_keys = _leaves(parsed.permission, "permission.")
            settings.sources.update(dict.fromkeys(rules_keys, source))
        settings.rules += file_rules(parsed, source)
        settings.providers.update(parsed.providers)
        settings.mcp.update(parsed.mcp)
    for variable, key in ENV_KEYS.items():
        if env.get(variable):
            settings.set(key, env[variable], f"env:{variable}")
    return settings


def provider_kinds(providers: Mapping[str, ProviderSpec]) -> dict[str, Any]:
    """``[providers.NAME]`` entries as provider kinds (harness/providers/table.py)."""
    from harness.providers.table import named_kind

    return {
        name: named_kind(
            name,
            spec.kind,
            base_url=spec.base_url,
            key_env=spec.api_key_env,
            headers=spec.headers,
            models={
                model: (m.context, m.output, m.input_price, m.output_price)
                for model, m in spec.models.items()
            },
        )
        for name, spec in providers.items()
        if spec.kind is not None  # [providers.openai]: the built-in's limits only
    }


def provider_limits(providers: Mapping[str, ProviderSpec]) -> dict[str, Any]:
    """The ``max_concurrent`` / ``requests_per_minute`` of each provider that sets one."""
    from harness.providers.limiter import ProviderLimits

    return {
        name: ProviderLimits(spec.max_concurrent, spec.requests_per_minute)
        for name, spec in providers.items()
        if spec.max_concurrent is not None or spec.requests_per_minute is not None
    }


def load_tools(settings: Settings) -> list[Any]:
    """The files' ``tools`` entries, imported and checked now: a bad one is a
    ``ConfigFileError`` naming the file and the entry, before anything starts."""
    entries = settings.get("tools") or []
    if not entries:
        return []
    from harness.tools.python_tool import ToolDefinitionError, as_tool
    from harness.tools.registry import tool_table

    source = settings.sources.get("tools", "config")
    try:
        tools = [as_tool(entry, f"tools[{index}]") for index, entry in enumerate(entries)]
        tool_table(tools)  # a clash with a built-in, or two of one name
    except ToolDefinitionError as error:
        raise ConfigFileError(f"{source}: {error}") from None
    return tools


def config_overrides(settings: Settings) -> dict[str, Any]:
    """The ``Config`` fields the merged files set (flags are laid over these by the caller,
    and the file rules come before the flags' so a flag wins)."""
    values = settings.values
    budget = values.get("budget", {})
    limits = {
        f"{name}/{model}": (m.context, m.output)
        for name, spec in settings.providers.items()
        for model, m in spec.models.items()
        if m.context is not None and m.output is not None
    }
    return {
        "model": values.get("model"),
        "agent": values.get("agent"),
        "sandbox": values.get("sandbox"),
        "budget_tokens": budget.get("tokens"),
        "budget_cost": budget.get("cost"),
        "budget_time": budget.get("time"),
        "providers": provider_kinds(settings.providers),
        "model_limits": limits,
        "secret_env": [
            *(s.api_key_env for s in settings.providers.values() if s.api_key_env),
            # ${VAR} of an MCP server's env or headers names a credential: redacted too.
            *(name for spec in settings.mcp.values() for name in spec.variables()),
        ],
        "provider_limits": provider_limits(settings.providers),
        "tools": load_tools(settings),
        "mcp_servers": dict(settings.mcp),
        "mcp_search_threshold": values.get("mcp_search_threshold"),
        "ledger": values.get("ledger"),
        "lease_seconds": values.get("lease_seconds"),
        "admission_seconds": values.get("admission_seconds"),
    }


def config_from_files(
    directory: Path | str = ".", *, project: bool = True, **overrides: object
) -> Config:
    """``Config.from_env`` over the configuration files that apply in ``directory``:
    defaults < global < project < environment < ``overrides``. The files' rules come before
    ``overrides["rules"]``, so an override's rule wins. Raises ``ConfigFileError`` (a
    ``ConfigError``) naming the file and key. ``project=False``: the global file only."""
    settings = load_settings(Path(directory), project=project)
    values: dict[str, object] = config_overrides(settings)
    # The global agent files when the harness starts, a session's project ones when it is
    # created (harness/agent_files.py).
    values["agent_files"] = True
    rules = cast("Sequence[Rule]", overrides.pop("rules", None) or ())
    values.update({key: value for key, value in overrides.items() if value is not None})
    values["rules"] = [*settings.rules, *rules]
    return Config.from_env(**values)
