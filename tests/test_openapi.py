"""``GET /v1/openapi.json`` (issue 17, DESIGN §13): the document, and the daemon held to it.

- Every route of the server's own table is in the document, and nothing else is.
- The document validates as OpenAPI 3.1 (``openapi-spec-validator``).
- Schemathesis, property-based, against a real ``harness serve`` subprocess reached over a
  loopback TCP forwarder (its client speaks TCP only): no 5xx, and every answer (status,
  content type, body, the event stream's payloads) matches the document.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import schemathesis
from daemons import wait_for_daemon
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openapi_spec_validator import OpenAPIV31SpecValidator
from pydantic import ValidationError
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from harness import server
from harness.client import Client
from harness.openapi import ID_PATTERN, build_document


def _example_path(template: str) -> str:
    return template.replace("{session_id}", "ses_x").replace("{permission_id}", "per_x").replace(
        "{question_id}", "que_x"
    )


def test_every_route_in_the_table_is_in_the_document() -> None:
    """Derived from the route table: a route added without its description fails here."""
    document = build_document(server.ROUTES)
    listed = {(template, method.upper()) for template, item in document["paths"].items()
              for method in item}
    served = {(route.template, method) for route in server.ROUTES for method in route.methods}
    assert listed == served
    for route in server.ROUTES:
        path = _example_path(route.template)
        assert "{" not in path, f"an example id is missing for {route.template}"
        for method, operation in route.methods.items():
            # The template is the path the server matches: the same handler answers it.
            found, ids = server.route(method, path)
            assert found is operation
            assert len(ids) == len(route.path_params)
            described = document["paths"][route.template][method.lower()]
            assert str(operation.status) in described["responses"]
            assert all(
                "application/json" in answer["content"]
                for status, answer in described["responses"].items()
                if status.startswith(("4", "5"))
            )


def test_the_document_validates_as_openapi_3_1() -> None:
    document = build_document(server.ROUTES)
    assert document["openapi"].startswith("3.1")
    OpenAPIV31SpecValidator(document).validate()


def test_importing_the_server_does_not_build_the_document() -> None:
    """Built on the first request: neither ``harness --help`` nor ``serve``'s start pays."""
    probe = "import harness.server as s; assert s._document.cache_info().currsize == 0"
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60)


# JSON Schema 2020-12 and OpenAPI's own keywords. A misspelt one is valid JSON Schema (an
# unknown keyword is ignored), so the validator cannot see it: a BeforeValidator once made
# pydantic write "ge"/"le" for max_steps, a limit no client would have seen.
KEYWORDS = {
    "$ref", "$defs", "type", "enum", "const", "anyOf", "oneOf", "allOf", "not",
    "properties", "required", "additionalProperties", "items", "prefixItems",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
    "pattern", "minItems", "maxItems", "uniqueItems", "format", "default", "title",
    "description", "discriminator", "contentMediaType", "contentSchema", "examples",
}
_NAMED = {"properties", "$defs"}  # keys of these are names, not keywords


def _schema_keywords(schema: Any, found: set[str]) -> None:
    if isinstance(schema, list):
        for item in schema:
            _schema_keywords(item, found)
    if not isinstance(schema, dict):
        return
    for key, value in schema.items():
        found.add(key)
        if key in _NAMED and isinstance(value, dict):
            for item in value.values():
                _schema_keywords(item, found)
        elif key not in ("discriminator", "default", "const", "enum", "examples"):
            _schema_keywords(value, found)


def _schemas_of(document: dict[str, Any]) -> Iterator[Any]:
    yield from document["components"]["schemas"].values()
    for item in document["paths"].values():
        for operation in item.values():
            for parameter in operation.get("parameters", []):
                yield parameter["schema"]
            for media in operation.get("requestBody", {}).get("content", {}).values():
                yield media["schema"]
            for answer in operation["responses"].values():
                for media in answer.get("content", {}).values():
                    yield media["schema"]


def test_every_schema_keyword_is_a_real_one() -> None:
    found: set[str] = set()
    for schema in _schemas_of(build_document(server.ROUTES)):
        _schema_keywords(schema, found)
    assert found <= KEYWORDS, found - KEYWORDS


def _body_schema(document: dict[str, Any], path: str, method: str) -> dict[str, Any]:
    body = document["paths"][path][method]["requestBody"]
    # The document's own $refs resolve against the document itself as the root.
    return {**body["content"]["application/json"]["schema"], "components": document["components"]}


