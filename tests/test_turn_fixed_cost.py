"""What a turn start does once per process rather than once per turn (issue 18)."""

from __future__ import annotations

import json

import pytest

from harness.actors import runner
from harness.history import estimate_tokens
from harness.tools.registry import builtin_tools, tool_specs


def test_a_tool_schemas_tokens_are_counted_once_then_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    specs = list(tool_specs(builtin_tools()).values())
    expected = [estimate_tokens(json.dumps(spec.parameters)) for spec in specs]
    assert [runner._schema_tokens(spec.parameters) for spec in specs] == expected
    dumped: list[object] = []
    real = json.dumps

    def counting(value: object, **options: object) -> str:
        dumped.append(value)
        return real(value, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(runner.json, "dumps", counting)
    assert [runner._schema_tokens(spec.parameters) for spec in specs] == expected
    assert dumped == []
    # Another schema object, even an equal one, is counted (its id may be a dead one's).
    copy = dict(specs[0].parameters)
    assert runner._schema_tokens(copy) == expected[0]
    assert dumped == [copy]


def test_the_schema_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "_SCHEMA_TOKENS", {})
    monkeypatch.setattr(runner, "_SCHEMA_TOKENS_MAX", 8)
    kept = [{"type": "object", "title": str(i)} for i in range(20)]
    for schema in kept:
        runner._schema_tokens(schema)
    assert len(runner._SCHEMA_TOKENS) <= 8
