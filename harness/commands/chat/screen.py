"""The chat's terminal: an input line with editing and history, the live tail of the
answer above it and a status line below, on prompt_toolkit.

Why prompt_toolkit, and where it runs: it is the well-kept line editor of Python (IPython,
pgcli, aws-cli use it), with history files, Emacs/Vi keys, wide characters and resizes
handled, and an asyncio application model that keeps the input live while output
arrives, which ``readline`` cannot do. It owns the main thread and its asyncio loop; the
harness side runs elsewhere (``backend``: Trio in a thread of its own, or the blocking
daemon client in worker threads), so neither event loop ever waits on the other. The
terminal is in raw mode while it runs: Ctrl-C is a key here, not SIGINT, so a Ctrl-C
cancels the turn through the backend exactly as the chat decides, in both modes.

Finished output goes to the terminal's scrollback through ``run_in_terminal`` (one batch
per loop turn), so a long answer scrolls and can be copied like any command's output.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from prompt_toolkit.application import Application, run_in_terminal
from prompt_toolkit.buffer import Buffer
from prompt_toolkit.completion import CompleteEvent, Completer, Completion
from prompt_toolkit.document import Document
from prompt_toolkit.filters import Condition
from prompt_toolkit.formatted_text import ANSI, StyleAndTextTuples
from prompt_toolkit.history import FileHistory
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from prompt_toolkit.layout import HSplit, Layout, Window
from prompt_toolkit.layout.containers import ConditionalContainer
from prompt_toolkit.layout.controls import BufferControl, FormattedTextControl
from prompt_toolkit.layout.dimension import Dimension
from prompt_toolkit.layout.processors import BeforeInput
from prompt_toolkit.styles import Style

HISTORY_PREFIX = "> "  # lines typed at this prefix (prompts, commands) go to the history
INPUT_LINES = 8  # a prompt of several lines (Esc Enter) grows the input up to this
LIVE_LINES = 12  # at most this many lines of the unfinished answer are shown live


class _SlashCompleter(Completer):
    """Tab on ``/he`` gives ``/help``; nothing else is completed."""

    def __init__(self, commands: Sequence[str]) -> None:
        self._commands = commands

    def get_completions(
        self, document: Document, complete_event: CompleteEvent
    ) -> Iterable[Completion]:
        typed = document.text_before_cursor
        if not typed.startswith("/") or " " in typed:
            return
        for command in self._commands:
            if command.startswith(typed):
                yield Completion(command, start_position=-len(typed))


def live_tail(text: str, width: int, rows: int) -> str:
    """The end of ``text`` that fills at most ``rows`` terminal rows of ``width``: a long
    paragraph streams as one line, and drawing all of it each frame would cost more the
    longer the answer grows (wide characters count as one: a row too many at worst)."""
    width = max(1, width)
    kept: list[str] = []
    left = rows
    for line in reversed(text.split("\n")):
        needed = max(1, -(-len(line) // width))
        if needed >= left:
            if line:
                cut = len(line) - left * width
                kept.append(line[max(0, cut + (-cut % width if cut > 0 else 0)) :])
            else:
                kept.append(line)
            break
        kept.append(line)
        left -= needed
    return "\n".join(reversed(kept))


class PromptScreen:
    """``conversation.Screen`` on a prompt_toolkit application."""

    def __init__(
        self, history_file: Path, *, plain: bool, commands: Sequence[str] = ()
    ) -> None:
        self._plain = plain
        self._prefix = "> "
        self._status = ""
        self._live = ""
        self._pending: list[str] = []
        self._flushing = False
        self._code = 0
        self._tasks: set[asyncio.Task[Any]] = set()  # kept alive until done
        self.on_line: Callable[[str], Awaitable[None]] | None = None
        self.on_interrupt: Callable[[str], Awaitable[bool]] | None = None
        self.on_eof: Callable[[], Awaitable[None]] | None = None
        self.buffer = Buffer(
            history=FileHistory(str(history_file)),
            multiline=False,
            accept_handler=self._accept,
            completer=_SlashCompleter(commands),
            complete_while_typing=False,  # Tab completes a /command
        )
        live = Window(
            FormattedTextControl(self._live_text), wrap_lines=True, dont_extend_height=True
        )
        line = Window(
            BufferControl(self.buffer, input_processors=[BeforeInput(lambda: self._prefix)]),
            height=Dimension(min=1, max=INPUT_LINES),
            dont_extend_height=True,
            wrap_lines=True,
        )
        status = Window(
            FormattedTextControl(self._status_text), height=1, style="class:status"
        )
        self.app: Application[int] = Application(
            layout=Layout(
                HSplit(
                    [ConditionalContainer(live, Condition(lambda: bool(self._live))), line, status]
                ),
                focused_element=line,
            ),
            key_bindings=self._keys(),
            style=Style.from_dict({"status": "reverse"}),
            full_screen=False,
            erase_when_done=False,
            mouse_support=False,
        )

    # --- conversation.Screen ----------------------------------------------------------------

    def print(self, text: str) -> None:
        self._pending.append(text)
        if not self._flushing:
            self._flushing = True
            asyncio.get_running_loop().call_soon(self._schedule_flush)

    def set_live(self, text: str) -> None:
        if text != self._live:
            self._live = text
            self.app.invalidate()

    def set_prefix(self, text: str, waiting: bool) -> None:
        if text != self._prefix:
            self._prefix = text
            self.app.invalidate()

    def set_status(self, text: str) -> None:
        if text != self._status:
            self._status = text
            self.app.invalidate()

    def width(self) -> int:
        try:
            return self.app.output.get_size().columns
        except OSError:
            return 80

    def exit(self, code: int) -> None:
        self._code = code
        # Whatever is still to print goes first, then the application ends.
        asyncio.get_running_loop().call_soon(self._exit_after_flush)

    # --- running ----------------------------------------------------------------------------

    async def run(self) -> int:
        await self.app.run_async()
        return self._code

    def _exit_after_flush(self) -> None:
        if self._pending or self._flushing:
            asyncio.get_running_loop().call_later(0.01, self._exit_after_flush)
            return
        if self.app.is_running and not self.app.future.done():  # type: ignore[union-attr]
            self.app.exit(result=self._code)

    def _schedule_flush(self) -> None:
        if not self.app.is_running:
            self._write(sys.stdout.write)
            sys.stdout.flush()
            self._flushing = False
            return
        self._spawn(self._flush())

    async def _flush(self) -> None:
        try:
            await run_in_terminal(lambda: self._write(sys.stdout.write))
        finally:
            self._flushing = False
            if self._pending:  # printed while the batch was written: the next batch
                self._flushing = True
                asyncio.get_running_loop().call_soon(self._schedule_flush)

    def _write(self, write: Callable[[str], Any]) -> None:
        batch, self._pending = self._pending, []
        for text in batch:
            write(text + "\n")
        sys.stdout.flush()

    def _status_text(self) -> str:
        # One line, never wrapped: the right end is cut, the state at the left stays.
        return self._status[: max(1, self.width() - 1)]

    def _live_text(self) -> StyleAndTextTuples | ANSI:
        return [("", live_tail(self._live, self.width(), LIVE_LINES))]

    # --- keys -------------------------------------------------------------------------------

    def _spawn(self, work: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _accept(self, buffer: Buffer) -> bool:
        text = buffer.text
        if self.on_line is not None:
            self._spawn(self.on_line(text))
        return False  # the buffer is reset, the line kept in the history

    def _keys(self) -> KeyBindings:
        keys = KeyBindings()

        @keys.add("c-c")
        def _interrupt(event: KeyPressEvent) -> None:
            typed = self.buffer.text
            if typed:
                self.buffer.reset()
            if self.on_interrupt is not None:
                self._spawn(self.on_interrupt(typed))

        @keys.add("enter", filter=Condition(lambda: self._prefix != HISTORY_PREFIX))
        def _answer(event: KeyPressEvent) -> None:
            # An answer to an ask ("o", a number) is not worth a place in the history.
            text = self.buffer.text
            self.buffer.reset()
            if self.on_line is not None:
                self._spawn(self.on_line(text))

        @keys.add("escape", "enter")
        def _newline(event: KeyPressEvent) -> None:
            # Enter sends; Esc Enter (Alt-Enter) starts a new line of the prompt.
            self.buffer.insert_text("\n")

        @keys.add("c-d")
        def _eof(event: KeyPressEvent) -> None:
            if self.buffer.text:
                self.buffer.delete()
            elif self.on_eof is not None:
                self._spawn(self.on_eof())

        return keys
