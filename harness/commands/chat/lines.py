"""The chat on a terminal that cannot be drawn on (``TERM=dumb``, an editor's shell
buffer): plain lines in, plain text out, no escape sequence ever written.

The terminal stays in cooked mode, so the kernel does the line editing and Ctrl-C is
SIGINT: the asyncio loop takes it (``add_signal_handler``) and hands it to the chat, which
decides as on the full screen. Lines are read by a thread (a blocking ``readline``), and
the streamed answer is written as it arrives, no live area needed.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any


class LineScreen:
    """``conversation.Screen`` on plain lines."""

    echoes = True  # the kernel shows what is typed: the chat does not repeat it

    def __init__(self) -> None:
        self._live_written = ""  # the live tail already on the terminal
        self._prefix = "> "
        self._prompted = False  # the prefix is on the terminal, waiting for a line
        self._done: asyncio.Future[int] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.on_line: Callable[[str], Awaitable[None]] | None = None
        self.on_interrupt: Callable[[str], Awaitable[bool]] | None = None
        self.on_eof: Callable[[], Awaitable[None]] | None = None

    def _write(self, text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    def _clear_prompt(self) -> None:
        if self._prompted:
            self._write("\n")
            self._prompted = False

    def print(self, text: str) -> None:
        if self._live_written and text.startswith(self._live_written):
            # The block was being written live: only its end is missing.
            self._write(text[len(self._live_written):] + "\n")
        else:
            if self._live_written:
                self._write("\n")
            self._clear_prompt()
            self._write(text + "\n")
        self._live_written = ""

    def set_live(self, text: str) -> None:
        if not text:
            return  # a flush: the block that follows carries the rest
        self._clear_prompt()
        if not text.startswith(self._live_written):
            self._write("\n")
            self._live_written = ""
        self._write(text[len(self._live_written):])
        self._live_written = text

    def set_prefix(self, text: str, waiting: bool) -> None:
        if waiting and (not self._prompted or text != self._prefix) and not self._live_written:
            self._write(("\n" if self._prompted else "") + text)
            self._prompted = True
        self._prefix = text

    def set_status(self, text: str) -> None:
        pass  # no status line on a plain terminal: /cost tells the same

    def width(self) -> int:
        return shutil.get_terminal_size().columns

    def exit(self, code: int) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_result(code)

    def _spawn(self, work: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _line(self, line: str | None) -> None:
        self._prompted = False
        if line is None:
            if self.on_eof is not None:
                self._spawn(self.on_eof())
        elif self.on_line is not None:
            self._spawn(self.on_line(line.rstrip("\n")))

    def _interrupt(self) -> None:
        self._prompted = False
        self._write("\n")
        if self.on_interrupt is not None:
            self._spawn(self.on_interrupt(""))

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        self._done = loop.create_future()
        loop.add_signal_handler(signal.SIGINT, self._interrupt)

        def read() -> None:
            while True:
                line = sys.stdin.readline()
                loop.call_soon_threadsafe(self._line, line or None)
                if not line:
                    return

        threading.Thread(target=read, daemon=True, name="chat-lines").start()
        try:
            return await self._done
        finally:
            loop.remove_signal_handler(signal.SIGINT)
