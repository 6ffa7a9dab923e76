"""Custom agents (DESIGN §11 last bullet, §12 "Agents"): tables and Markdown files.

An agent is defined, lowest first, by: the built-in agent of that name (harness/agents.py),
the global level, then the project level. A level is its ``agents/NAME.md`` files (YAML
front matter, the body is the prompt) and then its config file's ``[agents.NAME]`` tables,
so the table wins over the file of the same level. Each layer changes only the fields it
sets: a scalar replaces the one below, ``tools`` entries are laid over the ones below, and
``permission`` rules are appended after the ones below (the last matching rule wins, as
in every ruleset), each rule naming the file it came from.

- global: ``$XDG_CONFIG_HOME/harness/agents/`` (default ``~/.config/harness/agents/``) and
  the global ``config.toml``;
- project: the nearest ``.harness/agents/`` and the nearest ``.harness/config.toml`` from
  the session directory up to the repository root.

A file that cannot be parsed, or a field of the wrong type, is a ``ConfigFileError`` naming
the file (and the key). Parsed files are kept per process by (mtime, size, inode), so a
daemon re-reads only what changed and a repository with no agent files never imports YAML.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

from pydantic import ValidationError

from harness import frontmatter
from harness.agents import _BUILD_PROMPT, _GENERAL_PROMPT, AGENTS, Agent
from harness.config_files import (
    AgentSpec,
    ConfigFileError,
    global_path,
    permission_rules,
    project_path,
    read_file,
)
from harness.messages.model import Session
from harness.project import project_chain

AGENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")

Catalog = Mapping[str, Agent]


class Definition(NamedTuple):  # not a dataclass: cheaper to create at import
    """One layer of one agent: what a file or a table sets."""

    name: str
    spec: AgentSpec
    source: str  # the file's absolute path


_Signature = tuple[int, int, int]
_PARSED: dict[Path, tuple[_Signature, AgentSpec]] = {}


def read_agent_file(path: Path, info: os.stat_result | None = None) -> AgentSpec:
    """An agent file's front matter and body; ``ConfigFileError`` names the file.
    ``info``: its stat, when the caller has it (a directory listing)."""
    try:
        info = info or path.stat()
    except OSError as error:
        raise ConfigFileError(f"{path}: cannot be read: {error.strerror or error}") from None
    signature = (info.st_mtime_ns, info.st_size, info.st_ino)
    cached = _PARSED.get(path)
    if cached is not None and cached[0] == signature:
        return cached[1]
    try:
        data, body = frontmatter.read_cached(path, info)
    except frontmatter.FrontMatterError as error:
        raise ConfigFileError(f"{path}: {error}") from None
    if "prompt" in data:
        raise ConfigFileError(f"{path}: prompt: unknown key (the body is the prompt)")
    try:
        spec = AgentSpec.model_validate({**data, "prompt": body.strip() or None})
    except ValidationError as error:
        first = error.errors()[0]
        key = ".".join(str(part) for part in first["loc"]) or "(front matter)"
        reason = "unknown key" if first["type"] == "extra_forbidden" else first["msg"]
        raise ConfigFileError(f"{path}: {key}: {reason}") from None
    _PARSED[path] = (signature, spec)
    return spec


def _check_name(name: str, where: str) -> None:
    if not AGENT_NAME.fullmatch(name):
        raise ConfigFileError(
            f"{where}: agent name {name[:80]!r}: use letters, digits, '-', '_' or '.' "
            "(at most 64, not starting with a punctuation mark)"
        )


def folder_definitions(folder: Path | None) -> list[Definition]:
    """The ``NAME.md`` files of an agents folder, by name; none when it does not exist."""
    if folder is None:
        return []
    try:
        real = folder.resolve()
        with os.scandir(real) as listing:
            entries = sorted(
                (entry.name, entry)
                for entry in listing
                if entry.name.endswith(".md") and not entry.name.startswith(".")
            )
        definitions = []
        for file_name, entry in entries:
            if not entry.is_file():  # follows a symlink, as reading it would
                continue
            name = file_name.removesuffix(".md")
            path = real / file_name
            _check_name(name, str(path))
            spec = read_agent_file(path, entry.stat())
            definitions.append(Definition(name, spec, str(path)))
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as error:
        raise ConfigFileError(f"{folder}: cannot be read: {error.strerror or error}") from None
    return definitions


def table_definitions(config: Path | None) -> list[Definition]:
    """A config file's ``[agents.NAME]`` tables, in file order."""
    if config is None or not config.is_file():
        return []
    source = str(config.resolve())
    tables = read_file(config).agents
    for name in tables:
        _check_name(name, f"{source}: agents.{name}")
    return [Definition(name, spec, source) for name, spec in tables.items()]


