"""The chat's logic: what each event shows, what each typed line does, what Ctrl-C does.

It runs on the screen's asyncio loop, never blocks it (every backend call goes to a worker
thread) and knows nothing of prompt_toolkit: it talks to a ``Screen`` (print a block above
the input, show the live tail of the answer, set the input's prefix and the status line,
exit). The backend's events arrive through ``deliver`` from the backend's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from harness.commands.base import EXIT_CANCELLED, EXIT_ERROR, EXIT_OK
from harness.commands.chat import slash
from harness.commands.chat.backend import Backend, BackendError, ChatEvent
from harness.commands.chat.render import BlockSplitter, Renderer, clean_data, tool_line
from harness.commands.display import parse_answer, question_prompt, shape_answers, todo_lines

T = TypeVar("T")

PROMPT = "> "
ALLOW = "allow? [o]nce [a]lways [r]eject: "
ANSWER = "answer: "
QUIT_HINT = "(Ctrl-C again, Ctrl-D or /quit to leave)"
CANCELLING = "cancelling… (Ctrl-C again to quit)"


class Screen(Protocol):
    def print(self, text: str) -> None: ...
    def set_live(self, text: str) -> None: ...
    def set_prefix(self, text: str, waiting: bool) -> None:
        """The input's prefix; ``waiting``: a line is expected now (idle, or an ask)."""
        ...

    def set_status(self, text: str) -> None: ...
    def width(self) -> int: ...
    def exit(self, code: int) -> None: ...


@dataclass(frozen=True, slots=True)
class _Cleaned:
    """An event whose strings hold no control character (``render.clean``)."""

    type: str
    session_id: str
    data: dict[str, Any]


@dataclass
class _Ask:
    """A permission ask or a question set, waiting for the user's line(s)."""

    event: ChatEvent
    answers: list[str] = field(default_factory=list)  # questions answered so far

    @property
    def id(self) -> str:
        return str(self.event.data["id"])

    @property
    def is_permission(self) -> bool:
        return self.event.type == "permission.asked"


