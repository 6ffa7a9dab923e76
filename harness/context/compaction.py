"""The compaction turn and its words: what the model is asked to write when the context fills.

The summary replaces everything before the messages kept verbatim, so it must let the
work continue as if nothing was forgotten. Its sections are fixed so that a later
compaction (of a history that starts with a summary) keeps the same shape.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final

import structlog

from harness.messages import ids
from harness.messages.model import CompactionPart
from harness.messages.outcome import Next, Stop
from harness.messages.provider import UserTurn

if TYPE_CHECKING:
    from harness.actors.recording import Recorder

log = structlog.get_logger("harness.runner")

SECTIONS: Final = (
    "Goal",
    "Constraints & preferences",
    "Progress",
    "Key decisions",
    "Next steps",
    "Critical context",
    "Relevant files",
)

COMPACTION_SYSTEM: Final = (
    "You are summarizing a coding session so that it can continue in a fresh context. "
    "You cannot call tools. Write only the summary."
)

COMPACTION_PROMPT: Final = (
    "The conversation is about to exceed the model's context window. Write a summary that "
    "lets you carry on the work without the messages above. Use exactly these markdown "
    "sections, in this order, and keep every fact you will need (file paths, commands, "
    "error messages, decisions and the user's wishes):\n\n"
    + "\n".join(f"## {section}" for section in SECTIONS)
    + "\n\nUnder 'Progress' say what is done and what is in progress; under 'Next steps' "
    "what you were about to do. Do not invent anything that did not happen."
)


async def compact(
    recorder: Recorder,
    user_message_id: str,
    step: int,
    keep_tokens: int,
    *,
    estimate: Callable[[], int],
    flush: Callable[[], Awaitable[None]],
    require_shrink: bool = True,
) -> Next | Stop:
    """Replace the history before the recent messages with a summary the model writes.

    The summary is stored as a compaction part of a message of its own; from then on
    the model's view is that summary plus the messages kept verbatim. A summary that
    does not make the context smaller stops the turn instead of looping, unless
    ``require_shrink`` is off (a compaction the user asked for: no loop to break).
    """
    history = recorder.history
    before = estimate()
    keep_from = history.keep_from(keep_tokens)
    with recorder.open(user_message_id, step, mode="compaction") as reply:
        request = recorder.request(
            step,
            (COMPACTION_SYSTEM,),
            tools=(),
            tool_choice="none",
            ask=UserTurn(COMPACTION_PROMPT),
        )
        log.info("compacting", tokens=before, keep_from=keep_from)
        error = await recorder.read(reply, request)
        if error is not None:
            reply.finish_message(error=str(error))
            return Stop("overflow", f"compaction failed: {error}")
        summary = reply.text.strip()
        if reply.finish is None or not summary:
            reply.finish_message(error="the compaction produced no summary")
            return Stop("overflow", "the compaction produced no summary")
        part = CompactionPart(
            id=ids.part_id(),
            session_id=reply.message.session_id,
            message_id=reply.message.id,
            summary=summary,
            keep_from=keep_from,
            tokens_before=before,
        )
        recorder.post_part(part, "part.created")
        reply.finish_message()
        await flush()
        history.sync()
        after = estimate()
        log.info("compacted", tokens_before=before, tokens_after=after)
    if require_shrink and after >= before * 0.95:
        return Stop(
            "overflow",
            f"compaction did not shrink the context ({before} -> {after} tokens); "
            "the messages that must be kept do not fit the model's window",
        )
    return Next(compacted=True)