@pytest.mark.parametrize(
    ("path", "method", "body", "valid"),
    [
        # The question reply's either/or rule was in a model validator only: {} fitted the
        # document and was then refused (found by schemathesis).
        ("/v1/questions/{question_id}", "post", {}, False),
        ("/v1/questions/{question_id}", "post", {"answers": [["a"]], "reject": True}, False),
        ("/v1/questions/{question_id}", "post", {"answers": [["a"]]}, True),
        ("/v1/questions/{question_id}", "post", {"reject": True, "message": "no"}, True),
        ("/v1/questions/{question_id}", "post", {"reject": False}, False),
        # JSON's 10.0 is an integer to JSON Schema, and now to the server (found by it).
        ("/v1/sessions/{session_id}/prompt", "post", {"text": "x", "max_steps": 10.0}, True),
        ("/v1/sessions/{session_id}/prompt", "post", {"text": "x", "max_steps": 10.5}, False),
        ("/v1/sessions/{session_id}/prompt", "post", {"text": "x", "max_steps": 10001}, False),
        ("/v1/sessions/{session_id}/prompt", "post", {"text": ""}, False),
        ("/v1/sessions", "post", {"title": "t", "delivry": "queue"}, False),
        ("/v1/sessions", "post", {}, True),
    ],
)
def test_the_document_and_the_validator_agree(
    path: str, method: str, body: dict[str, Any], valid: bool
) -> None:
    document = build_document(server.ROUTES)
    described = jsonschema.Draft202012Validator(_body_schema(document, path, method))
    assert described.is_valid(body) is valid
    operation = next(r.methods[method.upper()] for r in server.ROUTES if r.template == path)
    assert operation.body is not None
    try:
        operation.body.model_validate(body)
    except ValidationError:
        assert not valid
    else:
        assert valid
    required = document["paths"][path][method]["requestBody"]["required"]
    assert required is not described.is_valid({})


# --- the live daemon ---------------------------------------------------------------------


class Forwarder:
    """127.0.0.1:<port> → a Unix socket: one pair of pumping threads per connection."""

    def __init__(self, target: Path) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                upstream.connect(str(self.target))
            except OSError:
                client.close()
                continue
            self._sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with suppress(OSError):
                sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.listener.close()
        for sock in self._sockets:
            with suppress(OSError):
                sock.close()


# A turn that uses the tools whose records the API answers with: a todo list, a file
# written (a diff, a revert), then an answer.
SCRIPT = [
    {
        "tool_calls": [
            {
                "name": "todowrite",
                "arguments": {"todos": [{"content": "write it", "status": "in_progress"}]},
            },
            {"name": "write", "arguments": {"path": "made.txt", "content": "one\ntwo\n"}},
        ]
    },
    {"text": "Done."},
]


class Live:
    def __init__(self, root: Path, process: subprocess.Popen[bytes], client: Client) -> None:
        self.root = root
        self.process = process
        self.client = client
        self.forwarder = Forwarder(client.socket_path)
        self.base_url = f"http://127.0.0.1:{self.forwarder.port}"
        self.sessions: list[str] = []  # each with a finished turn that wrote a file
        self.disposable: list[str] = []  # for DELETE, which would take the others away


def _wait_idle(client: Client, session_id: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while client.session(session_id)["status"] != "idle" or not client.messages(session_id):
        assert time.monotonic() < deadline, "the turn never finished"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    root = Path(tempfile.mkdtemp(prefix="ho", dir="/tmp"))
    project = root / "project"
    project.mkdir()
    script = root / "script.json"
    script.write_text(json.dumps(SCRIPT))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HARNESS_", "MISTRAL_"))}
    # The default model is scripted too: a session the fuzzer creates calls no real model.
    env |= {
        "HARNESS_HOME": str(root / "home"),
        "HARNESS_SOCKET": str(root / "h.sock"),
        "HARNESS_MODEL": f"scripted:{script}",
    }
    log = root / "daemon.log"
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "harness", "serve"], stderr=out, env=env, cwd=project
        )
    try:
        client = wait_for_daemon(process, root / "h.sock", log)
        state = Live(root, process, client)
        for _ in range(2):
            session = client.create_session(directory=str(project), permission=[
                {"permission": "*", "pattern": "*", "action": "allow"}
            ])
            client.prompt(session["id"], "make the file")
            _wait_idle(client, session["id"])
            state.sessions.append(session["id"])
        state.disposable = [client.create_session(directory=str(project))["id"] for _ in range(3)]
        yield state
        state.forwarder.close()
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
        if process.returncode not in (0, -15):
            print(log.read_text())
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def api(live: Live) -> Any:
    document = json.loads(_get(live, "/v1/openapi.json"))
    schema = schemathesis.openapi.from_dict(
        document,
        config=schemathesis.Config.from_dict(
            {
                "base-url": live.base_url,
                "request-timeout": 2.0,
                "max-stream-events": 20,
                "phases": {"stateful": {"enabled": False}, "coverage": {"enabled": False}},

                "operations": [
                    # A stream ends only when the client leaves: read for a moment.
                    {"include-path": "/v1/events", "request-timeout": 0.2}
                ],
            }
        ),
    )
    def flatmap_path_parameters(context: Any, path_parameters: dict[str, Any]) -> Any:
        # Half the cases aim at a real session, so the answers with real content (messages
        # with tool parts, todos, a diff) are checked too, not only 404s.
        if not path_parameters or "session_id" not in path_parameters:
            return st.just(path_parameters)
        if not re.fullmatch(ID_PATTERN, str(path_parameters["session_id"])):
            return st.just(path_parameters)  # a negative case: keep it invalid
        deleting = context.operation is not None and context.operation.method.upper() == "DELETE"
        real = live.disposable if deleting else live.sessions
        # Real ones first and twice as likely: hypothesis leans towards the first choices.
        choices = [*real, *real, path_parameters["session_id"]]
        return st.fixed_dictionaries({"session_id": st.sampled_from(choices)})

    schema.hooks.hook(flatmap_path_parameters)
    return schema