def global_folder(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "harness" / "agents"


def global_definitions(environ: Mapping[str, str] | None = None) -> list[Definition]:
    config, _ = global_path(environ)
    return [*folder_definitions(global_folder(environ)), *table_definitions(config)]


def project_definitions(directory: Path) -> list[Definition]:
    folder = next(
        (d / ".harness" / "agents" for d in project_chain(directory)
         if (d / ".harness" / "agents").is_dir()),
        None,
    )
    return [*folder_definitions(folder), *table_definitions(project_path(directory))]


def agent_sources(directory: Path) -> dict[str, list[str]]:
    """Each agent that a file or table defines or changes, with those files lowest layer
    first (global before project, a folder's file before a table): the order ``apply``
    lays them over the built-ins. What ``harness config`` shows."""
    sources: dict[str, list[str]] = {}
    for definition in [*global_definitions(), *project_definitions(directory)]:
        layers = sources.setdefault(definition.name, [])
        if definition.source not in layers:
            layers.append(definition.source)
    return dict(sorted(sources.items()))


def apply(agent: Agent | None, definition: Definition) -> Agent:
    """``agent`` with the fields ``definition`` sets laid over it."""
    spec, source = definition.spec, definition.source
    if agent is None:
        # OpenCode's default for a new agent: usable both ways.
        agent = Agent(name=definition.name, description="", prompt="", mode="all", source="")
    changes: dict[str, object] = {
        field: value
        for field in ("description", "mode", "model", "steps", "prompt")
        if (value := getattr(spec, field)) is not None
    }
    if spec.tools:
        changes["tools"] = {**agent.tools, **spec.tools}
    if spec.permission:
        changes["rules"] = (*agent.rules, *permission_rules(spec.permission, source))
    changes["source"] = f"{agent.source}, {source}" if agent.source else source
    return dataclasses.replace(agent, **changes)  # type: ignore[arg-type]


def build_catalog(base: Catalog, definitions: Iterable[Definition]) -> dict[str, Agent]:
    """``base`` with every definition applied in order; a new agent with no prompt at
    all gets the built-in one of its kind."""
    catalog = dict(base)
    for definition in definitions:
        catalog[definition.name] = apply(catalog.get(definition.name), definition)
    for name, agent in catalog.items():
        if not agent.prompt:
            prompt = _GENERAL_PROMPT if agent.mode == "subagent" else _BUILD_PROMPT
            catalog[name] = dataclasses.replace(agent, prompt=prompt)
    return catalog


def global_catalog(environ: Mapping[str, str] | None = None) -> dict[str, Agent]:
    """The built-in agents under the global level (what ``Config.agents`` holds)."""
    return build_catalog(AGENTS, global_definitions(environ))


def project_catalog(base: Catalog, directory: Path) -> dict[str, Agent]:
    """``base`` under the project level of ``directory``."""
    catalog = build_catalog(base, project_definitions(directory))
    frontmatter.flush()  # the global level's files too: one write for both
    return catalog


class AgentBook:
    """The agents each session of one harness can use.

    A session's catalog is read when it is created (the project level of its directory
    over the harness's ``Config.agents``) and kept for it, so a changed file applies to
    the next session; a child uses its parent's. A session the process has not seen
    created (one resumed after a restart) has its directory read on first use.
    """

    def __init__(self, base: Catalog, *, files: bool) -> None:
        """``files``: read the global level now and each session's project level at its
        creation; ``ConfigFileError`` when a global file is bad."""
        self._base = {**AGENTS, **base}
        if files:
            self._base = build_catalog(self._base, global_definitions())
        self._project_files = files
        self._sessions: dict[str, Catalog] = {}

    def load(self, directory: Path) -> Catalog:
        """The catalog for a new session in ``directory``; ``ConfigFileError`` if a file is bad."""
        if not self._project_files:
            return self._base
        return project_catalog(self._base, directory)

    def bind(self, session_id: str, catalog: Catalog) -> None:
        self._sessions[session_id] = catalog

    def of(self, session: Session) -> Catalog:
        catalog = self._sessions.get(session.id)
        if catalog is None and session.parent_id is not None:
            catalog = self._sessions.get(session.parent_id)
        if catalog is None:
            catalog = self.load(Path(session.directory))
        self._sessions[session.id] = catalog
        return catalog

    def agent_of(self, session: Session) -> Agent:
        from harness.agents import get_agent

        return get_agent(session.agent, self.of(session))
