"""The one way a session comes into being: its row, its place in the feed's tree, its write.

``Harness.create_session`` (a caller's new session) and ``ChildSessions`` (a ``task``
call's subtask) both create sessions through here. Each checks its own input first (a
caller's directory and model, a tool call's agent name), because each reports a bad one
its own way.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import trio

from harness.messages import ids
from harness.messages.events import NewEvent
from harness.messages.mailbox import FeedMessage, RegisterChild
from harness.messages.model import Rule, Session
from harness.storage.port import LedgerPort


def new_session(
    *,
    directory: str,
    agent: str,
    model: str,
    title: str = "",
    parent_id: str | None = None,
    base_url: str | None = None,
    permission: Sequence[Rule] = (),
) -> Session:
    """A new session's row, not written yet: a fresh id, created and updated now."""
    now = time.time()
    return Session(
        id=ids.session_id(),
        parent_id=parent_id,
        title=title,
        directory=directory,
        agent=agent,
        model=model,
        base_url=base_url,
        permission=list(permission),
        created=now,
        updated=now,
    )


async def join_tree(feed: trio.MemorySendChannel[FeedMessage], session: Session) -> None:
    """Tell the feed a child session belongs to its parent's tree (a root needs nothing).

    Sent before the child's first write: a subscriber to the tree hears all of it. The
    feed keeps this in memory, so a child run again after a restart joins again.
    """
    if session.parent_id is not None:
        await feed.send(RegisterChild(session.parent_id, session.id))


async def record_session(
    ledger: LedgerPort,
    feed: trio.MemorySendChannel[FeedMessage],
    session: Session,
    *along: NewEvent,
) -> None:
    """Write ``session.created`` for ``session`` (with ``along`` in the same transaction)."""
    await join_tree(feed, session)
    await ledger.write([NewEvent.of("session.created", session.id, session), *along])
