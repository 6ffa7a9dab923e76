"""Request bodies whose cost per step does not grow with the history (issue 14).

A request carries the whole history, but the history only grows: each message's wire
JSON is made (and checked by the provider's models) once, and a step joins the fragments
it already has into the body. The cache key is the provider-neutral message itself
(``UserTurn``, ``AssistantTurn``, ``ToolResult``, or ``SystemText``): frozen dataclasses,
compared by value, and ``History`` hands out the same objects step after step, so a look-up
is an identity hit (looked up by ``id()``, the object held so the id cannot be reused);
an equal message made anew is found by value. Keying by content rather than by message
id means a stale fragment cannot exist: an edited message is a different key. This is
sound because a provider's ``encode_message`` is a pure function of the message (its
tool-call id normalization included: a fixed mapping from each raw id, so an id maps the
same in every request of the history).

The envelope (model, tools, options, and where the messages go) is made once per distinct
set of options by encoding the provider's whole request around one sentinel message and
splitting at that message's fragment, so the bytes are exactly what encoding the whole
request at once would give.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness import machine_cache
from harness.messages.provider import ChatMessage, ProviderRequest, ToolSpec

FRAME_CACHE = "request-frames"  # the machine cache's file of request frames


@dataclass(slots=True, frozen=True)
class SystemText:
    """The one system message (the request's system blocks joined), as a cache key."""

    text: str


WireMessage = ChatMessage | SystemText


def system_text(request: ProviderRequest) -> SystemText | None:
    # One system message: several are accepted by the API but not by every model template.
    text = "\n\n".join(s for s in request.system if s)
    return SystemText(text) if text else None


@dataclass(slots=True, frozen=True)
class _EnvelopeKey:
    model: str
    tool_choice: str
    max_tokens: int | None
    temperature: float | None
    tools_id: int  # identity of the request's tools tuple (tool schemas are unhashable dicts)


@dataclass(slots=True)
class _Envelope:
    tools: tuple[ToolSpec, ...]  # held, so that ``tools_id`` cannot be reused meanwhile
    head: bytes  # the body up to the first message
    tail: bytes  # from after the last message to the end


class WireCache:
    """One provider's cache of message fragments and request envelopes.

    ``encode_message`` gives a message's wire JSON (validated by the provider's own models),
    empty for a message the provider leaves out;
    ``encode_whole(request, messages)`` encodes a whole body around a list of already-encoded
    stand-ins (used once per envelope, with a sentinel); ``separator`` is what the provider's
    serializer puts between two items of a list.

    When the history only grew since the last request (the usual step), only the new
    messages are looked at and their fragments appended to the last join. Fragments no
    longer in the view (pruned, summarized) are dropped when the view changes and they
    outnumber those in use; retries and the next step reuse everything else.
    """

    def __init__(
        self,
        encode_message: Callable[[WireMessage], bytes],
        encode_whole: Callable[[ProviderRequest, list[Any]], bytes],
        sentinel_message: Callable[[str], Any],
        *,
        separator: bytes = b",",
        frame_key: Callable[[ProviderRequest], str | None] | None = None,
    ) -> None:
        self._frame_key = frame_key
        self._encode_message = encode_message
        self._encode_whole = encode_whole
        self._sentinel_message = sentinel_message
        self._separator = separator
        # Messages by identity: History hands out the same objects step after step, and
        # an int key spares hashing a dataclass per message per step. Objects are held.
        self._by_identity: dict[int, tuple[WireMessage, bytes]] = {}
        # Every fragment made, by value, for equal messages made anew (a re-derived view).
        self._by_value: dict[WireMessage, bytes] = {}
        self._envelopes: dict[_EnvelopeKey, _Envelope] = {}
        # The latest request's messages (held, so their ids stay theirs) and their join:
        # the next step's list usually starts with the very same objects.
        self._last: list[WireMessage] = []
        self._last_ids: list[int] = []
        self._last_joined = bytearray()
        self._system: tuple[tuple[str, ...], SystemText | None] = ((), None)
        self.encoded = 0  # messages encoded so far: what a test can hold flat

    def body(self, request: ProviderRequest) -> bytes:
        return b"".join(self.parts(request))

    def parts(self, request: ProviderRequest) -> tuple[bytes, bytearray, bytes]:
        """``body``'s bytes before they are joined: the envelope's head, the messages'
        fragments joined, the envelope's tail. A provider sends them as they are (one
        ``sendmsg``) rather than copy the whole history once more each step. The middle
        part is the cache's own join, which the next request's ``parts`` or ``body``
        extends in place: send it (or copy it) before asking for another.
        """
        envelope = self._envelope(request)
        messages: list[WireMessage] = []
        system = self._system_of(request)
        if system is not None:
            messages.append(system)
        messages.extend(request.messages)
        ids = list(map(id, messages))
        kept = len(self._last_ids)
        if kept and ids[:kept] == self._last_ids:
            # The history only grew: encode the new messages alone and append them to the
            # join in place (a bytearray grows without copying what it holds).
            joined = self._last_joined
            added = self._fragments(messages[kept:])
            if added:
                if joined:
                    joined += self._separator
                joined += self._separator.join(added)
        else:
            # The view changed (pruning, a summary, a final step's prompt): walk it all,
            # still encoding only messages never seen, and forget what left it.
            previous, self._by_identity = self._by_identity, {}
            joined = bytearray(self._separator.join(self._fragments(messages, previous)))
            if len(self._by_value) > 2 * len(messages) + 16:
                self._by_value = dict(self._by_identity.values())
        self._last, self._last_ids, self._last_joined = messages, ids, joined
        return envelope.head, joined, envelope.tail

    def _fragments(
        self,
        messages: list[WireMessage],
        previous: dict[int, tuple[WireMessage, bytes]] | None = None,
    ) -> list[bytes]:
        """Each message's fragment, recorded by identity (looked up in ``previous`` too)."""
        known = self._by_identity
        by_value = self._by_value
        fragments: list[bytes] = []
        for message in messages:
            hit = known.get(id(message))
            if hit is None and previous is not None:
                hit = previous.get(id(message))
                if hit is not None and hit[0] is message:
                    known[id(message)] = hit
            if hit is not None and hit[0] is message:
                fragment = hit[1]
            else:
                cached = by_value.get(message)
                if cached is None:
                    cached = by_value[message] = self._encode_message(message)
                    self.encoded += 1
                fragment = cached
                known[id(message)] = (message, fragment)
            if fragment:  # empty: a message this provider never sends
                fragments.append(fragment)
        return fragments

    def _system_of(self, request: ProviderRequest) -> SystemText | None:
        """The same ``SystemText`` object while the system blocks stay the same."""
        blocks, text = self._system
        if request.system != blocks:
            text = system_text(request)
            self._system = (request.system, text)
        return text

    def _envelope(self, request: ProviderRequest) -> _Envelope:
        key = _EnvelopeKey(
            request.model,
            request.tool_choice,
            request.max_tokens,
            request.temperature,
            id(request.tools),
        )
        envelope = self._envelopes.get(key)
        if envelope is not None and envelope.tools is request.tools:
            return envelope
        # The machine's cache (the CLI's): this frame, made by an earlier run from exactly
        # these inputs, spares building the provider's request models at start-up.
        frame = self._frame_key(request) if self._frame_key is not None else None
        kept = machine_cache.lookup(FRAME_CACHE, frame) if frame is not None else None
        if isinstance(kept, list) and len(kept) == 2 and all(isinstance(p, str) for p in kept):
            head, tail = kept[0].encode("utf-8"), kept[1].encode("utf-8")
        else:
            head, tail = self._frame(request)
            if frame is not None:
                with contextlib.suppress(UnicodeDecodeError):
                    machine_cache.store(FRAME_CACHE, frame, [head.decode(), tail.decode()])
        envelope = _Envelope(request.tools, head, tail)
        # The runner keeps two tool sets (all tools, and none on a final step): a handful of
        # envelopes is all a session needs, so drop them all should options keep changing.
        if len(self._envelopes) >= 8:
            self._envelopes.clear()
        self._envelopes[key] = envelope
        return envelope

    def _frame(self, request: ProviderRequest) -> tuple[bytes, bytes]:
        """The body before and after its messages, cut from a whole encoded request."""
        marker = f"harness-sentinel-{secrets.token_hex(16)}"
        standin = self._sentinel_message(marker)
        whole = self._encode_whole(request, [standin])
        fragment = self._encode_message(SystemText(marker))
        # The stand-in is encoded as a system message, like SystemText: its bytes are known.
        head, found, tail = whole.partition(fragment)
        if not found or fragment in tail:
            raise AssertionError("the request envelope does not hold its sentinel message once")
        return head, tail

    def clear(self) -> None:
        self._by_identity.clear()
        self._by_value.clear()
        self._envelopes.clear()
        self._last, self._last_ids, self._last_joined = [], [], bytearray()