def _get(live: Live, path: str) -> bytes:
    with socket.create_connection(("127.0.0.1", live.forwarder.port), timeout=10) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nhost: h\r\nconnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return body


def test_the_daemon_serves_the_document_it_is_generated_from(live: Live) -> None:
    served = json.loads(_get(live, "/v1/openapi.json"))
    assert served == build_document(server.ROUTES)
    assert json.loads(_get(live, "/v1/openapi.json")) == served  # the cached copy


def _request(live: Live, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = b"" if body is None else json.dumps(body).encode()
    head = f"{method} {path} HTTP/1.1\r\nhost: h\r\ncontent-length: {len(data)}\r\n"
    with socket.create_connection(("127.0.0.1", live.forwarder.port), timeout=10) as sock:
        sock.sendall(head.encode() + b"connection: close\r\n\r\n" + data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2])


def test_an_integral_float_is_a_step_limit(live: Live) -> None:
    """Regression (schemathesis): ``max_steps: 2.0`` fits the document (a JSON integer)
    and was refused 422 by the strict validator."""
    script = live.root / "answer.json"
    script.write_text(json.dumps([{"text": "one"}, {"text": "two"}]))
    session = live.client.create_session(
        directory=str(live.root / "project"), model=f"scripted:{script}"
    )["id"]
    status, body = _request(
        live, "POST", f"/v1/sessions/{session}/prompt", {"text": "hi", "max_steps": 2.0}
    )
    assert status == 202, body
    _wait_idle(live.client, session)
    user = [m["info"] for m in live.client.messages(session) if m["info"]["role"] == "user"]
    assert user[-1]["max_steps"] == 2
    status, body = _request(
        live, "POST", f"/v1/sessions/{session}/prompt", {"text": "hi", "max_steps": 2.5}
    )
    assert status == 422 and body["error"]["code"] == "invalid_body"


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("TRACE", "/v1/sessions", "GET, POST"),
        ("PUT", "/v1/sessions/ses_x", "DELETE, GET, PATCH"),
        ("DELETE", "/v1/openapi.json", "GET"),
    ],
)
def test_a_405_says_what_the_path_allows(live: Live, method: str, path: str, allowed: str) -> None:
    """Regression (schemathesis, ST204): RFC 9110 wants an ``Allow`` header on a 405."""
    with socket.create_connection(("127.0.0.1", live.forwarder.port), timeout=10) as sock:
        sock.sendall(f"{method} {path} HTTP/1.1\r\nhost: h\r\nconnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0].startswith("HTTP/1.1 405")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    assert headers["allow"] == allowed.lower()
    assert json.loads(body)["error"]["code"] == "method_not_allowed"


def test_a_bad_after_is_refused_beside_a_good_last_event_id(live: Live) -> None:
    """Regression (schemathesis): the header won, so ``after=abc`` went unchecked and the
    stream opened (200) where the document promises 400."""
    with socket.create_connection(("127.0.0.1", live.forwarder.port), timeout=10) as sock:
        sock.sendall(
            b"GET /v1/events?after=abc HTTP/1.1\r\nhost: h\r\nlast-event-id: 5\r\n"
            b"connection: close\r\n\r\n"
        )
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), head
    assert json.loads(body)["error"]["code"] == "bad_after"


