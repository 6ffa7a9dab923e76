"""``harness events``: follow the daemon's event stream until Ctrl-C."""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING, Any

from harness import printable
from harness.commands.base import EXIT_CANCELLED, EXIT_OK, require_daemon

if TYPE_CHECKING:
    from harness.client import WireEvent


def register(commands: Any) -> None:
    events = commands.add_parser("events", help="follow the daemon's event stream (Ctrl-C stops)")
    events.set_defaults(handler=_events)
    events.add_argument("--session", help="only this session and its child sessions")
    events.add_argument("--after", type=int, help="replay from the ledger after this seq first")
    events.add_argument("--json", action="store_true", help="print one event object per line")


def _events(args: argparse.Namespace) -> int:
    stream = require_daemon().events(args.session, args.after)
    try:
        for event in stream:
            print(event.to_json() if args.json else _event_line(event), flush=True)
    except KeyboardInterrupt:
        return EXIT_CANCELLED
    finally:
        stream.close()
    return EXIT_OK


def _event_line(event: WireEvent) -> str:
    when = time.strftime("%H:%M:%S", time.localtime(event.ts))
    seq = str(event.seq) if event.seq is not None else "-"
    # ensure_ascii=False keeps C1 controls and bidi overrides as they are: shown here.
    data = json.dumps(event.data, ensure_ascii=False)
    line = f"{seq:>7} {when} {event.session_id} {event.type:18} {data[:120]}"
    return printable(line, one_line=True)
