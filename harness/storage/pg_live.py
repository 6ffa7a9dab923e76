"""Live events across daemons of a shared PostgreSQL ledger (DESIGN §14).

Streaming deltas (``part.delta``) and retry notices (``session.retry``) are not ledger
events: only the daemon that runs a session makes them. A subscriber on another daemon
(``harness run`` through daemon B of a session that daemon A runs) would see the text
only once the part is stored. So each daemon:

- records in ``watchers`` which sessions it has a live subscriber for (``'*'``: every
  session), with the channel it hears live events on, and says so on the watch channel
  (``+``/``-``), so the daemons running those sessions know at once, with no query;
- sends a live event of a session only to the channels of the daemons watching that
  session (or one of its ancestors, or ``'*'``), with ``pg_notify``, in batches of at
  most ``PAYLOAD_BYTES``; a delta longer than that is cut into several;
- hears its own channel on the LISTEN connection and publishes what it hears to its feed.

When no other daemon watches, the feed's cost per delta is one test of an empty dict:
nothing is encoded, queued or sent. Rows are renewed every ``lease_seconds / 3`` while a
daemon has subscribers; those of a daemon that died lapse after ``lease_seconds`` and
are dropped by the others on their next renewal. A relayed delta may arrive before its
part's ``part.created`` or, from a slow sender, after the part ended; the feed drops the
latter (the stored part holds that text already).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import threading
import zlib
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import structlog
import trio

from harness.messages.events import Event
from harness.messages.mailbox import FeedMessage, Publish

if TYPE_CHECKING:
    import psycopg

log = structlog.get_logger("harness.ledger")

T = TypeVar("T")

# PostgreSQL refuses a NOTIFY payload of 8,000 bytes or more (its default page size):
# what is sent stays under it, with room for the list's brackets and commas.
PAYLOAD_BYTES = 7900
RELAYED_TYPES = frozenset({"part.delta", "session.retry"})
_QUEUE = 4096  # live events waiting to be sent; beyond that they are dropped (not durable)
_BATCH = 512  # events one round of sending takes at most
_NOTES_PER_STATEMENT = 256  # notifications per statement (two parameters each)
ALL = "*"


def _split(item: list[Any]) -> list[str]:
    """One live event as encoded items each under ``PAYLOAD_BYTES``; a long delta is cut
    in pieces (their concatenation is the delta); anything else too long is dropped."""
    text = json.dumps(item, ensure_ascii=False, separators=(",", ":"))
    if len(text.encode()) < PAYLOAD_BYTES:
        return [text]
    data = item[3]
    delta = data.get("delta") if item[1] == "part.delta" else None
    if not isinstance(delta, str) or len(delta) < 2:
        log.warning("live event too long to relay", type=item[1], size=len(text))
        return []
    middle = len(delta) // 2
    if "\udc00" <= delta[middle] <= "\udfff":  # never between a surrogate pair's halves
        middle += 1
    return [
        *_split([item[0], item[1], item[2], {**data, "delta": delta[:middle]}]),
        *_split([item[0], item[1], item[2], {**data, "delta": delta[middle:]}]),
    ]


def payloads(events: Iterable[Event]) -> list[str]:
    """Events as ``pg_notify`` payloads, in order, each a JSON list under the limit."""
    out: list[str] = []
    current: list[str] = []
    size = 2
    for event in events:
        for item in _split([event.ts, event.type, event.session_id, event.data]):
            length = len(item.encode()) + 1
            if current and size + length > PAYLOAD_BYTES:
                out.append(f"[{','.join(current)}]")
                current, size = [], 2
            current.append(item)
            size += length
    if current:
        out.append(f"[{','.join(current)}]")
    return out


def decode(payload: str) -> list[Event]:
    """A payload heard on this daemon's channel, as live events (malformed: none)."""
    try:
        items = json.loads(payload)
        return [
            Event(None, float(ts), kind, str(session_id), dict(data))
            for ts, kind, session_id, data in items
            if kind in RELAYED_TYPES
        ]
    except (ValueError, TypeError):
        log.warning("malformed live payload dropped", size=len(payload))
        return []


