"""A generated repository the size of a real one, for benchmarks/search.py.

Deterministic for a given seed and file count: nested source directories of Python,
TypeScript, JavaScript, Markdown and JSON files (most 1–3 kB, a few of 1 MB and two over
grep's 5 MB limit), binary files (PNG-like, with NUL bytes), hidden files and directories
(``.github/``, ``.eslintrc``, ``.env``), a ``.gitignore`` naming ``build/`` and ``dist/``,
a ``node_modules/`` with a quarter of the files, a ``build/`` tree, a small ``.git/``, and
a few symlinks. One rare token (``RARE_TOKEN``) sits in a handful of files.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

RARE_TOKEN = "zqxjv_handshake_7731"

_WORDS = [
    "self", "return", "value", "import", "from", "class", "def", "function", "const", "let",
    "async", "await", "error", "result", "items", "index", "count", "config", "path", "name",
    "data", "user", "request", "response", "handler", "state", "update", "render", "props",
    "module", "export", "default", "string", "number", "list", "dict", "true", "false", "none",
    "null", "undefined", "options", "context", "buffer", "stream", "token", "parse", "build",
    "test",
]


def _line(rng: random.Random, ext: str) -> str:
    words = rng.choices(_WORDS, k=rng.randint(3, 9))
    if ext == ".py":
        shapes = [
            "def {0}_{1}({2}, {3}):",
            "    {0} = {1}.{2}({3})",
            "    return {0}_{1}",
            "from {0}.{1} import {2}",
            "class {0}{1}({2}):",
            "    # {0} {1} {2} {3}",
        ]
    elif ext in (".ts", ".js"):
        shapes = [
            "export function {0}{1}({2}: string) {{",
            "  const {0} = await {1}.{2}({3});",
            "  return {0}.{1};",
            "import {{ {0} }} from './{1}';",
            "// {0} {1} {2} {3}",
            "}}",
        ]
    else:
        shapes = ["{0} {1} {2} {3}", "- {0} {1}: {2}", '"{0}": "{1} {2}",']
    return rng.choice(shapes).format(*(words + words))


def _text(rng: random.Random, ext: str, size: int) -> str:
    lines: list[str] = []
    total = 0
    while total < size:
        line = _line(rng, ext)
        lines.append(line)
        total += len(line) + 1
    return "\n".join(lines) + "\n"


def generate(root: Path, files: int = 100_000, seed: int = 14) -> dict[str, int]:
    """Write the tree under ``root`` (which must be empty); return counts by kind."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    counts = {"source": 0, "node_modules": 0, "build": 0, "binary": 0, "large": 0, "hidden": 0}
    exts = [".py", ".ts", ".js", ".md", ".json", ".tsx"]
    per_dir = 20
    made = 0

    def write(path: Path, data: str | bytes) -> None:
        nonlocal made
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, str):
            path.write_text(data)
        else:
            path.write_bytes(data)
        made += 1

    write(root / ".gitignore", "build/\ndist/\n*.log\n")
    # Hidden files and directories, a .git with a few objects.
    for name in (".eslintrc", ".prettierrc", ".env", ".editorconfig"):
        write(root / name, _text(rng, ".md", 200))
        counts["hidden"] += 1
    for i in range(20):
        write(root / ".github" / "workflows" / f"ci{i}.yml", _text(rng, ".md", 600))
        counts["hidden"] += 1
    for i in range(50):
        write(root / ".git" / "objects" / f"{i:02x}" / f"{i:038x}", os.urandom(300))

    # Large files: a few of 1 MB and two past grep's 5 MB limit.
    for i in range(5):
        write(root / "data" / f"fixture{i}.json", _text(rng, ".json", 1024 * 1024))
        counts["large"] += 1
    for i in range(2):
        write(root / "data" / f"dump{i}.sql", _text(rng, ".md", 6 * 1024 * 1024))
        counts["large"] += 1

    budget = files - made
    shares = [("src", 0.55), ("node_modules", 0.25), ("build", 0.07), ("tests", 0.08)]
    rare_left = 6
    for top, share in shares:
        count = int(budget * share)
        for i in range(count):
            d = i // per_dir
            parts = [top, f"pkg{d % 37}", f"mod{d % 11}", f"part{d}"]
            ext = exts[i % len(exts)]
            if top == "node_modules":
                parts = [top, f"lib{d % 400}", "dist", f"chunk{d}"]
                ext = ".js"
            path = root.joinpath(*parts[: 2 + d % 3]) / f"file{i}{ext}"
            if i % 97 == 0:
                path = path.with_suffix(".png")
                write(path, b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR" + os.urandom(rng.randint(500, 3000)))
                counts["binary"] += 1
                continue
            text = _text(rng, ext, rng.randint(600, 3000))
            if top == "src" and rare_left and i % 9973 == 0:
                text += f"    handshake = '{RARE_TOKEN}'\n"
                rare_left -= 1
            write(path, text)
            counts[top if top in ("node_modules", "build") else "source"] += 1
    # Fill up to the exact count with small documentation files.
    i = 0
    while made < files:
        write(root / "docs" / f"section{i // 100}" / f"page{i}.md", _text(rng, ".md", 800))
        counts["source"] += 1
        i += 1
    # A few symlinks: to a file inside, and to a directory inside (not followed).
    os.symlink("../src", root / "docs" / "src-link")
    os.symlink("../.gitignore", root / "docs" / "gitignore-link")
    return counts


if __name__ == "__main__":
    import sys
    import time

    start = time.perf_counter()
    print(generate(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 100_000))
    print(f"{time.perf_counter() - start:.1f} s")
