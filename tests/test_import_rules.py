"""The layers of harness and which may import which, checked on the source with ``ast``.

- ``harness.messages`` imports nothing of ours outside itself: every layer may use it.
- ``harness.tools`` never imports the actors, the server or the command line.
- The command line (``harness.cli``, ``harness.commands``) imports only the daemon
  client, the public ``harness`` package and itself.
- No import cycle among our modules.

Every import counts, wherever it is written: at the top, inside a function (a lazy
import is still a dependency) or under ``TYPE_CHECKING`` (so is an annotation).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parent.parent / "harness"


@dataclass(frozen=True, slots=True)
class Import:
    source: str  # the importing module
    target: str  # the module imported (a package when a name is taken from it)
    line: int

    def __str__(self) -> str:
        return f"{self.source} imports {self.target} (line {self.line})"


def module_names(root: Path) -> dict[str, Path]:
    """Every module of the package at ``root``, by dotted name."""
    names: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def imports_of(root: Path) -> list[Import]:
    """Each import of one of the package's own modules, by one of them."""
    modules = module_names(root)
    ours = root.name
    found: list[Import] = []
    for source, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the importing module's package
                    package = _package_of(source, path).split(".")
                    anchor = package[: len(package) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                # ``from harness import snapshots`` imports a module; ``from harness import
                # Config`` takes a name from the package.
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    for alias in node.names
                ]
            for target in targets:
                if target.split(".")[0] == ours and target != source:
                    found.append(Import(source, target, getattr(node, "lineno", 0)))
    return found


def cycles(edges: list[Import]) -> list[list[str]]:
    """The groups of modules that import each other, directly or around a loop."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.source, set()).add(edge.target)
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        order[node] = low[node] = len(order)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in order:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], order[nxt])
        if low[node] == order[node]:
            group: list[str] = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in order:
            visit(node)
    return found


def _within(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def messages_breaches(edges: list[Import], ours: str = "harness") -> list[str]:
    messages = f"{ours}.messages"
    return [
        str(e) for e in edges if _within(e.source, messages) and not _within(e.target, messages)
    ]


def tools_breaches(edges: list[Import], ours: str = "harness") -> list[str]:
    banned = (f"{ours}.actors", f"{ours}.server", f"{ours}.cli", f"{ours}.commands")
    tools = f"{ours}.tools"
    return [str(e) for e in edges if _within(e.source, tools) and _within(e.target, *banned)]


def cli_breaches(edges: list[Import], ours: str = "harness") -> list[str]:
    cli = (f"{ours}.cli", f"{ours}.commands")
    allowed = {ours, f"{ours}.client"}
    return [
        str(e)
        for e in edges
        if _within(e.source, *cli) and e.target not in allowed and not _within(e.target, *cli)
    ]


@pytest.fixture(scope="module")
def edges() -> list[Import]:
    return imports_of(HARNESS)


def test_the_source_is_found(edges: list[Import]) -> None:
    # Guards the checks below against passing because they read nothing.
    assert {"harness.messages.events", "harness.tools.base", "harness.cli"} <= set(
        module_names(HARNESS)
    )
    assert "harness.storage.port" in {e.target for e in edges if e.source == "harness.runtime"}


def test_messages_import_nothing_of_ours(edges: list[Import]) -> None:
    assert messages_breaches(edges) == []


def test_tools_never_import_actors_the_server_or_the_cli(edges: list[Import]) -> None:
    assert tools_breaches(edges) == []


def test_the_cli_imports_only_the_client_and_the_public_api(edges: list[Import]) -> None:
    assert cli_breaches(edges) == []


def api_model_breaches(edges: list[Import], ours: str = "harness") -> list[str]:
    """The daemon API's models (25 of them, ~14 ms to build) are the daemon's own."""
    allowed = (f"{ours}.server", f"{ours}.openapi", f"{ours}.messages")
    return [
        str(e)
        for e in edges
        if e.target == f"{ours}.messages.api" and not _within(e.source, *allowed)
    ]


def test_only_the_daemon_imports_the_api_models(edges: list[Import]) -> None:
    # A run never needs them: harness.snapshots once took a Literal from there, and
    # every run built the API's models before its first request (issue 14).
    assert api_model_breaches(edges) == []


def test_no_import_cycle_among_our_modules(edges: list[Import]) -> None:
    assert cycles(edges) == []


def test_the_checks_catch_each_kind_of_breach(tmp_path: Path) -> None:
    """The checker on a small package that breaks every rule once."""
    files = {
        "__init__.py": "",
        "client.py": "",
        "server.py": "",
        "cli.py": "from pkg import Config\nfrom pkg.client import Client\n"
        "def run():\n    from pkg.actors import session\n",
        "commands/__init__.py": "",
        "commands/run.py": "from .. import cli\nfrom ..server import serve\n",
        "messages/__init__.py": "",
        "messages/events.py": "from pkg.messages import model\n"
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.storage import ledger\n",
        "messages/model.py": "import json\n",
        "messages/api.py": "",
        "snapshots.py": "from pkg.messages.api import RevertAction\n",
        "storage/__init__.py": "",
        "storage/ledger.py": "from pkg.messages.events import Event\n",
        "tools/__init__.py": "",
        "tools/bash.py": "from pkg.messages import events\nimport pkg.actors.session\n",
        "actors/__init__.py": "",
        "actors/session.py": "from pkg.actors.children import Children\n",
        "actors/children.py": "def later():\n    from pkg.actors import session\n",
    }
    root = tmp_path / "pkg"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    found = imports_of(root)
    assert messages_breaches(found, "pkg") == [
        "pkg.messages.events imports pkg.storage.ledger (line 4)"
    ]
    assert tools_breaches(found, "pkg") == ["pkg.tools.bash imports pkg.actors.session (line 2)"]
    assert api_model_breaches(found, "pkg") == ["pkg.snapshots imports pkg.messages.api (line 1)"]
    assert sorted(cli_breaches(found, "pkg")) == [
        "pkg.cli imports pkg.actors.session (line 4)",
        "pkg.commands.run imports pkg.server (line 2)",
    ]
    assert cycles(found) == [
        ["pkg.actors.children", "pkg.actors.session"],
        ["pkg.messages.events", "pkg.storage.ledger"],
    ]
