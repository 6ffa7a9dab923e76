"""The daemon API described: each route's operations, and the OpenAPI 3.1 document built
from them (``GET /v1/openapi.json``, DESIGN §13).

The server's route table is made of the ``Operation`` records below: the handler, the
pydantic model it validates the body with, the type it answers and the errors it may
give. The document is generated from that same table and those same models, so it cannot
list a route the server lacks, miss one it has, or describe a body other than the one
validated. It is built on the first request only (pydantic's schema generation costs tens
of milliseconds) and kept.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Literal

from pydantic import BaseModel, TypeAdapter, ValidationError

from harness.messages.api import ErrorBody

Method = Literal["GET", "POST", "PATCH", "DELETE"]

# The characters of an id in a path: what the server's patterns match.
ID_PATTERN = r"[A-Za-z0-9_\-]+"
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")


@dataclass(frozen=True, slots=True)
class Param:
    """A query parameter (or header) an operation reads."""

    name: str
    description: str
    where: Literal["query", "header"] = "query"
    schema: dict[str, Any] = field(default_factory=lambda: {"type": "string"})
    errors: tuple[tuple[int, str], ...] = ()  # what a bad value is answered with


@dataclass(frozen=True, slots=True)
class Operation:
    """One method of one route: who serves it and what goes in and out.

    ``handler`` is None for the event stream, which the connection serves itself.
    ``answer`` is the success body's type (a model, ``list[Model]``, a union), answered
    with ``status``; ``stream`` marks a ``text/event-stream`` whose ``data:`` lines are
    each one ``answer``. ``errors`` are the (status, code) pairs the handler itself may
    answer; those every request may get (a malformed body, a missing session, a full
    disk) are added by the document builder from the rest of the record.
    """

    handler: Callable[..., Awaitable[Any]] | None  # harness.server's Handler
    summary: str
    answer: Any
    status: int = 200
    body: type[BaseModel] | None = None
    params: tuple[Param, ...] = ()
    errors: tuple[tuple[int, str], ...] = ()
    stream: bool = False
    description: str = ""


@dataclass(frozen=True, slots=True)
class Route:
    """A path template (``/v1/sessions/{session_id}``) and its operations by method."""

    template: str
    methods: dict[str, Operation]

    @property
    def path_params(self) -> list[str]:
        return _PLACEHOLDER.findall(self.template)

    def pattern(self) -> re.Pattern[str]:
        """The regex the server matches a request path with; one group per placeholder."""
        pieces = _PLACEHOLDER.split(self.template)  # literal, name, literal, name, ...
        return re.compile(
            "".join(
                f"({ID_PATTERN})" if odd else re.escape(piece)
                for odd, piece in zip(itertools.cycle((False, True)), pieces, strict=False)
            )
        )


# Answers any request may get, whatever its route (see harness/server.py).
_EVERY_REQUEST: tuple[tuple[int, str], ...] = (
    (400, "bad_request"),  # malformed HTTP
    (403, "forbidden"),  # a peer of another uid
    (408, "request_timeout"),
    (413, "body_too_large"),
    (500, "internal"),
    (503, "storage_failed"),  # the ledger could not write (a full disk): retry later
    (503, "too_many_connections"),
)
_WITH_BODY: tuple[tuple[int, str], ...] = ((400, "malformed_json"), (422, "invalid_body"))
_SSE = (
    "Server-Sent Events: each event is `id: <seq>` (durable events only) and "
    "`data: <one Event as JSON>`, then a blank line; a `: heartbeat` comment every 15 s."
)
_REASONS = {
    400: "Bad request",
    403: "Forbidden",
    404: "Not found",
    408: "Request timeout",
    409: "Conflict",
    413: "Body too large",
    422: "Unprocessable body or parameter",
    500: "Internal error",
    503: "Unavailable",
}


def _version() -> str:
    try:
        return version("harness")
    except PackageNotFoundError:  # run from a source tree without installing
        return "0"


def _errors_of(route: Route, operation: Operation) -> dict[int, list[str]]:
    pairs: list[tuple[int, str]] = [*_EVERY_REQUEST, *operation.errors]
    if operation.body is not None:
        pairs += _WITH_BODY
    if route.template.startswith("/v1/sessions/{"):
        pairs.append((404, "not_found"))
    pairs.append((422, "invalid_query"))  # a query parameter it does not take
    for param in operation.params:
        pairs += param.errors
    codes: dict[int, list[str]] = {}
    for status, code in sorted(pairs):
        if code not in codes.setdefault(status, []):
            codes[status].append(code)
    return codes


def _error_response(status: int, codes: list[str]) -> dict[str, Any]:
    schema = {
        "allOf": [{"$ref": "#/components/schemas/ErrorBody"}],
        "properties": {"error": {"properties": {"code": {"enum": codes}}}},
    }
    return {
        "description": f"{_REASONS.get(status, 'Error')}: {', '.join(codes)}",
        "content": {"application/json": {"schema": schema}},
    }


def build_document(routes: Iterable[Route]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``routes``, with every schema under components."""
    routes = list(routes)
    adapters: list[tuple[tuple[str, str, str], Any, TypeAdapter[Any]]] = []
    for route in routes:
        for method, operation in route.methods.items():
            if operation.body is not None:
                key = (route.template, method, "body")
                adapters.append((key, "validation", TypeAdapter(operation.body)))
            key = (route.template, method, "answer")
            adapters.append((key, "serialization", TypeAdapter(operation.answer)))
    adapters.append((("", "", "error"), "serialization", TypeAdapter(ErrorBody)))
    schemas, definitions = TypeAdapter.json_schemas(
        adapters, ref_template="#/components/schemas/{model}"
    )
    by_key = {key: schema for (key, _mode), schema in schemas.items()}

    paths: dict[str, Any] = {}
    for route in routes:
        item: dict[str, Any] = {}
        for method, operation in route.methods.items():
            item[method.lower()] = _operation(route, method, operation, by_key)
        paths[route.template] = item
    components = dict(definitions.get("$defs", {}))
    components.setdefault("ErrorBody", by_key[("", "", "error")])
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "harness daemon API",
            "version": _version(),
            "description": (
                "HTTP/1.1 + JSON over the daemon's Unix socket (DESIGN §9): "
                "curl --unix-socket $HARNESS_HOME/harness.sock http://h/v1/health. "
                'Every 4xx and 5xx answer is {"error": {"code", "message"}}; a method a '
                "path does not take is a 405 method_not_allowed with an Allow header."
            ),
        },
        "paths": paths,
        "components": {"schemas": components},
    }


