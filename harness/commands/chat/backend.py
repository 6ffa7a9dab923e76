"""Where a chat's sessions live: the daemon, or a harness embedded in this process.

The chat's screen runs prompt_toolkit on asyncio in the main thread; the backend is
called from worker threads with blocking calls, so both kinds look the same to it:

- ``DaemonBackend``: the standard-library client (``harness.client``); each call is one
  HTTP request on the socket, and a thread reads the session's event stream.
- ``EmbeddedBackend``: Trio runs ``open_harness`` in a thread of its own, and each call
  crosses into it with ``trio.from_thread``. Trio is not in the main thread, so it
  installs no SIGINT handler: Ctrl-C is the screen's key (the terminal is in raw mode),
  and a turn is cancelled through ``cancel``, as through the daemon.

Events reach the screen through the ``on_event`` callback, called from the backend's
thread; it must be thread-safe (the screen hops onto its own loop).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from harness import EventLike

if TYPE_CHECKING:
    from harness import Config, Harness
    from harness.client import Client, EventStream


# What both kinds of event have: ``harness.Event`` and ``harness.client.WireEvent``.
ChatEvent = EventLike
OnEvent = Callable[[ChatEvent], None]


class BackendError(Exception):
    """A request the backend refused (unknown session, busy, conflict): shown as one line.
    ``code`` is the daemon's error code, when it was the daemon."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


class Backend(Protocol):
    """Blocking calls, safe from any thread but the screen's."""

    mode: str  # "daemon" or "embedded", for the status line

    def create_session(
        self, directory: str, model: str | None, agent: str | None
    ) -> dict[str, Any]: ...
    def session(self, session_id: str) -> dict[str, Any]: ...
    def sessions(self) -> list[dict[str, Any]]: ...
    def messages(self, session_id: str) -> list[dict[str, Any]]: ...
    def update_session(
        self, session_id: str, *, model: str | None = None, agent: str | None = None
    ) -> dict[str, Any]: ...
    def prompt(self, session_id: str, text: str, message_id: str) -> str: ...
    def compact(self, session_id: str, message_id: str) -> str: ...
    def cancel(self, session_id: str) -> bool: ...
    def reply_permission(self, request_id: str, reply: str, message: str | None) -> None: ...
    def answer_question(self, request_id: str, answers: list[list[str]]) -> None: ...
    def reject_question(self, request_id: str, message: str | None = None) -> None: ...
    def diff(self, session_id: str) -> dict[str, Any]: ...
    def revert(self, session_id: str, message_id: str) -> dict[str, Any]: ...
    def follow(self, session_id: str, on_event: OnEvent) -> Callable[[], None]:
        """Deliver the session's events (its children's included) from now on, until the
        returned function is called. Returns once subscribed: nothing after is missed."""
        ...

    def close(self) -> None: ...


# --- through the daemon --------------------------------------------------------------------