class LiveRelay:
    """This daemon's side of the live channel: who watches what, sending and hearing."""

    def __init__(
        self,
        schema: str,
        lease_seconds: float,
        connect: Any,
    ) -> None:
        tag = f"{zlib.crc32(schema.encode()):08x}"
        self.channel = f"harness_live_{tag}_{secrets.token_hex(4)}"
        self.watch_channel = f"harness_watch_{tag}"
        self._lease = lease_seconds
        self._connect = connect  # a new autocommit connection (in a worker thread)
        # Session id (or ALL) -> the channels of the other daemons watching it. The
        # feed reads it for each live event: empty, a delta costs nothing more.
        self.others: dict[str, set[str]] = {}
        self._mine: dict[str, int] = {}  # this daemon's subscribers, per session id or ALL
        self._rows: set[str] = set()  # what ``watchers`` holds of this daemon's
        self._conn: psycopg.Connection[tuple[Any, ...]] | None = None
        # The sender's own connection, used only from the event loop in non-blocking mode:
        # a batch of notifications costs no thread hop (pg_notify, _send_notes).
        self._sender: psycopg.Connection[tuple[Any, ...]] | None = None
        self._lock = threading.Lock()  # one statement at a time on the relay connection
        self._send, self._receive = trio.open_memory_channel[tuple[Event, frozenset[str]]](
            _QUEUE
        )
        self._active = trio.Event()  # rows exist, of this daemon's or others': renew
        self._feed: trio.MemorySendChannel[FeedMessage] | None = None
        self._heard_changes = 0  # watch notifications heard: a reload older than one is stale
        self.dropped = 0
        self.sent = 0  # notifications sent, for tests and benchmarks

    # --- the feed's side: a live event of a session this daemon runs ----------------------

    def offer(self, event: Event, lineage: Iterable[str]) -> None:
        """Queue ``event`` for the daemons that watch its session, an ancestor, or all."""
        if event.type not in RELAYED_TYPES:
            return
        channels: set[str] = set(self.others.get(ALL, ()))
        for session_id in lineage:
            channels.update(self.others.get(session_id, ()))
        if not channels:
            return
        try:
            self._send.send_nowait((event, frozenset(channels)))
        except trio.WouldBlock:
            self.dropped += 1  # the text is in the stored part: only its streaming is lost
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the relay has stopped (shutting down): the feed carries on without it

    # --- subscribers of this daemon ----------------------------------------------------------

    @asynccontextmanager
    async def watching(self, session_id: str | None) -> AsyncIterator[None]:
        """While a subscriber of this daemon listens: the others send it live events."""
        key = session_id or ALL
        self._mine[key] = self._mine.get(key, 0) + 1
        try:
            # The first subscriber always makes sure: a removal of the row may be under
            # way in a thread (the last one just left), and must not win.
            if self._mine[key] == 1 or key not in self._rows:
                await self._sync(key)
                if self._rows:
                    self._active.set()
            yield
        finally:
            self._mine[key] -= 1
            if not self._mine[key]:
                del self._mine[key]
                with trio.CancelScope(shield=True):
                    await self._sync(key)

    async def _sync(self, key: str) -> None:
        try:
            await trio.to_thread.run_sync(self._sync_row, key)
        except Exception as error:  # the database is away: live text waits for the part
            log.warning("live watch not recorded", session_id=key, error=str(error))

    def _sync_row(self, key: str) -> None:
        """Make ``watchers`` agree with the subscribers counted now, and tell the others."""
        with self._lock:
            wanted = key in self._mine
            if wanted == (key in self._rows):
                return
            self._on_connection(lambda conn: self._write_row(conn, key, wanted))
            if wanted:
                self._rows.add(key)
            else:
                self._rows.discard(key)

    def _write_row(self, conn: psycopg.Connection[tuple[Any, ...]], key: str, wanted: bool) -> None:
        with conn.transaction():
                if wanted:
                    conn.execute(
                        "INSERT INTO watchers(channel, session_id, expires) VALUES"
                        " (%s, %s, extract(epoch FROM clock_timestamp()) + %s)"
                        " ON CONFLICT (channel, session_id)"
                        " DO UPDATE SET expires = EXCLUDED.expires",
                        (self.channel, key, self._lease),
                    )
                else:
                    conn.execute(
                        "DELETE FROM watchers WHERE channel = %s AND session_id = %s",
                        (self.channel, key),
                    )
                sign = "+" if wanted else "-"
                conn.execute(
                    "SELECT pg_notify(%s, %s)", (self.watch_channel, f"{sign} {self.channel} {key}")
                )

    def _connection(self) -> psycopg.Connection[tuple[Any, ...]]:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            conn = self._conn = self._connect()
        return conn

    def _on_connection(self, work: Callable[[psycopg.Connection[tuple[Any, ...]]], T]) -> T:
        """``work`` on the relay's connection, made again once if the server dropped it
        (a restart, ``pg_terminate_backend``); the caller holds ``_lock``."""
        import psycopg

        conn = self._connection()
        try:
            return work(conn)
        except psycopg.OperationalError:
            if not conn.broken and not conn.closed:
                raise
        return work(self._connection())

    # --- the LISTEN connection's side ------------------------------------------------------

    def listening(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        """On a (re)made LISTEN connection: hear the watch channel and this daemon's own,
        and learn who watches what now (changes from here on come as notifications)."""
        conn.execute(f'LISTEN "{self.watch_channel}"')
        conn.execute(f'LISTEN "{self.channel}"')
        self._load(conn)

    def _load(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        self.others = self._read_others(conn)
        if self.others:
            self._active.set()

    def _read_others(self, conn: psycopg.Connection[tuple[Any, ...]]) -> dict[str, set[str]]:
        rows = conn.execute(
            "SELECT channel, session_id FROM watchers"
            " WHERE expires > extract(epoch FROM clock_timestamp()) AND channel <> %s",
            (self.channel,),
        ).fetchall()
        others: dict[str, set[str]] = {}
        for channel, session_id in rows:
            others.setdefault(str(session_id), set()).add(str(channel))
        return others

    def heard(self, channel: str, payload: str) -> bool:
        """A notification on one of this relay's channels: handled (True), or not ours."""
        if channel == self.channel:
            events = decode(payload)
            if events and self._feed is not None:
                with contextlib.suppress(
                    trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError
                ):
                    self._feed.send_nowait(Publish(events, remote=True))
            return True
        if channel != self.watch_channel:
            return False
        sign, _, rest = payload.partition(" ")
        watcher, _, key = rest.partition(" ")
        if watcher == self.channel or not key:
            return True
        self._heard_changes += 1
        if sign == "+":
            self.others.setdefault(key, set()).add(watcher)
            self._active.set()
        elif sign == "-":
            channels = self.others.get(key)
            if channels is not None:
                channels.discard(watcher)
                if not channels:
                    del self.others[key]
        return True

    # --- the relay's own tasks ---------------------------------------------------------------

    async def run(self, feed: trio.MemorySendChannel[FeedMessage] | None) -> None:
        """Send queued live events; renew this daemon's rows and forget lapsed ones."""
        self._feed = feed
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._renew)
                async with self._receive:
                    while True:
                        batch = [await self._receive.receive()]
                        while len(batch) < _BATCH:
                            try:
                                batch.append(self._receive.receive_nowait())
                            except trio.WouldBlock:
                                break
                        await self._deliver(batch)
        finally:
            with trio.CancelScope(shield=True), contextlib.suppress(Exception):
                await trio.to_thread.run_sync(self._close_sync)

    async def _deliver(self, batch: list[tuple[Event, frozenset[str]]]) -> None:
        by_channel: dict[str, list[Event]] = {}
        for event, channels in batch:
            for channel in channels:
                by_channel.setdefault(channel, []).append(event)
        notes = [
            (channel, payload)
            for channel, events in by_channel.items()
            for payload in payloads(events)
        ]
        for start in range(0, len(notes), _NOTES_PER_STATEMENT):
            group = notes[start : start + _NOTES_PER_STATEMENT]
            for attempt in (1, 2):  # a dropped connection is made again once
                try:
                    await self._send_notes(group)
                    self.sent += len(group)
                    break
                except Exception as error:  # live only: the stored part carries the text
                    self._drop_sender()
                    if attempt == 2:
                        log.warning("live events not relayed", count=len(group), error=str(error))

    async def _send_notes(self, notes: list[tuple[str, str]]) -> None:
        """One statement, ``SELECT pg_notify($1, $2), pg_notify($3, $4)…`` (evaluated in
        order), sent and answered without blocking the event loop or taking a thread."""
        import psycopg
        from psycopg import pq

        if self._sender is None:
            conn = await trio.to_thread.run_sync(self._connect)
            conn.pgconn.nonblocking = 1
            self._sender = conn
        pgconn = self._sender.pgconn
        calls = ", ".join(f"pg_notify(${2 * i + 1}, ${2 * i + 2})" for i in range(len(notes)))
        params = [value.encode() for note in notes for value in note]
        pgconn.send_query_params(f"SELECT {calls}".encode(), params)
        while pgconn.flush():  # 1: more to send once the socket takes it
            await trio.lowlevel.wait_writable(pgconn.socket)
        failed: str | None = None
        while True:
            pgconn.consume_input()
            if pgconn.is_busy():
                await trio.lowlevel.wait_readable(pgconn.socket)
                continue
            result = pgconn.get_result()
            if result is None:
                break
            if result.status != pq.ExecStatus.TUPLES_OK:
                failed = (result.error_message or b"").decode(errors="replace").strip()
        if failed is not None or pgconn.status != pq.ConnStatus.OK:
            raise psycopg.OperationalError(failed or "the relay's connection was lost")

    def _drop_sender(self) -> None:
        if self._sender is not None:
            with contextlib.suppress(Exception):
                self._sender.close()
            self._sender = None

    async def _renew(self) -> None:
        """While any watch row exists: keep this daemon's alive, drop others' that lapsed
        (their daemon died). With none, it waits on an event: no work when idle."""
        every = max(self._lease / 3, 0.05)
        while True:
            await self._active.wait()
            await trio.sleep(every)
            heard = self._heard_changes
            try:
                others = await trio.to_thread.run_sync(self._renew_sync)
            except Exception as error:
                log.warning("live watch renewal failed", error=str(error))
            else:
                if heard == self._heard_changes:  # else a change came in meanwhile: next round
                    self.others = others
            if not self._rows and not self.others:
                self._active = trio.Event()

    def _renew_sync(self) -> dict[str, set[str]]:
        with self._lock:
            return self._on_connection(self._renew_on)

    def _renew_on(self, conn: psycopg.Connection[tuple[Any, ...]]) -> dict[str, set[str]]:
        if self._rows:
            # An upsert, not an update: rows the others dropped while this daemon could
            # not reach the database come back.
            conn.execute(
                "INSERT INTO watchers(channel, session_id, expires)"
                " SELECT %s, unnest(%s::text[]), extract(epoch FROM clock_timestamp()) + %s"
                " ON CONFLICT (channel, session_id) DO UPDATE SET expires = EXCLUDED.expires",
                (self.channel, sorted(self._rows), self._lease),
            )
        conn.execute("DELETE FROM watchers WHERE expires < extract(epoch FROM clock_timestamp())")
        return self._read_others(conn)

    def _close_sync(self) -> None:
        """A clean stop: this daemon's rows go, and the others hear it."""
        with self._lock:
            if self._rows:
                conn = self._connection()
                with conn.transaction():
                    conn.execute("DELETE FROM watchers WHERE channel = %s", (self.channel,))
                    for key in self._rows:
                        conn.execute(
                            "SELECT pg_notify(%s, %s)",
                            (self.watch_channel, f"- {self.channel} {key}"),
                        )
                self._rows.clear()
            if self._conn is not None:
                self._conn.close()
                self._conn = None
        self._drop_sender()
