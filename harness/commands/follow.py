"""One follower for a turn, embedded or through the daemon: it shows each event, answers
permission asks and questions at the terminal, and ends with the turn's exit code.

The two modes differ only in where events come from and where replies go: an embedded run
reads the harness's feed (async, under Trio) and replies through ``Harness``; a run
through the daemon reads the daemon's event stream (blocking, standard library only) and
replies through ``harness.client``. The decisions (what to show, which ask to answer and
how, what a reply looks like) are ``TurnFollower``'s, the same in both.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import AsyncIterable, Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from harness import printable
from harness.commands.base import EXIT_CANCELLED, EXIT_ERROR
from harness.commands.display import Display, ask_at_terminal, parse_answer

if TYPE_CHECKING:
    from harness import Event, Harness
    from harness.client import Client, EventStream, WireEvent

CANCELLING = "\ncancelling… (Ctrl-C again to quit now)"


class Replies(Protocol):
    """Where the answers to asks and questions go."""

    def reply_permission(
        self, request_id: str, reply: str, message: str | None, *, no_terminal: bool
    ) -> None: ...

    def answer_question(self, request_id: str, answers: list[list[str]]) -> None: ...

    def reject_question(self, request_id: str, message: str | None = None) -> None: ...


class TurnFollower:
    """Follows one turn (``message_id``): its output, its answers, its exit code.

    ``interactive``: asks are put to the user at the terminal. ``unattended``: this
    client answers the asks nobody can (through the daemon; embedded, the harness's own
    actors do that by its Config): "once" to every ask with ``yes``, else a rejection
    that says why, printed as the embedded run prints it.
    """

    def __init__(
        self,
        view: Display,
        replies: Replies,
        message_id: str,
        *,
        interactive: bool,
        yes: bool = False,
        unattended: bool = False,
    ) -> None:
        self._view = view
        self._replies = replies
        self._message_id = message_id
        self._interactive = interactive
        self._yes = yes
        self._unattended = unattended
        self._asked: set[str] = set()
        self._rejected_calls: set[str] = set()

    def see(self, event: Event | WireEvent) -> int | None:
        """Show the event; the exit code when it ends the turn, else None."""
        if not self._already_shown(event):
            self._view.show(event)
        if event.type == "turn.finished" and event.data.get("message_id") == self._message_id:
            return self._view.finish(event)
        return None

    def needs_answer(self, event: Event | WireEvent) -> bool:
        """Whether ``answer`` must be called for this event (once per ask: a reconnect
        replays events)."""
        if event.type not in ("permission.asked", "question.asked"):
            return False
        if not (self._interactive or self._unattended) or event.data["id"] in self._asked:
            return False
        self._asked.add(event.data["id"])
        return True

    def answer(self, event: Event | WireEvent) -> None:
        """Answer an ask or a question; blocks while the user types."""
        if event.type == "permission.asked":
            self._answer_permission(event)
        else:
            self._answer_question(event)

    def _already_shown(self, event: Event | WireEvent) -> bool:
        """The error line of a call we rejected for lack of a terminal was printed already."""
        data = event.data
        return (
            not self._view.json
            and event.type == "part.updated"
            and data.get("call_id") in self._rejected_calls
            and data.get("state", {}).get("status") == "error"
        )

    def _answer_permission(self, event: Event | WireEvent) -> None:
        data = event.data
        message: str | None = None
        no_terminal = not self._interactive and not self._yes
        if self._yes:
            reply = "once"
        elif self._interactive:
            print(self._view.question(event), end="", file=sys.stderr, flush=True)
            reply, message = parse_answer(sys.stdin.readline())
        else:
            # Nobody to ask: reject at once, with the same words an embedded run prints.
            from harness import no_terminal_hint

            reply = "reject"
            self._rejected_calls.add(data["call_id"])
            if not self._view.json:
                hint = no_terminal_hint(data["permission"], data["always"])
                line = f"✗ {data['tool']}: the call was rejected: {hint}"
                print(printable(line, one_line=True), file=sys.stderr)
        self._replies.reply_permission(data["id"], reply, message, no_terminal=no_terminal)

    def _answer_question(self, event: Event | WireEvent) -> None:
        data = event.data
        if self._interactive:
            child = event.session_id if event.session_id != self._view.session_id else None
            answers = ask_at_terminal(data, child)
            if answers is None:
                self._replies.reject_question(data["id"])
            else:
                self._replies.answer_question(data["id"], answers)
            return
        # Nobody to ask: the call fails at once and the model carries on, as embedded.
        from harness import NO_TERMINAL

        self._rejected_calls.add(data["call_id"])
        if not self._view.json:
            line = f"✗ question: the question could not be asked: {NO_TERMINAL}"
            print(line, file=sys.stderr)
        self._replies.reject_question(data["id"], NO_TERMINAL)

    # --- the two feeds ------------------------------------------------------------------

    async def follow_feed(self, events: AsyncIterable[Event], nursery: Any) -> int:
        """Embedded: the harness's feed; each answer waits for the user in a thread, so
        the turn's other events keep coming meanwhile."""
        from functools import partial

        import trio

        from harness import with_queued

        async for first in events:
            for event in with_queued(first, events):
                code = self.see(event)
                if code is not None:
                    return code
                if self.needs_answer(event):
                    answer = partial(trio.to_thread.run_sync, self.answer, event)
                    nursery.start_soon(partial(answer, abandon_on_cancel=True))
        print("harness: the event stream ended before the answer", file=sys.stderr)
        return EXIT_ERROR

    def follow_stream(self, stream: EventStream, cancel: Callable[[], object]) -> int:
        """Through the daemon: its event stream, answered in line. Ctrl-C (or SIGTERM)
        calls ``cancel`` and follows the turn to its end; a second one returns at once."""
        signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM cancels like Ctrl-C, as embedded
        cancelled = False
        while True:
            try:
                for event in stream:
                    code = self.see(event)
                    if code is not None:
                        return code
                    if self.needs_answer(event):
                        self.answer(event)
            except KeyboardInterrupt:
                if cancelled:
                    return EXIT_CANCELLED
                cancelled = True
                print(CANCELLING, file=sys.stderr)
                cancel()
                stream.close()  # the read was cut mid-frame: resume from the last id


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