class Chat:
    def __init__(
        self,
        backend: Backend,
        screen: Screen,
        renderer: Renderer,
        session: dict[str, Any],
        *,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.backend = backend
        self.screen = screen
        self.renderer = renderer
        self.session = session
        self._loop = loop
        self._stop_follow: Callable[[], None] | None = None
        self._generation = 0  # events of a session we left are dropped
        self.turns: set[str] = set()  # our prompts whose turn has not finished
        self._streamed: dict[str, str] = {}  # text part id -> text shown so far
        self._finished_parts: set[str] = set()
        self._shown_tools: set[tuple[str, str]] = set()  # (part id, status): once each
        self._text_shown = False  # text of the running turn(s) reached the screen
        self._compactions: set[str] = set()  # turns that are a /compact
        self._sent_at: dict[str, float] = {}  # when each of our turns was sent
        self._splitter = BlockSplitter()
        self._between_blocks = False  # a block of the answer was printed, its gap not yet
        self._asks: deque[_Ask] = deque()
        self._armed = False  # a Ctrl-C since the last line sent: the next one quits
        self._sandbox_noticed = False
        # The user message the last /undo went back to: the next one goes further back,
        # until a new prompt is sent.
        self.undo_floor: str | None = None
        self.quitting = False

    # --- session --------------------------------------------------------------------------

    @property
    def session_id(self) -> str:
        return str(self.session["id"])

    @property
    def busy(self) -> bool:
        return bool(self.turns)

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """A blocking backend call in a worker thread: the screen stays live meanwhile."""
        return await self._loop.run_in_executor(None, fn, *args)

    async def switch(self, session: dict[str, Any]) -> None:
        """Follow ``session`` from now on; the old one's events stop reaching the screen."""
        if self._stop_follow is not None:
            self._stop_follow()
        self._generation += 1
        generation = self._generation
        self.session = session
        self.turns.clear()
        self._asks.clear()
        self.undo_floor = None
        self._splitter = BlockSplitter()
        self.screen.set_live("")

        def deliver(event: ChatEvent) -> None:
            self._loop.call_soon_threadsafe(self._on_event, generation, event)

        self._stop_follow = await self.call(self.backend.follow, self.session_id, deliver)
        self._refresh()

    def stop_following(self) -> None:
        if self._stop_follow is not None:
            self._stop_follow()
            self._stop_follow = None

    # --- the status line and the input's prefix -------------------------------------------

    def _refresh(self) -> None:
        session = self.session
        tokens = session.get("tokens") or {}
        total = sum(int(v) for v in tokens.values() if isinstance(v, int))
        state = "working" if self.busy else "ready"
        self.screen.set_status(
            f" {state} · {self.backend.mode} · {_short_model(str(session.get('model')))} · "
            f"{session.get('agent')} · {total:,} tokens · ${float(session.get('cost') or 0):.4f}"
        )
        waiting = bool(self._asks) or not self.busy
        if not self._asks:
            self.screen.set_prefix(PROMPT, waiting)
        elif self._asks[0].is_permission:
            self.screen.set_prefix(ALLOW, waiting)
        else:
            self.screen.set_prefix(ANSWER, waiting)

    def say(self, text: str) -> None:
        self.screen.print(text)

    def width(self) -> int:
        return self.screen.width()

    def markdown(self, text: str) -> None:
        self.screen.print(self.renderer.markdown(text, self.width()))

    # --- events ---------------------------------------------------------------------------

    def _on_event(self, generation: int, event: ChatEvent) -> None:
        if generation != self._generation or self.quitting:
            return
        handler = _HANDLERS.get(event.type)
        if handler is not None:
            handler(self, _Cleaned(event.type, event.session_id, clean_data(event.data)))
        self._refresh()

    def _flush_text(self) -> None:
        """Whatever of the answer is still live goes to the scrollback, rendered."""
        rest = self._splitter.flush()
        self.screen.set_live("")
        if rest.strip():
            self._gap()
            self.markdown(rest)
        self._between_blocks = False  # a tool line or the turn's end comes next

    def _gap(self) -> None:
        """The blank line between two blocks of an answer (each is rendered on its own,
        without the blank line that separated them)."""
        if self._between_blocks:
            self.say("")
            self._between_blocks = False

    def _blocks(self, text: str) -> None:
        for block in self._splitter.feed(text):
            self._gap()
            self.markdown(block)
            self._between_blocks = True
        if self._splitter.pending.strip():
            self._gap()

    def _on_delta(self, event: ChatEvent) -> None:
        data = event.data
        if event.session_id != self.session_id or data.get("field") != "text":
            return  # reasoning is not shown; a subtask's answer comes back as its result
        part_id = str(data.get("part_id"))
        if part_id in self._finished_parts:
            return
        delta = str(data.get("delta") or "")
        self._streamed[part_id] = self._streamed.get(part_id, "") + delta
        self._blocks(delta)
        self.screen.set_live(self._splitter.pending)
        self._text_shown = True

    def _on_part(self, event: ChatEvent) -> None:
        data = event.data
        kind = data.get("type")
        child = event.session_id != self.session_id
        if kind == "text" and not child and data.get("end") is not None:
            self._on_text_end(data)
        elif kind == "tool":
            status = str((data.get("state") or {}).get("status"))
            key = (str(data.get("id")), status)
            line = tool_line(data)
            if line is None or key in self._shown_tools:
                return
            self._shown_tools.add(key)
            self._flush_text()
            self.say(f"  {line}" if child else line)

    def _on_text_end(self, data: dict[str, Any]) -> None:
        """A text part ended: what the stream did not carry (a reconnect loses deltas)
        is shown from the stored text, then the tail is rendered."""
        part_id = str(data.get("id"))
        if part_id in self._finished_parts or data.get("synthetic"):
            return
        self._finished_parts.add(part_id)
        shown = self._streamed.pop(part_id, "")
        text = str(data.get("text") or "")
        if text.startswith(shown):
            self._blocks(text[len(shown):])
        self._flush_text()
        self._text_shown = True

    def _on_ask(self, event: ChatEvent) -> None:
        self._flush_text()
        ask = _Ask(event)
        if any(a.id == ask.id for a in self._asks):
            return
        self._asks.append(ask)
        if len(self._asks) == 1:
            self._show_ask(ask)

    def _show_ask(self, ask: _Ask) -> None:
        data = ask.event.data
        child = ask.event.session_id if ask.event.session_id != self.session_id else None
        if ask.is_permission:
            where = f" (session {child})" if child else ""
            tool = data.get("tool")
            by = f" by {tool}" if tool and tool != data["permission"] else ""
            self.say(
                f"? {data['permission']} '{data['pattern']}'{by}{where}"
                f" — [a]lways allows '{data['always']}'"
            )
        else:
            self.say(question_prompt(data, len(ask.answers), child).lstrip("\n"))

    def _on_answered(self, event: ChatEvent) -> None:
        """An ask answered elsewhere (another client, ``harness approve``) stops waiting."""
        answered = str(event.data.get("id"))
        was_shown = bool(self._asks) and self._asks[0].id == answered
        self._asks = deque(a for a in self._asks if a.id != answered)
        if was_shown:
            self.say(self.renderer.dim("(answered elsewhere)"))
            if self._asks:
                self._show_ask(self._asks[0])

    def _on_turn_finished(self, event: ChatEvent) -> None:
        data = event.data
        message_id = str(data.get("message_id"))
        if message_id not in self.turns:
            return
        self.turns.discard(message_id)
        self._flush_text()
        # A compaction's answer, or text the stream never carried, is shown whole.
        answer = str(data.get("answer") or "")
        if answer and (not self._text_shown or message_id in self._compactions):
            self.markdown(answer)
        self._compactions.discard(message_id)
        reason = data.get("reason")
        if reason == "error":
            self.say(f"harness: error: {data.get('error')}")
        elif reason not in ("answered", "cancelled"):
            detail = f": {data['error']}" if data.get("error") else ""
            self.say(f"harness: stopped ({reason}){detail}")
        elapsed = time.monotonic() - self._sent_at.pop(message_id, time.monotonic())
        self.say(self.renderer.dim(f"── {reason} · {elapsed:.1f} s"))
        if not self.turns:
            self._asks.clear()
            self._streamed.clear()  # parts a cancel cut never end

    def _on_session(self, event: ChatEvent) -> None:
        if event.data.get("id") == self.session_id:
            self.session = {**self.session, **event.data}

    def _on_todos(self, event: ChatEvent) -> None:
        self._flush_text()
        self.say(todo_lines(event.data.get("todos") or [], indent="  "))

    def _on_retry(self, event: ChatEvent) -> None:
        data = event.data
        wait = max(0.0, float(data.get("next", 0)) - time.time())
        attempt, error = data.get("attempt"), data.get("error")
        self.say(f"… provider error, retry {attempt} in {wait:.0f}s: {error}")

    def _on_sandbox(self, event: ChatEvent) -> None:
        if not self._sandbox_noticed:
            self._sandbox_noticed = True
            self.say(f"harness: {event.data.get('notice')}")

    def _on_lost(self, event: ChatEvent) -> None:
        self.say(f"harness: {event.data.get('error')}")
        self.quitting = True
        self.screen.exit(EXIT_ERROR)

    # --- input ----------------------------------------------------------------------------

    async def submit(self, line: str) -> None:
        """A line the user typed: an answer to the ask shown, a slash command, a prompt."""
        if self._asks:
            await self._answer(self._asks[0], line)
        elif line.strip().startswith("/"):
            self._echo(f"{PROMPT}{line.strip()}")
            await slash.run(self, line.strip())
        elif line.strip():
            self._armed = False
            self._echo(f"{PROMPT}{line}")
            await self.send(line)
        self._refresh()

    def _echo(self, line: str) -> None:
        """What was typed, kept above the input line (a terminal in cooked mode shows
        it already)."""
        if not getattr(self.screen, "echoes", False):
            self.say(line)

    async def send(self, text: str, *, compact: bool = False) -> None:
        from harness import new_message_id

        message_id = new_message_id()
        self.turns.add(message_id)  # before sending: its end may come before the answer
        self._text_shown = False
        self._sent_at[message_id] = time.monotonic()
        if not compact:
            self.undo_floor = None  # the next /undo undoes this turn
        if compact:
            self._compactions.add(message_id)
        self._refresh()
        send = self.backend.compact if compact else self.backend.prompt
        args = (self.session_id, message_id) if compact else (self.session_id, text, message_id)
        try:
            await self.call(send, *args)
        except BackendError as error:
            self.turns.discard(message_id)
            self.say(f"harness: {error}")

    async def _answer(self, ask: _Ask, line: str) -> None:
        data = ask.event.data
        if ask.is_permission:
            self._echo(f"{ALLOW}{line}")
            reply, message = parse_answer(line)
            self._asks.popleft()
            await self._settle(self.backend.reply_permission, ask.id, reply, message)
        else:
            questions = data["questions"]
            self._echo(f"{ANSWER}{line}")
            if not line.strip():
                self._asks.popleft()
                await self._settle(self.backend.reject_question, ask.id, None)
            else:
                ask.answers.append(line.strip())
                if len(ask.answers) < len(questions):
                    self._show_ask(ask)
                    return
                self._asks.popleft()
                await self._settle(
                    self.backend.answer_question, ask.id, shape_answers(questions, ask.answers)
                )
        if self._asks:
            self._show_ask(self._asks[0])

    async def _settle(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            await self.call(fn, *args)
        except BackendError as error:
            self.say(f"harness: {error}")

    async def interrupt(self, typed: str) -> bool:
        """Ctrl-C: clear the line typed; else cancel the turn; a second one quits.
        True when the chat should end."""
        if typed and not self.busy:
            return False  # the screen clears the line
        if self._armed:
            await self.quit()
            return True
        self._armed = True
        if self.busy:
            self._flush_text()
            self.say(CANCELLING)
            try:
                await self.call(self.backend.cancel, self.session_id)
            except BackendError as error:
                self.say(f"harness: {error}")
        else:
            self.say(self.renderer.dim(QUIT_HINT))
        return False

    async def quit(self, code: int | None = None) -> None:
        """Leave: a turn still running is cancelled first, so nothing goes on unseen."""
        if self.quitting:
            return
        self.quitting = True
        if self.busy:
            with contextlib.suppress(BackendError):
                await self.call(self.backend.cancel, self.session_id)
        self._flush_text()
        self.stop_following()
        self.screen.exit(code if code is not None else (EXIT_CANCELLED if self._armed else EXIT_OK))


def _short_model(model: str) -> str:
    """``scripted:/a/long/path/script.json`` as ``scripted:script.json``: the status line
    is one line."""
    kind, colon, path = model.partition(":")
    if colon and "/" in path and kind in ("scripted", "replay"):
        return f"{kind}:{path.rsplit('/', 1)[-1]}"
    return model


_HANDLERS: dict[str, Callable[[Chat, ChatEvent], None]] = {
    "part.delta": Chat._on_delta,
    "part.updated": Chat._on_part,
    "part.created": Chat._on_part,
    "permission.asked": Chat._on_ask,
    "question.asked": Chat._on_ask,
    "permission.replied": Chat._on_answered,
    "question.replied": Chat._on_answered,
    "question.rejected": Chat._on_answered,
    "turn.finished": Chat._on_turn_finished,
    "session.updated": Chat._on_session,
    "todo.updated": Chat._on_todos,
    "session.retry": Chat._on_retry,
    "sandbox.unavailable": Chat._on_sandbox,
    "chat.lost": Chat._on_lost,
}