def _operation(
    route: Route, method: str, operation: Operation, by_key: dict[tuple[str, str, str], Any]
) -> dict[str, Any]:
    parameters: list[dict[str, Any]] = [
        {
            "name": name,
            "in": "path",
            "required": True,
            "schema": {"type": "string", "pattern": f"^{ID_PATTERN}$"},
        }
        for name in route.path_params
    ]
    parameters += [
        {
            "name": param.name,
            "in": param.where,
            "required": False,
            "description": param.description,
            "schema": param.schema,
        }
        for param in operation.params
    ]
    answer = by_key[(route.template, method, "answer")]
    if operation.stream:
        # OpenAPI 3.1 has no word for a stream's items (3.2 adds itemSchema); by the
        # convention tools follow, the schema of a text/event-stream describes one event,
        # as 3.2's own example does: its fields, the data a JSON document of ``answer``.
        event = {
            "type": "object",
            "required": ["data"],
            "properties": {
                "id": {"type": "string", "pattern": "^[0-9]+$"},
                "event": {"const": "message"},
                "data": {
                    "type": "string",
                    "contentMediaType": "application/json",
                    "contentSchema": answer,
                },
            },
        }
        content = {"text/event-stream": {"schema": event}}
    else:
        content = {"application/json": {"schema": answer}}
    responses: dict[str, Any] = {
        str(operation.status): {
            "description": _SSE if operation.stream else operation.summary,
            "content": content,
        }
    }
    for status, codes in _errors_of(route, operation).items():
        responses[str(status)] = _error_response(status, codes)
    document: dict[str, Any] = {
        "operationId": _operation_id(route.template, method),
        "summary": operation.summary,
        "responses": responses,
    }
    if operation.description:
        document["description"] = operation.description
    if parameters:
        document["parameters"] = parameters
    if operation.body is not None:
        body_schema = by_key[(route.template, method, "body")]
        document["requestBody"] = {
            # An empty body reads as {}: required only when {} does not validate.
            "required": _needs_body(operation.body),
            "content": {"application/json": {"schema": body_schema}},
        }
    return document


def _needs_body(model: type[BaseModel]) -> bool:
    """Whether ``{}`` (what an empty body reads as) is refused: then the body is required."""
    try:
        model.model_validate({})
    except ValidationError:
        return True
    return False


def _operation_id(template: str, method: str) -> str:
    words = [w for w in re.split(r"[/{}]+", template) if w and w != "v1"]
    return "_".join([method.lower(), *words])