class HarnessReplies:
    """Replies of an embedded run: from the follower's thread into the harness's Trio run."""

    def __init__(self, h: Harness) -> None:
        self._h = h

    def reply_permission(
        self, request_id: str, reply: str, message: str | None, *, no_terminal: bool
    ) -> None:
        import trio

        # parse_answer gives only the replies the harness takes: once, always, reject.
        trio.from_thread.run(self._h.reply_permission, request_id, reply, message)  # type: ignore[arg-type]

    def answer_question(self, request_id: str, answers: list[list[str]]) -> None:
        import trio

        trio.from_thread.run(self._h.answer_question, request_id, answers)

    def reject_question(self, request_id: str, message: str | None = None) -> None:
        import trio

        trio.from_thread.run(self._h.reject_question, request_id, message)


class ClientReplies:
    """Replies through the daemon; an ask someone else answered first is no error."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def reply_permission(
        self, request_id: str, reply: str, message: str | None, *, no_terminal: bool
    ) -> None:
        with _answered_elsewhere():
            self._client.reply_permission(request_id, reply, message, no_terminal=no_terminal)

    def answer_question(self, request_id: str, answers: list[list[str]]) -> None:
        with _answered_elsewhere():
            self._client.answer_question(request_id, answers)

    def reject_question(self, request_id: str, message: str | None = None) -> None:
        with _answered_elsewhere():
            self._client.reject_question(request_id, message)


@contextlib.contextmanager
def _answered_elsewhere() -> Iterator[None]:
    from harness.client import ApiError

    try:
        yield
    except ApiError as error:
        if error.status != 404:  # 404: someone else answered it first
            raise
