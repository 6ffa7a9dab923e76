"""The built-in tools, by the names the model sees (DESIGN §7)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from harness.messages.provider import ToolSpec
from harness.tools.apply_patch import ApplyPatchTool
from harness.tools.base import Tool
from harness.tools.bash import BashTool
from harness.tools.edit import EditTool
from harness.tools.glob import GlobTool
from harness.tools.grep import GrepTool
from harness.tools.list import ListTool
from harness.tools.question import QuestionTool
from harness.tools.read import ReadTool
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


def tool_specs(tools: Mapping[str, Tool[Any]] | Iterable[Tool[Any]]) -> dict[str, ToolSpec]:
    """JSON schemas for the model, built once: they never change while a harness runs."""
    items = tools.values() if isinstance(tools, Mapping) else tools
    return {
        tool.name: ToolSpec(tool.name, tool.description, tool.params.model_json_schema())
        for tool in items
    }
