"""How the chat's output looks: streamed answers cut into blocks, Markdown rendered with
rich where the terminal allows it, one line per tool step.

Streaming text cannot be rendered as Markdown piece by piece (a ``**`` or a code fence
changes what came before it), so the answer is cut into blocks, a block ending at a blank
line outside a code fence: a finished block is rendered once and goes to the scrollback;
the unfinished tail is shown as typed, live, above the input line. rich is imported on
the first block rendered, never by ``harness --help``.
"""

from __future__ import annotations

import io
import os
import re
from typing import Any

from harness import printable, printable_data
from harness.commands.display import tool_summary

_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the styles rich writes

# What the model, a tool or a file wrote is shown, never obeyed: one helper for every
# command that prints such text (harness/terminal_text.py).
clean = printable
clean_data = printable_data


def wants_plain(term: str | None = None, no_color: str | None = None, tty: bool = True) -> bool:
    """Plain text, no escape sequences: ``TERM=dumb``, ``NO_COLOR`` (no-color.org: any
    non-empty value) or an output that is not a terminal."""
    term = os.environ.get("TERM", "") if term is None else term
    no_color = os.environ.get("NO_COLOR", "") if no_color is None else no_color
    return not tty or term in ("", "dumb") or bool(no_color)


class BlockSplitter:
    """Streamed text in, finished Markdown blocks out."""

    def __init__(self) -> None:
        self._pending = ""
        self._scanned = 0  # where the first line not yet looked at starts, in _pending
        self._fenced = False  # inside a ``` fence: blank lines do not end the block

    @property
    def pending(self) -> str:
        """The unfinished tail: shown live, never rendered."""
        return self._pending

    def feed(self, text: str) -> list[str]:
        """Add streamed text; the blocks it finished, in order."""
        self._pending += text
        blocks: list[str] = []
        start = 0  # of the block being gathered
        position = self._scanned
        while True:
            newline = self._pending.find("\n", position)
            if newline < 0:
                break  # the last piece has no newline yet: it is still being written
            line = self._pending[position:newline]
            if line.lstrip().startswith(("```", "~~~")):
                self._fenced = not self._fenced
            elif not line.strip() and not self._fenced:
                block = self._pending[start:position]
                if block.strip():
                    blocks.append(block)
                start = newline + 1
            position = newline + 1
        self._pending = self._pending[start:]
        self._scanned = position - start
        return blocks

    def flush(self) -> str:
        """The rest, when the text part ended: a block of its own."""
        rest, self._pending, self._fenced, self._scanned = self._pending, "", False, 0
        return rest


class Renderer:
    """Markdown to what the terminal shows: ANSI from rich, or the text itself."""

    def __init__(self, *, plain: bool) -> None:
        self.plain = plain

    def markdown(self, text: str, width: int) -> str:
        if self.plain or not text.strip():
            return text.rstrip("\n")
        from rich.console import Console
        from rich.markdown import Markdown

        out = io.StringIO()
        console = Console(
            file=out, force_terminal=True, width=max(20, width), color_system="256", soft_wrap=False
        )
        console.print(Markdown(text.strip("\n")), end="")
        lines = out.getvalue().split("\n")
        # rich pads a block with blank lines of its own; the chat puts one between blocks.
        while lines and not _ANSI.sub("", lines[-1]).strip():
            lines.pop()
        while lines and not _ANSI.sub("", lines[0]).strip():
            lines.pop(0)
        return "\n".join(lines)

    def diff(self, text: str, width: int) -> str:
        if self.plain or not text:
            return text.rstrip("\n")
        colours = {"+": "\x1b[32m", "-": "\x1b[31m", "@": "\x1b[36m"}
        lines = []
        for line in text.rstrip("\n").split("\n"):
            colour = colours.get(line[:1]) if not line.startswith(("+++", "---")) else "\x1b[1m"
            lines.append(f"{colour}{line}\x1b[0m" if colour else line)
        return "\n".join(lines)

    def dim(self, text: str) -> str:
        return text if self.plain else f"\x1b[2m{text}\x1b[0m"


def tool_line(data: dict[str, Any]) -> str | None:
    """One line for a tool part's change, or None when this state shows nothing.

    ``→ bash pytest -x`` when it starts, ``✓ bash (exit 1, 23 lines)`` when it ends,
    ``✗ bash: <the first line of the error>`` when it fails.
    """
    state = data.get("state") or {}
    tool = str(data.get("tool", "?"))
    status = state.get("status")
    if status == "running":
        title = str(state.get("title") or "").strip()
        shown = title if title == tool or title.startswith(tool + " ") else f"{tool} {title}"
        return f"→ {shown.strip()}"
    if status == "completed":
        metadata = state.get("metadata") or {}
        summary = tool_summary(state)
        if "exit" in metadata:
            output = str(state.get("output") or "")
            count = output.count("\n") + 1 if output.strip() else 0
            summary = f"exit {metadata['exit']}, {count} lines"
        return f"✓ {tool} ({summary})"
    if status == "error":
        first = str(state.get("error", "")).splitlines()[:1]
        return f"✗ {tool}: {first[0] if first else 'error'}"
    return None
