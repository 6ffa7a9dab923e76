"""Request bodies whose cost does not grow with the history (issue 14).

Through the real harness and provider against the local wire server: within a turn, the
body of step N+1 holds the messages of step N's body byte for byte, then the new ones;
every Mistral body validates as the SDK's ``ChatCompletionStreamRequest``; and each
history message is built as an SDK model once, not once per step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from mistralai.client.models import ChatCompletionStreamRequest, ToolMessage
from wire_server import Reply, chunk, wire_server

from harness import Config, open_harness
from harness.messages.provider import (
    AssistantTurn,
    ProviderRequest,
    ToolCall,
    ToolResult,
    ToolSpec,
    UserTurn,
)
from harness.providers import mistral, openai
from harness.providers.sse import DRAIN_SECONDS, PostTemplate, aiter_sse_data, new_client

USAGE = {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}
STEPS = 6
# Ids the Mistral provider must normalize (too long, punctuation) and ones it keeps.
CALL_IDS = ["call_1", "AbC123xYz", "toolu_01ABCDEF-ghij", "Zz9Zz9Zz9", "call_5", "x"]


def _step(index: int) -> Reply:
    call = {
        "id": CALL_IDS[index],
        "type": "function",
        "function": {
            "name": "read",
            "arguments": json.dumps({"path": "notes.txt" if index % 2 else "package.json"}),
        },
        "index": 0,
    }
    # Some steps say something before calling, so assistant messages carry text too.
    text = [chunk(f"step {index} ✓ ")] if index % 3 == 0 else []
    return Reply(events=[*text, chunk(tool_calls=[call]), chunk(finish="tool_calls", usage=USAGE)])


def _answer() -> Reply:
    return Reply(events=[chunk("All read."), chunk(finish="stop", usage=USAGE)])


def messages_of(body: bytes) -> tuple[str, list[str], str]:
    """(text before the first message, each message's raw JSON text, text after the last).

    The raw texts are cut from the body itself, so comparing them compares bytes.
    """
    text = body.decode("utf-8")
    found = re.search(r'"messages": ?\[', text)
    assert found is not None
    decoder = json.JSONDecoder()
    position = found.end()
    raw: list[str] = []
    while text[position] != "]":
        _, end = decoder.raw_decode(text, position)
        raw.append(text[position:end])
        position = end
        if text[position] == ",":
            position += 1
            while text[position] == " ":
                position += 1
    return text[: found.end()], raw, text[position:]


async def _run_turn(tmp_path: Path, project: Path, model: str) -> list[bytes]:
    replies = [_step(i) for i in range(STEPS)] + [_answer()]
    async with wire_server(*replies) as server:
        config = Config(home=tmp_path / "home", model=model, base_url=server.url)
        async with open_harness(config) as h:
            session = await h.create_session(project)
            result = await h.run(session.id, "read the files, then answer")
    assert result.reason == "answered" and result.answer == "All read."
    return [r.body for r in server.requests]


@pytest.mark.parametrize("model", ["mistral/devstral-medium-latest", "openai/qwen2.5-coder"])
async def test_each_step_body_holds_the_previous_one_byte_for_byte_plus_the_new_messages(
    tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch, model: str
) -> None:
    monkeypatch.setenv("MISTRAL_API_KEY", "test-key")
    bodies = await _run_turn(tmp_path, project, model)
    assert len(bodies) == STEPS + 1
    split = [messages_of(body) for body in bodies]
    for (head, before, tail), (next_head, after, next_tail) in pairwise(split):
        assert next_head == head and next_tail == tail  # same model, tools and options
        assert after[: len(before)] == before
        # Each step adds its assistant message and its tool result.
        assert len(after) == len(before) + 2
    if model.startswith("mistral/"):
        for body in bodies:
            request = ChatCompletionStreamRequest.model_validate_json(body)
            ids = [
                call.id
                for message in request.messages
                if message.role == "assistant" and isinstance(message.tool_calls, list)
                for call in message.tool_calls
            ]
            results = [m.tool_call_id for m in request.messages if m.role == "tool"]
            assert ids == results
            assert all(isinstance(i, str) and re.fullmatch(r"[A-Za-z0-9]{9}", i) for i in ids)
        last = ChatCompletionStreamRequest.model_validate_json(bodies[-1])
        assert [m.role for m in last.messages] == ["system", "user"] + ["assistant", "tool"] * STEPS


async def test_each_history_message_is_built_as_an_sdk_model_once(
    tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MISTRAL_API_KEY", "test-key")
    built: list[str] = []

    class CountedToolMessage(ToolMessage):
        def __init__(self, **data: Any) -> None:
            built.append(str(data.get("tool_call_id")))
            super().__init__(**data)

    monkeypatch.setattr(mistral, "ToolMessage", CountedToolMessage)
    bodies = await _run_turn(tmp_path, project, "mistral/devstral-medium-latest")
    # Six tool results, each built (and validated) once: not 1 + 2 + … + 6 times.
    assert len(built) == STEPS
    assert len(set(built)) == STEPS
    assert ChatCompletionStreamRequest.model_validate_json(bodies[-1]).messages[-1].role == "tool"


TOOLS = tuple(
    ToolSpec(name, f'The {name} tool, "quoted" é', {"type": "object", "properties": {}})
    for name in ("read", "bash")
)
HISTORY = (
    UserTurn("héllo ✓ \u2028 \x00 </script>"),
    AssistantTurn("", (ToolCall("cal_0001xyz", "read", '{"path": "a"}'),)),
    ToolResult("cal_0001xyz", "read", "contents\n"),
    AssistantTurn(""),  # cancelled before any output: never sent
    AssistantTurn("thinking", (ToolCall("abcDEF123", "bash", ""),)),
    ToolResult("abcDEF123", "bash", "failed", is_error=True),
    AssistantTurn("done"),
    UserTurn("héllo ✓ \u2028 \x00 </script>"),  # the same message twice
)


@pytest.mark.parametrize("provider", [mistral, openai], ids=["mistral", "openai"])
def test_cached_bodies_are_the_bytes_of_encoding_the_whole_request(provider: Any) -> None:
    cache = provider.request_cache()
    requests = []
    for length in range(len(HISTORY) + 1):
        for options in ({}, {"max_tokens": 5, "temperature": 0.2}):
            for tools, choice in ((TOOLS, "auto"), ((), "none")):
                for system in ((), ("system a", "", "system b")):
                    history = HISTORY[:length]
                    requests.append(
                        ProviderRequest("devstral", system, history, tools, choice, **options)
                    )
    # A pruned view replaces an old tool output, then the full view comes back.
    pruned = (*HISTORY[:2], ToolResult("cal_0001xyz", "read", "[pruned]"), *HISTORY[3:])
    requests += [ProviderRequest("devstral", ("s",), pruned, TOOLS), requests[-1]]
    for index, request in enumerate(requests):
        expected = provider.encode_request(request)
        # Every other request as the providers take it: in parts, joined by the socket.
        assert (b"".join(cache.parts(request)) if index % 2 else cache.body(request)) == expected
        if provider is mistral:
            ChatCompletionStreamRequest.model_validate_json(cache.body(request))


_AFTERWARDS = """
import sys
import harness.providers.mistral as ours
assert "mistralai.client.sdk" not in sys.modules, "the SDK's client was imported"
assert "mistralai.client" not in sys.modules, "the stand-in package was left behind"
from mistralai.client import Mistral  # the real package, its __init__ run now
import mistralai.client.models as models
assert models.ChatCompletionStreamRequest is ours.ChatCompletionStreamRequest
assert models.CompletionChunk is ours.CompletionChunk
client = Mistral(api_key="x")
assert client.chat is not None
print("ok")
"""

_BEFORE = """
import sys
from mistralai.client import Mistral
import harness.providers.mistral as ours
import mistralai.client.models as models
assert models.ToolMessage is ours.ToolMessage
print("ok")
"""


_DEFERRED = """
import sys
import harness.providers.mistral as ours
assert "mistralai.client.models" not in sys.modules, "the models' stand-in was left behind"
assert "httpx2" not in sys.modules, "the SDK's HTTP library was imported"
serializers = sys.modules["mistralai.client.utils.serializers"]
import httpx2  # the real package, as anyone would get it
assert httpx2.__file__ and httpx2.Response.__module__.startswith("httpx2")
assert serializers.httpx.Response is httpx2.Response  # the proxy reaches the real one
assert serializers.stream_to_text(httpx2.Response(200, content=b"hi")) == "hi"
import mistralai.client.models as models
# The package body skipped at first runs now: its eagerly built models work.
assert models.And.model_validate({"matches": [{"field": "a", "value": 1, "type": "equal"}]})
assert models.UserMessage is ours.UserMessage
print("ok")
"""


@pytest.mark.parametrize(
    "probe", [_AFTERWARDS, _BEFORE, _DEFERRED], ids=["sdk-after", "sdk-before", "deferred"]
)
def test_the_provider_loads_only_the_sdk_models_and_the_full_sdk_still_works(probe: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def _self_signed(tmp_path: Path) -> ssl.SSLContext:
    """A TLS server context with a certificate no CA vouches for (made by openssl)."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-days", "1", "-keyout", str(key),
         "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context


async def test_a_plain_http_client_makes_no_tls_context_and_https_through_it_is_verified(
    tmp_path: Path,
) -> None:
    plain = new_client("http://127.0.0.1:9", httpx.Timeout(5.0), None)
    secure = new_client("https://api.mistral.ai", httpx.Timeout(5.0), None)
    server = trio.SSLListener(
        (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0], _self_signed(tmp_path)
    )
    port = server.transport_listener.socket.getsockname()[1]

    async def accept_one() -> None:
        stream = await server.accept()
        with contextlib.suppress(trio.BrokenResourceError, ssl.SSLError):
            await stream.do_handshake()
        await stream.aclose()

    try:
        assert plain._transport._ssl_context is None  # type: ignore[attr-defined]
        full = secure._transport._ssl_context  # type: ignore[attr-defined]
        assert full.cert_store_stats()["x509_ca"] > 0
        # Were an https URL to go through the plain client, its certificate is checked
        # (the default verified context then): a self-signed server is refused.
        async with trio.open_nursery() as nursery:
            nursery.start_soon(accept_one)
            with pytest.raises(httpx.ConnectError) as refused:
                await plain.get(f"https://127.0.0.1:{port}/")
        causes: list[BaseException] = []
        error: BaseException | None = refused.value
        while error is not None:
            causes.append(error)
            error = error.__cause__ or error.__context__
        assert any(isinstance(cause, ssl.SSLCertVerificationError) for cause in causes), causes
    finally:
        await server.aclose()
        await plain.aclose()
        await secure.aclose()


_NO_SSL = """
import sys
from harness import install_lean_imports
install_lean_imports()  # as the CLI does
import trio, httpx
from harness.providers.sse import new_client
client = new_client("http://127.0.0.1:9", httpx.Timeout(5.0), None)
assert "ssl" not in sys.modules and "_ssl" not in sys.modules, "ssl was imported"
import ssl  # and once anyone needs it, Trio's and httpcore's TLS code gets the real one
assert trio._ssl._stdlib_ssl.SSLContext is ssl.SSLContext
import httpcore._ssl
assert httpcore._ssl.default_ssl_context().verify_mode == ssl.CERT_REQUIRED
print("ok")
"""


_TLS_AFTER_LEAN_IMPORTS = """
import sys
from harness import install_lean_imports
install_lean_imports()  # as the CLI does: Trio and httpcore load with ssl deferred
import httpx, trio
assert "ssl" not in sys.modules
cert, key = sys.argv[1], sys.argv[2]

async def main():
    import ssl
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert, key)

    async def answer(stream):
        request = b""
        while b"\\r\\n\\r\\n" not in request:
            request += await stream.receive_some(4096)
        await stream.send_all(b"HTTP/1.1 200 OK\\r\\ncontent-length: 2\\r\\n\\r\\nok")
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_ssl_over_tcp, answer, 0, server_context)
        port = listeners[0].transport_listener.socket.getsockname()[1]
        trusted = ssl.create_default_context(cafile=cert)
        async with httpx.AsyncClient(verify=trusted) as client:
            reply = await client.get(f"https://127.0.0.1:{port}/")
        nursery.cancel_scope.cancel()
    print(reply.status_code, reply.text)

trio.run(main)
"""


def test_tls_works_through_the_deferred_ssl(tmp_path: Path) -> None:
    """Trio's and httpcore's TLS code, loaded with ssl deferred, make a real TLS exchange."""
    _self_signed(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", _TLS_AFTER_LEAN_IMPORTS, str(tmp_path / "cert.pem"),
         str(tmp_path / "key.pem")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "200 ok"


def test_a_plain_http_client_never_imports_ssl() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _NO_SSL], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_equal_messages_made_anew_are_not_encoded_again_and_dropped_ones_are_let_go() -> None:
    cache = mistral.request_cache()
    first = ProviderRequest("devstral", ("system",), HISTORY, TOOLS)
    body = cache.body(first)
    made = cache.encoded
    # History re-derives a changed message's view as new objects with equal content.
    copies = tuple(dataclasses.replace(m) for m in HISTORY)
    assert cache.body(ProviderRequest("devstral", ("system",), copies, TOOLS)) == body
    assert cache.encoded == made
    # A long run of views that each replace every tool output (pruned, then summarized).
    for round_ in range(40):
        view = tuple(
            ToolResult(m.call_id, m.name, f"[pruned {round_}]") if isinstance(m, ToolResult) else m
            for m in HISTORY
        )
        request = ProviderRequest("devstral", ("system",), view, TOOLS)
        assert cache.body(request) == mistral.encode_request(request)
    assert len(cache._by_value) <= 2 * (len(HISTORY) + 1) + 16


@pytest.mark.parametrize("model", ["mistral/devstral-medium-latest", "openai/qwen2.5-coder"])
async def test_a_turn_keeps_one_connection_to_a_keep_alive_server(
    tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch, model: str
) -> None:
    monkeypatch.setenv("MISTRAL_API_KEY", "test-key")
    replies = [_step(i) for i in range(3)] + [_answer()]
    async with wire_server(*replies, keep_alive=True) as server:
        config = Config(home=tmp_path / "home", model=model, base_url=server.url)
        async with open_harness(config) as h:
            session = await h.create_session(project)
            result = await h.run(session.id, "read the files, then answer")
    assert result.answer == "All read."
    # Reading each body to its end after [DONE] hands the connection back to the pool,
    # instead of a new connection (a TLS handshake, against a real API) every step.
    assert len(server.requests) == 4
    assert server.connections == 1


async def test_a_body_left_open_after_done_costs_at_most_the_drain_time() -> None:
    async def body() -> AsyncIterator[bytes]:
        yield b'data: {"a": 1}\n\ndata: [DONE]\n\n'
        await trio.sleep(3600)  # a server that never ends the body
        yield b"never"

    start = trio.current_time()
    with trio.fail_after(5):
        payloads = [p async for p in aiter_sse_data(body())]
    assert payloads == ['{"a": 1}']
    assert trio.current_time() - start < DRAIN_SECONDS + 1


@pytest.mark.parametrize("provider", [mistral, openai], ids=["mistral", "openai"])
def test_a_growing_history_encodes_each_message_once_whatever_the_view_does(
    provider: Any,
) -> None:
    cache = provider.request_cache()
    history: list[Any] = [UserTurn("go")]
    for step in range(30):
        call = ToolCall(f"call_{step}", "read", '{"path": "a"}')
        history += [
            AssistantTurn("" if step % 2 else "ok", (call,)),
            ToolResult(call.id, "read", "x"),
        ]
        request = ProviderRequest(
            "devstral", ("system", f"final {step}" * (step == 29)), tuple(history), TOOLS
        )
        assert cache.body(request) == provider.encode_request(request)
        # A retry sends the same bytes.
        assert cache.body(request) == provider.encode_request(request)
    # Each message once, the system text twice (it changed on the last step).
    assert cache.encoded == len(history) + 2


async def test_the_wire_cache_is_let_go_when_the_turn_ends(
    tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MISTRAL_API_KEY", "test-key")
    made: list[Any] = []
    replies = [_step(0), _answer()]
    async with wire_server(*replies) as server:

        def factory(model: str) -> Any:
            provider = mistral.MistralProvider(
                model.split("/", 1)[1], api_key="k", base_url=server.url
            )
            made.append(provider)
            return provider

        config = Config(home=tmp_path / "home", model="mistral/m", provider_factory=factory)
        async with open_harness(config) as h:
            session = await h.create_session(project)
            result = await h.run(session.id, "read, then answer")
            (provider,) = made
            cache = provider._requests
            assert result.answer == "All read."
            assert cache.encoded > 0
            # Between turns an idle session holds no copy of its history's wire form.
            assert not cache._by_identity and not cache._by_value and not cache._last_joined


@pytest.mark.parametrize("provider", ["mistral", "openai"])
def test_requests_made_from_the_template_are_the_ones_the_client_builds(provider: str) -> None:
    # The request's fixed parts are merged once per provider client (issue 14); every
    # request must still be exactly what ``client.build_request`` makes of the same call.
    client = httpx.AsyncClient(headers={"X-Lab": "1"})
    url = "http://127.0.0.1:9/v1/chat/completions"
    headers = {"Authorization": "Bearer k", "Content-Type": "application/json"}
    template = PostTemplate(client, url, headers)
    for body in (b"{}", b'{"messages": [1, 2, 3]}', b"x" * 70_000):
        made = template.request(body)
        built = client.build_request("POST", url, headers=headers, content=body)
        assert made.method == built.method and made.url == built.url
        assert made.headers.raw == built.headers.raw  # names, values and order
        assert made.extensions == built.extensions
        assert made.content == body
    # A cookie a server set is sent back, as the client would.
    client.cookies.set("session", "abc", domain="127.0.0.1")
    made = template.request(b"{}")
    assert made.headers["Cookie"] == "session=abc"
    assert made.headers.raw == client.build_request(
        "POST", url, headers=headers, content=b"{}"
    ).headers.raw


def test_template_requests_of_any_body_match_the_client_and_carry_their_body() -> None:
    client = httpx.AsyncClient()
    url = "https://api.example.org/v1/chat/completions?x=1"
    headers = {"Authorization": "Bearer k", "Accept": "text/event-stream"}
    template = PostTemplate(client, url, headers)
    for body in (b"[1]", b"", b"y" * 100_000, b"", "é ✓".encode()):
        made = template.request(body)
        built = client.build_request("POST", url, headers=headers, content=body)
        assert made.headers.raw == built.headers.raw, body[:10]
        assert made.url == built.url and made.content == body
        assert b"".join(made.stream) == body  # type: ignore[arg-type]


async def test_a_cookie_the_server_sets_comes_back_on_the_next_step(
    tmp_path: Path, project: Path
) -> None:
    first = _step(0)
    first.headers = [("Set-Cookie", "lb=node-7; Path=/")]
    async with wire_server(first, _step(1), _answer(), keep_alive=True) as server:

        def factory(model: str) -> Any:
            return mistral.MistralProvider(model.split("/", 1)[1], api_key="k", base_url=server.url)

        config = Config(home=tmp_path / "home", model="mistral/m", provider_factory=factory)
        async with open_harness(config) as h:
            session = await h.create_session(project)
            result = await h.run(session.id, "read, then answer")
    assert result.answer == "All read."
    cookies = [r.headers.get("cookie") for r in server.requests]
    assert cookies == [None, "lb=node-7", "lb=node-7"]
    assert [r.headers["authorization"] for r in server.requests] == ["Bearer k"] * 3
