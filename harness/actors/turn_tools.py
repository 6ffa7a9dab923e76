"""The tools of one turn when MCP servers are configured: built-in plus the servers'.

A turn without MCP servers gets a plain dict and a fixed list of specs, as before. With
them, the tools can change between two steps (a server started or died, listed its tools
again after ``tools/list_changed``, a tool loaded by ``mcp_search``), so the executor looks
tools up here at each call and the runner asks for the specs at each step. Rules that deny
a tool outright hide it from the model as they hide a built-in one.

In tool-search mode (the servers' schemas take more tokens than the threshold), the model
is offered ``mcp_search`` and the MCP tools it has loaded with it, not every schema; a
tool not loaded can still be called by name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from harness.messages.model import Part, Rule, ToolCompleted, ToolPart
from harness.messages.provider import ToolSpec
from harness.permissions.ruleset import disabled_tools
from harness.tools.base import Tool
from harness.tools.mcp import SEARCH_TOOL, McpSearchTool, McpToolInfo, SearchParams

if TYPE_CHECKING:
    from harness.actors.mcp_hub import McpHub


class _Hidden:
    def __init__(self, tools: TurnTools) -> None:
        self._tools = tools

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._tools.hidden()


class TurnTools(Mapping[str, Tool[Any]]):
    def __init__(
        self,
        builtin: Mapping[str, Tool[Any]],
        builtin_specs: Mapping[str, ToolSpec],
        rules_of: Callable[[], Sequence[Rule]],
        ceilings: Sequence[Sequence[Rule]],
        hub: McpHub,
        session_id: str,
        earlier: Callable[[], Sequence[Part]] = tuple,
    ) -> None:
        self._builtin = builtin
        self._builtin_specs = builtin_specs
        self._rules_of = rules_of
        # The turn's rule layers, shared with its executor (and the asks it sends): the
        # session's own is made again when the servers' tools change, so the defaults of a
        # tool listed mid-turn (readOnlyHint: allow) apply from the next call on.
        self.layers: list[Sequence[Rule]] = [rules_of(), *ceilings]
        self._hub = hub
        self._session_id = session_id
        self._search = McpSearchTool(self)
        if hub.searching(session_id) and not hub.knows(session_id):
            # A harness started again (or another session actor) remembers what this
            # session loaded: the ledger has its searches.
            hub.loaded(session_id).update(_loaded_before(earlier()))
        self.disabled = _Hidden(self)
        self._version = -1
        self._tools: dict[str, Tool[Any]] = {}
        self._hidden: set[str] = set()
        self._specs: tuple[ToolSpec, ...] = ()
        self._specs_key: tuple[int, bool, frozenset[str]] | None = None

    def _current(self) -> dict[str, Tool[Any]]:
        if self._hub.version != self._version:
            if self._version != -1:
                self.layers[0] = self._rules_of()
            self._version = self._hub.version
            tools = {**self._builtin, **self._hub.tools(self._session_id)}
            if self._hub.infos(self._session_id):
                tools[SEARCH_TOOL] = self._search
            self._hidden = set().union(*(disabled_tools(tools, rules) for rules in self.layers))
            self._tools = {name: t for name, t in tools.items() if name not in self._hidden}
        return self._tools

    def hidden(self) -> set[str]:
        self._current()
        return self._hidden

    def __getitem__(self, name: str) -> Tool[Any]:
        return self._current()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._current())

    def __len__(self) -> int:
        return len(self._current())

    # --- the McpCatalog of mcp_search -------------------------------------------------------

    def mcp_tools(self) -> list[McpToolInfo]:
        tools = self._current()
        return [info for info in self._hub.infos(self._session_id) if info.name in tools]

    def load(self, names: Sequence[str]) -> None:
        self._hub.loaded(self._session_id).update(names)

    # --- what the model is offered ----------------------------------------------------------

    async def specs(self) -> tuple[ToolSpec, ...]:
        """The specs for the next step; the same tuple until something changed."""
        await self._hub.refresh(self._session_id)
        tools = self._current()
        searching = self._hub.searching(self._session_id)
        loaded = frozenset(self._hub.loaded(self._session_id)) if searching else frozenset()
        key = (self._version, searching, loaded)
        if key == self._specs_key:
            return self._specs
        infos = {info.name: info for info in self._hub.infos(self._session_id)}
        specs: list[ToolSpec] = []
        for name, tool in tools.items():
            if name in self._builtin_specs:
                specs.append(self._builtin_specs[name])
            elif name == SEARCH_TOOL:
                if searching:
                    schema = SearchParams.model_json_schema()
                    specs.append(ToolSpec(name, tool.description, schema))
            elif name in infos:
                if not searching or name in loaded:
                    info = infos[name]
                    specs.append(ToolSpec(name, info.description, info.schema))
            else:  # a server's resources tool: small, always offered
                specs.append(ToolSpec(name, tool.description, tool.params.model_json_schema()))
        self._specs, self._specs_key = tuple(specs), key
        return self._specs


def _loaded_before(parts: Sequence[Part]) -> set[str]:
    """The tools earlier ``mcp_search`` calls of a session loaded."""
    loaded: set[str] = set()
    for part in parts:
        if isinstance(part, ToolPart) and part.tool == SEARCH_TOOL:
            state = part.state
            if isinstance(state, ToolCompleted):
                names = state.metadata.get("loaded")
                if isinstance(names, list):
                    loaded.update(str(name) for name in names)
    return loaded
