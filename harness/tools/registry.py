"""The built-in tools, by the names the model sees (DESIGN §7)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from harness import machine_cache
from harness.messages.model import Rule
from harness.messages.provider import ToolSpec
from harness.tools.apply_patch import ApplyPatchTool
from harness.tools.base import Tool, ToolParams
from harness.tools.bash import BashTool
from harness.tools.edit import EditTool
from harness.tools.glob import GlobTool
from harness.tools.grep import GrepTool
from harness.tools.list import ListTool
from harness.tools.python_tool import PythonTool, ToolDefinitionError, as_tool
from harness.tools.question import QuestionTool
from harness.tools.read import ReadTool
from harness.tools.schema_key import SCHEMA_CACHE, schema_key
from harness.tools.skill import SkillTool
from harness.tools.task import TaskTool
from harness.tools.todo import TodoReadTool, TodoWriteTool
from harness.tools.webfetch import WebFetchTool
from harness.tools.write import WriteTool


def builtin_tools() -> dict[str, Tool[Any]]:
    tools: list[Tool[Any]] = [
        ReadTool(),
        WriteTool(),
        EditTool(),
        BashTool(),
        GlobTool(),
        GrepTool(),
        ListTool(),
        TaskTool(),
        WebFetchTool(),
        ApplyPatchTool(),
        TodoWriteTool(),
        TodoReadTool(),
        QuestionTool(),
        SkillTool(),  # offered only to sessions that have skills (actors/turn_builder.py)
    ]
    return {tool.name: tool for tool in tools}


def tool_table(
    entries: Iterable[object],
    where: str = "tools",
    builtins: Mapping[str, Tool[Any]] | None = None,
) -> tuple[dict[str, Tool[Any]], tuple[Rule, ...]]:
    """The built-in tools with ``entries`` (``Config.tools``) added, and the default rules
    the added tools bring (``@harness.tool(permission="allow")``, at the defaults' layer).

    A name a built-in has is an error unless the tool says it replaces it, and then it
    takes the built-in's place; two added tools of one name are an error. Raises
    ``ToolDefinitionError`` naming the entry (``tools[2]: ...``).
    """
    builtins = builtin_tools() if builtins is None else builtins
    table = dict(builtins)
    rules: list[Rule] = []
    added: set[str] = set()
    for index, entry in enumerate(entries):
        here = f"{where}[{index}]"
        extra = as_tool(entry, here)
        replaces = isinstance(extra, PythonTool) and extra.replaces
        if extra.name in added:
            raise ToolDefinitionError(f"{here}: a second tool named {extra.name!r}")
        if extra.name in builtins and not replaces:
            raise ToolDefinitionError(
                f"{here}: {extra.name!r} is the name of a built-in tool; rename yours, or "
                "declare @harness.tool(replaces=True) to take its place"
            )
        if replaces and extra.name not in builtins:
            raise ToolDefinitionError(
                f"{here}: {extra.name!r} says it replaces a built-in tool, but none has "
                f"that name ({', '.join(sorted(builtins))})"
            )
        table[extra.name] = extra
        added.add(extra.name)
        if isinstance(extra, PythonTool) and extra.permission != "ask":
            rules.append(extra.default_rule())
    return table, tuple(rules)


def tool_specs(tools: Mapping[str, Tool[Any]] | Iterable[Tool[Any]]) -> dict[str, ToolSpec]:
    """JSON schemas for the model, built once: they never change while a harness runs."""
    items = tools.values() if isinstance(tools, Mapping) else tools
    return {
        tool.name: ToolSpec(tool.name, tool.description, params_schema(tool.params))
        for tool in items
    }


def params_schema(params: type[ToolParams]) -> dict[str, Any]:
    """``params.model_json_schema()``, from the machine's cache when the CLI keeps one.

    Building the schema builds the model first (the built-in tools' models are built on
    first use, ``defer_build``): ~17 ms of every start-up for the same schemas.
    """
    key = schema_key(params) if machine_cache.enabled() else None
    if key is not None:
        cached = machine_cache.lookup(SCHEMA_CACHE, key)
        if isinstance(cached, dict):
            return cached
    schema = params.model_json_schema()
    if key is not None:
        machine_cache.store(SCHEMA_CACHE, key, schema)
    return schema
