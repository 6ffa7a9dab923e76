"""Whether a provider would take an MCP tool's input schema, and what it costs to send.

One bad schema must not fail every request of a turn (OpenAI answers 400 for the whole
request): a tool whose schema would be rejected is left out, with a warning event naming
the tool and the problem. The checks are those providers are known to enforce on function
parameters: an object at the top, known types, an ``items`` for every array, ``properties``
and ``required`` of the right shapes, a size that fits.
"""

from __future__ import annotations

import json
from typing import Any

_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
MAX_SCHEMA_BYTES = 64 * 1024
MAX_DEPTH = 32


def estimate_tokens(text: str) -> int:
    """About four characters a token: the estimate the runner uses (harness/history.py)."""
    return len(text) // 4 + 1


def schema_tokens(name: str, description: str, schema: dict[str, Any]) -> int:
    """What a tool's spec adds to every request it is offered in."""
    return estimate_tokens(name) + estimate_tokens(description) + estimate_tokens(
        json.dumps(schema, separators=(",", ":"))
    )


def schema_problem(schema: object) -> str | None:
    """Why a provider would reject ``schema`` as a function's parameters, or None."""
    if not isinstance(schema, dict):
        return "the input schema is not a JSON object"
    if schema.get("type") != "object":
        return f"the input schema's type is {schema.get('type')!r}, not 'object'"
    try:
        size = len(json.dumps(schema))
    except (TypeError, ValueError) as error:
        return f"the input schema is not JSON: {error}"
    if size > MAX_SCHEMA_BYTES:
        return f"the input schema takes {size} bytes (at most {MAX_SCHEMA_BYTES})"
    return _walk(schema, "", 0)


def _walk(node: object, where: str, depth: int) -> str | None:
    if depth > MAX_DEPTH:
        return f"the input schema nests deeper than {MAX_DEPTH} levels"
    if isinstance(node, list):
        for index, item in enumerate(node):
            problem = _walk(item, f"{where}[{index}]", depth + 1)
            if problem:
                return problem
        return None
    if not isinstance(node, dict):
        return None
    at = where or "the top level"
    kind = node.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    for one in kinds:
        if not isinstance(one, str) or one not in _TYPES:
            return f"{at}: unknown type {one!r}"
    if "array" in kinds and "items" not in node and "prefixItems" not in node:
        return f"{at}: an array without 'items'"
    properties = node.get("properties")
    if properties is not None and not isinstance(properties, dict):
        return f"{at}: 'properties' is not an object"
    required = node.get("required")
    if required is not None and (
        not isinstance(required, list) or not all(isinstance(r, str) for r in required)
    ):
        return f"{at}: 'required' is not a list of names"
    for key, value in node.items():
        if key in ("enum", "const", "default", "examples", "description", "title"):
            continue  # values, not schemas
        if key == "properties" and isinstance(value, dict):
            for name, sub in value.items():
                problem = _walk(sub, f"{where}.{name}" if where else name, depth + 1)
                if problem:
                    return problem
            continue
        problem = _walk(value, f"{where}.{key}" if where else key, depth + 1)
        if problem:
            return problem
    return None
