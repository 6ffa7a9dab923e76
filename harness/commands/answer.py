"""``harness answer``: answer (or dismiss) a pending question (needs the daemon)."""

from __future__ import annotations

import argparse
from typing import Any

from harness.commands.base import UsageError, print_result, require_daemon


def register(commands: Any) -> None:
    answer = commands.add_parser(
        "answer",
        help="answer a pending question",
        description="Answer a question the model asked: one ANSWER per question, in order. "
        "An answer is an option's label or number, several separated by commas when the "
        "question allows more than one, or text of your own.",
    )
    answer.set_defaults(handler=_answer)
    answer.add_argument("question", help="the question id (que_…)")
    answer.add_argument("answers", nargs="*", metavar="ANSWER", help="one answer per question")
    answer.add_argument("--reject", action="store_true", help="dismiss the question instead")
    answer.add_argument(
        "--message", help="with --reject: feedback the model sees (the turn then continues)"
    )
    answer.add_argument("--json", action="store_true", help="print JSON")


def _answer(args: argparse.Namespace) -> int:
    if args.reject == bool(args.answers):
        raise UsageError("give one ANSWER per question, or --reject")
    if args.message is not None and not args.reject:
        raise UsageError("--message goes with --reject")
    client = require_daemon()
    if args.reject:
        client.reject_question(args.question, args.message)
        return print_result(args.json, {"id": args.question, "rejected": True}, "dismissed")
    pending = {q["id"]: q for q in client.questions()}
    request = pending.get(args.question)
    if request is None:
        raise UsageError(f"no pending question {args.question}")
    from harness.commands.display import shape_answers

    answers = shape_answers(request["questions"], args.answers)
    client.answer_question(args.question, answers)
    return print_result(args.json, {"id": args.question, "answers": answers}, "answered")
