"""The ``write`` tool: create or overwrite a whole file."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from pydantic import Field

from harness.tools.base import (
    PermissionNeed,
    Tool,
    ToolContext,
    ToolFailure,
    ToolOutput,
    ToolParams,
)
from harness.tools.paths import display_path, resolve_path, write_needs
from harness.tools.threads import run_file_change


class WriteParams(ToolParams):
    # OpenCode's names for these arguments (see ToolParams).
    input_aliases: ClassVar[Mapping[str, str]] = {"filePath": "path"}

    path: str = Field(description="File to write, absolute or relative to the working directory.")
    content: str = Field(description="The complete new content of the file.")


class WriteTool(Tool[WriteParams]):
    name = "write"
    description = (
        "Write a file, replacing it entirely if it exists. Missing parent directories are "
        "created.\n"
        "- The path may be absolute or relative to the working directory.\n"
        "- To change part of an existing file, use edit instead: it is cheaper and keeps the "
        "rest of the file intact.\n"
        "- Read an existing file before overwriting it."
    )
    params = WriteParams
    read_only = False

    def permissions(self, args: WriteParams, ctx: ToolContext) -> list[PermissionNeed]:
        return write_needs(resolve_path(args.path, ctx), ctx)

    def touched_paths(self, args: WriteParams, ctx: ToolContext) -> list[Path]:
        return [resolve_path(args.path, ctx)]

    def title(self, args: WriteParams) -> str:
        return f"write {args.path}"

    async def execute(self, args: WriteParams, ctx: ToolContext) -> ToolOutput:
        # In a worker thread, like grep and glob, and finished even on a cancel: see
        # harness/tools/threads.py for why.
        return await run_file_change(lambda: self._change(args, ctx))

    def _change(self, args: WriteParams, ctx: ToolContext) -> ToolOutput:
        path = resolve_path(args.path, ctx)
        shown = display_path(path, ctx)
        if path.is_dir():
            raise ToolFailure(f"Cannot write {shown}: it is a directory.")
        existed = path.exists()
        data = args.content.encode("utf-8")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Bytes, so the content lands exactly as given, with no newline translation.
            path.write_bytes(data)
        except OSError as e:
            raise ToolFailure(f"Cannot write {shown}: {e.strerror}") from None
        verb = "Overwrote" if existed else "Created"
        return ToolOutput(
            f"{verb} {shown} ({len(data)} bytes).",
            title=f"write {shown}",
            metadata={"created": not existed, "bytes": len(data)},
        )
