"""Settings, from arguments or the environment (DESIGN §9 lists the variables)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from harness.agents import Agent
    from harness.mcp.spec import McpServerSpec
    from harness.messages.model import Rule
    from harness.providers.base import Provider
    from harness.providers.limiter import ProviderLimits
    from harness.providers.table import ProviderKind
    from harness.tools.sandbox import SandboxMode

DEFAULT_MODEL = "mistral/devstral-medium-latest"


def default_home() -> Path:
    explicit = os.environ.get("HARNESS_HOME")
    if explicit:
        return Path(explicit).expanduser()
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "harness"


class ConfigError(ValueError):
    """A setting from the environment has a value harness cannot use; says which."""


@dataclass
class Config:
    """Everything a harness needs; every field has a working default.

    ``provider_factory`` replaces the model-string lookup (embedding, tests): it gets the
    session's model string and returns a Provider. ``interactive=False`` rejects every
    permission ask at once, with a message naming the flag that would allow it; ``yes=True``
    allows every ask instead, and still refuses whatever a rule denies.
    """

    home: Path = field(default_factory=default_home)
    model: str = DEFAULT_MODEL
    base_url: str | None = None
    agent: str = "build"
    max_steps: int | None = None
    rules: Sequence[Rule] = ()
    interactive: bool = True
    # --yes: every permission that asks is allowed at once; denials stay (DESIGN §8).
    yes: bool = False
    durability: Literal["normal", "full"] = "normal"
    log_level: str = "info"
    log_format: Literal["json", "console"] = "json"
    log_file: Path | None = None
    retry_attempts: int = 5  # provider attempts per step, the first included
    retry_initial_delay: float = 2.0  # seconds; doubles each attempt, capped at 30 s
    model_limits: dict[str, tuple[int, int]] = field(default_factory=dict)  # (context, output)
    compaction_keep_tokens: int = 8_000  # recent history kept verbatim after a compaction
    prune_protect_tokens: int | None = 40_000  # newest tool output never pruned; None: never
    budget_tokens: int | None = None  # per run, over the whole session tree
    budget_cost: float | None = None  # USD
    budget_time: float | None = None  # seconds
    show_request: bool = False  # publish each exact request as a step.request event
    title_model: str | None = None  # a model to write titles with; None: derive them
    max_task_depth: int = 3  # how deep `task` may nest child sessions
    max_children: int = 4  # child sessions of one session running at once
    restart_limit: int = 3
    restart_window: float = 60.0
    # An idle session's actor (and its provider) is let go after this many seconds; the
    # next prompt starts a fresh one from the ledger. None: actors live as long as the
    # process (a daemon then holds every session it ever ran).
    session_idle_seconds: float | None = 10.0
    provider_factory: Callable[[str], Provider] | None = None
    record: Path | None = None  # append every provider HTTP exchange to this cassette
    # What tools' subprocesses run under (DESIGN §8, Sandbox); falls back to "off", with a
    # notice, where bubblewrap does not work. ``sandbox_bwrap``: the binary, or its name.
    sandbox: SandboxMode = "workspace-write"
    sandbox_bwrap: str = "bwrap"
    # Environment variables kept from tools' subprocesses, on top of the credentials
    # harness knows (harness/secrets.py).
    secret_env: Sequence[str] = ()
    # Named providers (``[providers.NAME]`` of a configuration file): model strings
    # ``NAME/<model>`` for this harness only (harness/providers/table.py, named_providers).
    providers: Mapping[str, ProviderKind] = field(default_factory=dict)
    # Python tools (DESIGN §12): ``@harness.tool`` functions, plain functions, or
    # ``"package.module:function"`` strings, imported when the harness opens. A name a
    # built-in tool has is an error unless the tool declares ``replaces=True``.
    tools: Sequence[object] = ()
    # Limits per provider name (``openai``, ``mistral``, a named one), each enforced by
    # one limiter shared by every session of the harness (harness/providers/limiter.py).
    provider_limits: Mapping[str, ProviderLimits] = field(default_factory=dict)
    # MCP servers (``[mcp.NAME]``, DESIGN §12), and the schema tokens past which the model
    # gets a search tool over their tools instead of every schema (docs/mcp.md).
    mcp_servers: Mapping[str, McpServerSpec] = field(default_factory=dict)
    mcp_search_threshold: int = 10_000
    # Agents over the built-in ones, by name (an embedder's own). ``agent_files``: also
    # read the global agent files and tables when the harness starts, and each session's
    # project ones when it is created (harness/agent_files.py, DESIGN §12);
    # ``config_from_files`` and the CLI set it, ``Config()`` alone reads no file.
    agents: Mapping[str, Agent] = field(default_factory=dict)
    agent_files: bool = False
    # The shared ledger (DESIGN §14): a ``postgresql://`` URL that every daemon naming it
    # shares; None: the SQLite file under ``home``. ``lease_seconds``: how long a daemon's
    # claim on a session lasts without renewal (then another daemon takes it over).
    ledger: str | None = None
    lease_seconds: float = 10.0
    # The longest a new turn waits for a busy daemon to finish the steps of the turns it
    # runs before starting it (harness/actors/admission.py); 0 (the default): new turns
    # never wait. Off by default: measured, the wait cost more in claims (p99 0.5-1.3 s
    # against 65-80 ms) and in one daemon's saturation throughput than it saved in steps.
    admission_seconds: float = 0.0

    def __post_init__(self) -> None:
        self.home = Path(self.home).expanduser()
        from harness.tools.sandbox import parse_sandbox_mode

        try:
            self.sandbox = parse_sandbox_mode(str(self.sandbox), "Config.sandbox")
        except ValueError as error:
            raise ConfigError(str(error)) from None
        names = self.secret_env
        self.secret_env = (names,) if isinstance(names, str) else tuple(names)
        if self.record is not None:
            self.record = Path(self.record).expanduser()
        if self.ledger is not None:
            self.ledger = check_ledger_url(str(self.ledger))
        if not 0 < self.lease_seconds <= 3600:
            raise ConfigError(f"lease_seconds={self.lease_seconds}: expected 0 < seconds <= 3600")
        if not 0 <= self.admission_seconds <= 3600:
            raise ConfigError(
                f"admission_seconds={self.admission_seconds}: expected 0 <= seconds <= 3600"
            )

    @classmethod
    def from_env(cls, **overrides: object) -> Config:
        env = os.environ
        values: dict[str, object] = {"home": default_home()}
        if env.get("HARNESS_MODEL"):
            values["model"] = env["HARNESS_MODEL"]
        if env.get("HARNESS_BASE_URL"):
            values["base_url"] = env["HARNESS_BASE_URL"]
        if env.get("HARNESS_LOG_LEVEL"):
            values["log_level"] = env["HARNESS_LOG_LEVEL"].lower()
        if env.get("HARNESS_LOG_FORMAT") in ("json", "console"):
            values["log_format"] = env["HARNESS_LOG_FORMAT"]
        if env.get("HARNESS_DURABILITY"):
            durability = env["HARNESS_DURABILITY"].strip().lower()
            if durability not in ("normal", "full"):
                raise ConfigError(
                    f"HARNESS_DURABILITY={env['HARNESS_DURABILITY']!r}: expected 'normal' or 'full'"
                )
            values["durability"] = durability
        if env.get("HARNESS_SANDBOX"):
            from harness.tools.sandbox import parse_sandbox_mode

            try:
                values["sandbox"] = parse_sandbox_mode(env["HARNESS_SANDBOX"], "HARNESS_SANDBOX")
            except ValueError as error:
                raise ConfigError(str(error)) from None
        if env.get("HARNESS_LEDGER"):
            values["ledger"] = env["HARNESS_LEDGER"]
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]

    @property
    def ledger_path(self) -> Path:
        return self.home / "ledger.db"

    @property
    def tool_output_dir(self) -> Path:
        return self.home / "tool-output"

    @property
    def socket_path(self) -> Path:
        """Where the daemon listens; may raise ``SocketPathError`` (see ``usable_socket_path``)."""
        explicit = os.environ.get("HARNESS_SOCKET")
        return usable_socket_path(Path(explicit) if explicit else self.home / "harness.sock")


def check_ledger_url(url: str) -> str:
    """A ledger URL as given, if usable: PostgreSQL, and without a password.

    A password in a URL would sit in shell histories, process lists and logs, so it is
    refused (not stripped): libpq reads it from PGPASSWORD, PGPASSFILE or ~/.pgpass.
    """
    from urllib.parse import parse_qs, urlsplit

    url = url.strip()
    if not url.startswith(("postgresql://", "postgres://")):
        raise ConfigError(
            f"ledger {url[:80]!r}: expected a postgresql:// URL (without one, the ledger is "
            "the SQLite file $HARNESS_HOME/ledger.db)"
        )
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError as error:
        raise ConfigError(f"ledger URL: {error}") from None
    if password or "password" in parse_qs(parts.query):
        raise ConfigError(
            "the ledger URL holds a password: remove it and give it to libpq through "
            "PGPASSWORD, PGPASSFILE or ~/.pgpass"
        )
    return url


MAX_SOCKET_PATH = 107  # bytes: sun_path holds 108, the last one a NUL


class SocketPathError(ValueError):
    """No usable socket path: the message says which path and why."""


def usable_socket_path(path: Path) -> Path:
    """``path``, or ``$XDG_RUNTIME_DIR/harness-<uid>.sock`` when ``path`` is too long."""
    if len(os.fsencode(path)) <= MAX_SOCKET_PATH:
        return path
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        fallback = Path(runtime) / f"harness-{os.getuid()}.sock"
        if len(os.fsencode(fallback)) <= MAX_SOCKET_PATH:
            return fallback
    raise SocketPathError(
        f"the socket path {path} is longer than {MAX_SOCKET_PATH} bytes and "
        "$XDG_RUNTIME_DIR offers no shorter one: set HARNESS_SOCKET to a shorter path"
    )
