"""Fixtures shared by the test files."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A real project directory for a session: a couple of files to read."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "package.json").write_text('{\n  "name": "demo",\n  "packageManager": "pnpm@9"\n}\n')
    (root / "notes.txt").write_text("line one\nmarker-7f3a line two\n")
    return root