class DaemonBackend:
    mode = "daemon"

    def __init__(self, client: Client) -> None:
        self._client = client

    def _call(self, call: Callable[[], Any]) -> Any:
        from harness.client import ApiError

        try:
            return call()
        except ApiError as error:
            if error.status == 404 and error.code == "not_found" and "no pending" in error.message:
                return None  # an ask someone else answered first
            raise BackendError(error.message, error.code) from error

    def create_session(
        self, directory: str, model: str | None, agent: str | None
    ) -> dict[str, Any]:
        answer: dict[str, Any] = self._call(
            lambda: self._client.create_session(directory=directory, model=model, agent=agent)
        )
        return answer

    def session(self, session_id: str) -> dict[str, Any]:
        answer: dict[str, Any] = self._call(lambda: self._client.session(session_id))
        return answer

    def sessions(self) -> list[dict[str, Any]]:
        answer: list[dict[str, Any]] = self._call(self._client.sessions)
        return answer

    def messages(self, session_id: str) -> list[dict[str, Any]]:
        answer: list[dict[str, Any]] = self._call(lambda: self._client.messages(session_id))
        return answer

    def update_session(
        self, session_id: str, *, model: str | None = None, agent: str | None = None
    ) -> dict[str, Any]:
        answer: dict[str, Any] = self._call(
            lambda: self._client.update_session(session_id, model=model, agent=agent)
        )
        return answer

    def prompt(self, session_id: str, text: str, message_id: str) -> str:
        return str(self._call(lambda: self._client.prompt(session_id, text, message_id=message_id)))

    def compact(self, session_id: str, message_id: str) -> str:
        return str(self._call(lambda: self._client.compact(session_id, message_id=message_id)))

    def cancel(self, session_id: str) -> bool:
        return bool(self._call(lambda: self._client.cancel(session_id)))

    def reply_permission(self, request_id: str, reply: str, message: str | None) -> None:
        self._call(lambda: self._client.reply_permission(request_id, reply, message))

    def answer_question(self, request_id: str, answers: list[list[str]]) -> None:
        self._call(lambda: self._client.answer_question(request_id, answers))

    def reject_question(self, request_id: str, message: str | None = None) -> None:
        self._call(lambda: self._client.reject_question(request_id, message))

    def diff(self, session_id: str) -> dict[str, Any]:
        answer: dict[str, Any] = self._call(lambda: self._client.diff(session_id))
        return answer

    def revert(self, session_id: str, message_id: str) -> dict[str, Any]:
        answer: dict[str, Any] = self._call(lambda: self._client.revert(session_id, message_id))
        return answer

    def follow(self, session_id: str, on_event: OnEvent) -> Callable[[], None]:
        # From the ledger's current end, subscribed before returning: the next prompt's
        # events all arrive, and a reconnect replays what a drop lost.
        stream = self._client.events(session_id, after=self._client.health()["last_seq"])
        stream.open()
        stopped = threading.Event()
        reader = threading.Thread(
            target=_read_stream, args=(stream, on_event, stopped), daemon=True, name="chat-events"
        )
        reader.start()

        def stop() -> None:
            stopped.set()
            _shut(stream)

        return stop

    def close(self) -> None:
        pass


def _read_stream(stream: EventStream, on_event: OnEvent, stopped: threading.Event) -> None:
    from harness.client import DaemonUnavailable

    try:
        for event in stream:
            if stopped.is_set():
                return
            on_event(event)
    except (DaemonUnavailable, OSError, ValueError) as error:
        if not stopped.is_set():
            on_event(_Lost(stream.session_id or "", {"error": str(error)}))