@pytest.mark.parametrize(
    "path", ["/v1/events?sesion=ses_x", "/v1/sessions?limit=1", "/v1/permissions?after=1"]
)
def test_an_unknown_query_parameter_is_refused(live: Live, path: str) -> None:
    """Regression (schemathesis): an unknown parameter was ignored, so a misspelt
    ``sesion`` streamed every session's events; now a 422 names it, as for a body."""
    status, body = _request(live, "GET", path)
    name = path.partition("?")[2].partition("=")[0]
    assert status == 422, body
    assert body["error"]["code"] == "invalid_query" and repr(name) in body["error"]["message"]


# What the server answers when a request does not fit the schema it documents.
MALFORMED = {"invalid_body", "malformed_json", "invalid_query", "bad_after"}


def schema_valid_input_is_well_formed(ctx: Any, response: Any, case: Any) -> bool | None:
    """Schemathesis's ``positive_data_acceptance`` wants a 2xx for every schema-valid
    request, but a well-formed one may still be refused for what it means (a directory
    that does not exist: 422 ``invalid_session``). What must never happen is a refusal
    *as malformed*: that would mean the document and the validator disagree."""
    if not case.meta.generation.mode.is_positive or response.status_code not in (400, 422):
        return None
    code = response.json()["error"]["code"]
    assert code not in MALFORMED, f"a schema-valid request was refused as malformed: {code}"
    return None


NO_SUCCESS_WITHOUT_STATE = {
    ("/v1/permissions/{permission_id}", "POST"),
    ("/v1/questions/{question_id}", "POST"),
    ("/v1/sessions/{session_id}/revert", "POST"),
}


def route_status(path: str, method: str) -> int:
    return next(r.methods[method].status for r in server.ROUTES if r.template == path)


OPERATIONS = [(route.template, method) for route in server.ROUTES for method in route.methods]
EXAMPLES = 5  # per operation and mode: ~170 requests (with the coverage run ~20 s at load 7)


@pytest.mark.parametrize(("path", "method"), OPERATIONS, ids=[f"{m} {p}" for p, m in OPERATIONS])
def test_the_daemon_answers_as_its_document_says(
    path: str, method: str, api: Any, live: Live
) -> None:
    """Schemathesis's own checks on each answer: not a server error, a documented status
    and content type, a body (or each event) that fits its schema, invalid input refused
    and valid input accepted. (Its pytest plugin does not run under pytest 9.2, so its
    strategies are driven from here with ``given``.)"""
    operation = api[path][method]
    cases = st.one_of(
        operation.as_strategy(GenerationMode.POSITIVE, hooks=api.hooks),
        operation.as_strategy(GenerationMode.NEGATIVE, hooks=api.hooks),
    )

    seen: set[int] = set()

    @settings(
        max_examples=2 * EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=cases)
    def answers_as_documented(case: Any) -> None:
        response = case.call_and_validate(
            base_url=live.base_url,
            excluded_checks=[positive_data_acceptance],
            additional_checks=[schema_valid_input_is_well_formed],
        )
        seen.add(response.status_code)

    answers_as_documented()
    # Not only refusals: each operation was also answered with success and a real body
    # (a reply to an ask or question needs one pending, and a revert a real message id).
    if (path, method) not in NO_SUCCESS_WITHOUT_STATE:
        assert route_status(path, method) in seen, sorted(seen)


COVERAGE_CONFIG = """
request-timeout = 5.0

[phases.coverage]
unexpected-methods = ["PUT"]  # one of the seven: the run stays short

[phases.coverage.generation]
mode = "negative"  # the invalid half: the fuzzing run above draws the valid boundaries too
"""


def test_the_daemon_passes_schemathesis_coverage_phase(live: Live, tmp_path: Path) -> None:
    """The deterministic half, through schemathesis's own command line: boundary values of
    every constraint, missing and wrong-typed bodies, and every method a path does not
    take (the 405 needs its Allow header). Its positive-data check is left out: a
    well-formed request may be refused for what it means (see the custom check above)."""
    config = tmp_path / "schemathesis.toml"
    config.write_text(COVERAGE_CONFIG)
    done = subprocess.run(
        [
            sys.executable, "-m", "schemathesis.cli", "--no-color", "--config-file",
            str(config), "run", f"{live.base_url}/v1/openapi.json", "--phases", "coverage",
            "--exclude-checks", "positive_data_acceptance",
            # Each stream case waits out its read; the fuzzing run above covers the route.
            "--exclude-path", "/v1/events",
        ],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout.splitlines()[-1]
