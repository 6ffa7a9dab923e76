"""Cap tool output, keeping the head and saving the full text to a file (DESIGN §7)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.private import open_private, private_dir

MAX_LINES = 2000
MAX_BYTES = 50 * 1024


def _split_lines(text: str) -> list[str]:
    # A trailing newline ends the last line rather than starting an empty one.
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def truncate_output(
    text: str,
    *,
    output_dir: Path,
    call_id: str,
    max_lines: int = MAX_LINES,
    max_bytes: int = MAX_BYTES,
) -> tuple[str, dict[str, Any]]:
    """Return ``text`` unchanged if it fits, else its head plus a note naming the full copy."""
    # Sized without copies first (every call's output passes here, and most fit): an ASCII
    # string's length is its UTF-8 length, and counting newlines builds no list.
    size = len(text) if text.isascii() else len(text.encode("utf-8"))
    line_count = text.count("\n") + (0 if not text or text.endswith("\n") else 1)
    if line_count <= max_lines and size <= max_bytes:
        return text, {}
    lines = _split_lines(text)

    private_dir(output_dir)
    path = output_dir / f"{call_id}.txt"
    with open_private(path, "w", encoding="utf-8") as out:
        out.write(text)

    kept: list[str] = []
    used = 0
    partial = False
    for line in lines[:max_lines]:
        size = len(line.encode("utf-8")) + 1
        if used + size > max_bytes:
            if not kept:
                # A single line longer than the whole budget: keep what fits of it, cut at
                # a byte boundary without leaving half a UTF-8 sequence behind.
                head = line.encode("utf-8")[:max_bytes].decode("utf-8", errors="ignore")
                kept.append(head)
                partial = True
            break
        kept.append(line)
        used += size

    # A line shown only in part still counts as truncated.
    dropped = len(lines) - len(kept) + (1 if partial else 0)
    note = (
        f"...{dropped} lines truncated...\n\n"
        "The tool call succeeded but the output was truncated. "
        f"Full output saved to: {path}\n"
        "Use grep to search it or read with offset/limit to see parts of it."
    )
    return "\n".join(kept) + "\n\n" + note, {"truncated": True, "output_path": str(path)}