def _shut(stream: EventStream) -> None:
    """Wake the reader blocked in ``readline`` (a plain close does not, on Linux)."""
    import socket

    connection = getattr(stream, "_connection", None)
    sock = getattr(connection, "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


class _Lost:
    """The stream gave up reconnecting: the screen says so."""

    type = "chat.lost"

    def __init__(self, session_id: str, data: dict[str, Any]) -> None:
        self.session_id = session_id
        self.data = data


# --- embedded ------------------------------------------------------------------------------


class EmbeddedBackend:
    """A harness opened in a Trio thread for as long as the chat lasts."""

    mode = "embedded"

    def __init__(self, config: Config) -> None:
        self._config = config
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._h: Harness | None = None
        self._token: Any = None
        self._nursery: Any = None
        self._done: Any = None
        self._listeners: list[OnEvent] = []  # told when the harness stops by itself
        self._thread = threading.Thread(target=self._main, name="chat-harness", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            raise self._failure

    def _main(self) -> None:
        import trio

        async def run() -> None:
            from harness import open_harness

            self._done = trio.Event()
            async with open_harness(self._config) as h, trio.open_nursery() as nursery:
                self._h, self._nursery = h, nursery
                self._token = trio.lowlevel.current_trio_token()
                self._ready.set()
                await self._done.wait()
                nursery.cancel_scope.cancel()

        try:
            trio.run(run)
        except BaseException as error:  # shown by the command as any error of the harness
            if not self._ready.is_set():
                self._failure = error  # it never opened: the command reports why
            else:  # it stopped under the chat (a ledger that cannot be written...)
                from harness.commands.base import leaves

                reason = leaves(error)[0]
                for listener in self._listeners:
                    listener(_Lost("", {"error": f"the harness stopped: {reason}"}))
        finally:
            self._ready.set()

    def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        import trio

        from harness import HarnessError, RevertConflict, SessionBusy, SnapshotError

        try:
            return trio.from_thread.run(fn, *args, trio_token=self._token)
        except (HarnessError, SessionBusy, RevertConflict, SnapshotError) as error:
            raise BackendError(str(error)) from error
        except trio.RunFinishedError as error:
            raise BackendError("the harness has stopped") from error

    @property
    def h(self) -> Harness:
        assert self._h is not None
        return self._h

    def create_session(
        self, directory: str, model: str | None, agent: str | None
    ) -> dict[str, Any]:
        from harness import ProviderError, UnknownAgentError

        async def create() -> dict[str, Any]:
            try:
                session = await self.h.create_session(
                    directory, model=model, agent=agent, base_url=self._config.base_url
                )
            except (UnknownAgentError, ProviderError) as error:
                from harness import HarnessError

                raise HarnessError(str(error)) from error
            return session.model_dump(mode="json")

        answer: dict[str, Any] = self._run(create)
        return answer

    def session(self, session_id: str) -> dict[str, Any]:
        async def get() -> dict[str, Any]:
            return self.h.session(session_id).model_dump(mode="json")

        answer: dict[str, Any] = self._run(get)
        return answer

    def sessions(self) -> list[dict[str, Any]]:
        async def listed() -> list[dict[str, Any]]:
            return [s.model_dump(mode="json") for s in self.h.sessions()]

        answer: list[dict[str, Any]] = self._run(listed)
        return answer

    def messages(self, session_id: str) -> list[dict[str, Any]]:
        async def listed() -> list[dict[str, Any]]:
            return [m.model_dump(mode="json") for m in await self.h.messages(session_id)]

        answer: list[dict[str, Any]] = self._run(listed)
        return answer

    def update_session(
        self, session_id: str, *, model: str | None = None, agent: str | None = None
    ) -> dict[str, Any]:
        from harness import ProviderError, UnknownAgentError

        async def update() -> dict[str, Any]:
            try:
                session = await self.h.update_session(session_id, model=model, agent=agent)
            except (UnknownAgentError, ProviderError) as error:
                from harness import HarnessError

                raise HarnessError(str(error)) from error
            return session.model_dump(mode="json")

        answer: dict[str, Any] = self._run(update)
        return answer

    def prompt(self, session_id: str, text: str, message_id: str) -> str:
        async def send() -> str:
            return await self.h.prompt(session_id, text, message_id=message_id)

        return str(self._run(send))

    def compact(self, session_id: str, message_id: str) -> str:
        async def send() -> str:
            return await self.h.compact(session_id, message_id=message_id)

        return str(self._run(send))

    def cancel(self, session_id: str) -> bool:
        return bool(self._run(self.h.cancel, session_id))

    def reply_permission(self, request_id: str, reply: str, message: str | None) -> None:
        self._run(self.h.reply_permission, request_id, reply, message)

    def answer_question(self, request_id: str, answers: list[list[str]]) -> None:
        self._run(self.h.answer_question, request_id, answers)

    def reject_question(self, request_id: str, message: str | None = None) -> None:
        self._run(self.h.reject_question, request_id, message)

    def diff(self, session_id: str) -> dict[str, Any]:
        async def diff() -> dict[str, Any]:
            text, files = await self.h.diff(session_id)
            return {"session_id": session_id, "files": files, "diff": text}

        answer: dict[str, Any] = self._run(diff)
        return answer

    def revert(self, session_id: str, message_id: str) -> dict[str, Any]:
        async def revert() -> dict[str, Any]:
            return (await self.h.revert(session_id, message_id)).to_dict()

        answer: dict[str, Any] = self._run(revert)
        return answer

    def follow(self, session_id: str, on_event: OnEvent) -> Callable[[], None]:
        import trio

        async def start() -> trio.CancelScope:
            return await self._nursery.start(self._follow, session_id, on_event)  # type: ignore[no-any-return]

        scope: trio.CancelScope = self._run(start)
        self._listeners.append(on_event)

        def stop() -> None:
            with contextlib.suppress(ValueError):
                self._listeners.remove(on_event)
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(scope.cancel, trio_token=self._token)

        return stop

    async def _follow(self, session_id: str, on_event: OnEvent, *, task_status: Any) -> None:
        import trio

        with trio.CancelScope() as scope:
            async with self.h.follow(session_id) as events:
                task_status.started(scope)
                async for event in events:
                    on_event(event)

    def close(self) -> None:
        """Stop the harness: a turn still running was cancelled by the screen first."""
        import trio

        if self._done is not None:
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._done.set, trio_token=self._token)
        self._thread.join(timeout=30)
