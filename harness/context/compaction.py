"""The words of a compaction turn: what the model is asked to write when the context fills.

The summary replaces everything before the messages kept verbatim, so it must let the
work continue as if nothing was forgotten. Its sections are fixed so that a later
compaction (of a history that starts with a summary) keeps the same shape.
"""

from __future__ import annotations

from typing import Final

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

BUDGET_PROMPT: Final = (
    "BUDGET REACHED. The budget for this task ({reason}) is used up, so tools are disabled "
    "now. Do not call any tool. Answer with text only: say that the budget was reached, "
    "summarise what was done, list what remains, and recommend next steps."
)
