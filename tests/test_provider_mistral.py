"""The Mistral provider against a local server speaking Mistral's wire format."""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from wire_server import Reply, chunk, wire_server

from harness.messages.model import Tokens
from harness.messages.provider import (
    AssistantTurn,
    Finish,
    ProviderRequest,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallEvent,
    ToolResult,
    ToolSpec,
    UserTurn,
)
from harness.providers.errors import (
    AuthError,
    BadRequestError,
    ContextOverflowError,
    ProviderError,
    RetryableError,
    TruncatedStreamError,
)
from harness.providers.mistral import MistralProvider, chat_url, mistral_tool_call_id
from harness.providers.pricing import Price, PriceTable
from harness.providers.sse import SSEDecoder, aiter_sse_data, retry_after
from harness.providers.wire import SystemText

USAGE = {"prompt_tokens": 1200, "completion_tokens": 300, "total_tokens": 1500}
READ = ToolSpec(
    name="read",
    description="Read a file",
    parameters={"type": "object", "properties": {"path": {"type": "string"}}},
)


def request(*messages: Any, tools: tuple[ToolSpec, ...] = (), **kw: Any) -> ProviderRequest:
    return ProviderRequest(
        model=kw.pop("model", "devstral-medium-latest"),
        system=kw.pop("system", ("You are a coding agent.",)),
        messages=messages or (UserTurn("hi"),),
        tools=tools,
        **kw,
    )


async def collect(provider: MistralProvider, req: ProviderRequest) -> list[StreamEvent]:
    async with provider.stream(req) as events:
        return [event async for event in events]


async def run(*replies: Reply, req: ProviderRequest | None = None, **kw: Any) -> Any:
    async with wire_server(*replies) as server:
        provider = MistralProvider(
            "devstral-medium-latest", api_key="sk-test", base_url=server.url, **kw
        )
        try:
            events = await collect(provider, req or request())
        finally:
            await provider.aclose()
        return server, events


# --- happy paths -------------------------------------------------------------------------


async def test_text_stream_becomes_events_with_usage_and_cost() -> None:
    server, events = await run(
        Reply(
            events=[
                chunk("Hel"),
                chunk("lo"),
                chunk("", finish="stop", usage=USAGE),
            ]
        )
    )
    assert events[:2] == [TextDelta("Hel"), TextDelta("lo")]
    finish = events[-1]
    assert isinstance(finish, Finish)
    assert finish.reason == "stop"
    assert finish.usage == Tokens(input=1200, output=300)
    # devstral-medium-latest: $0.4 in, $2.0 out per million tokens.
    assert finish.cost == pytest.approx((1200 * 0.4 + 300 * 2.0) / 1e6)
    (received,) = server.requests
    assert received.method == "POST"
    assert received.path == "/v1/chat/completions"
    assert received.headers["authorization"] == "Bearer sk-test"
    body = received.json()
    assert body["model"] == "devstral-medium-latest"
    assert body["stream"] is True
    assert body["messages"] == [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "hi"},
    ]
    # No tools → no tool fields at all (the API rejects parallel_tool_calls without tools
    # on some models, and null values are not the same as absent).
    assert "tools" not in body
    assert "parallel_tool_calls" not in body
    assert "max_tokens" not in body


async def test_custom_price_table_and_unknown_model() -> None:
    _, events = await run(
        Reply(events=[chunk("x", finish="stop", usage=USAGE)]),
        prices=PriceTable({"devstral-medium-latest": Price(1.0, 10.0)}),
    )
    assert events[-1] == Finish("stop", Tokens(input=1200, output=300), cost=(1200 + 3000) / 1e6)
    _, events = await run(
        Reply(events=[chunk("x", finish="stop", usage=USAGE)]),
        req=request(model="some-new-model"),
    )
    assert isinstance(events[-1], Finish)
    assert events[-1].cost == 0.0


async def test_content_chunks_and_thinking() -> None:
    _, events = await run(
        Reply(
            events=[
                chunk([{"type": "thinking", "thinking": [{"type": "text", "text": "hmm"}]}]),
                chunk([{"type": "text", "text": "answer"}]),
                chunk(None, finish="stop"),
            ]
        )
    )
    assert events == [ReasoningDelta("hmm"), TextDelta("answer"), Finish("stop")]


async def test_tool_calls_split_across_chunks_are_accumulated() -> None:
    first = {"id": "AbCdEf123", "function": {"name": "read", "arguments": '{"pa'}, "index": 0}
    _, events = await run(
        Reply(
            events=[
                chunk("Reading. "),
                chunk(tool_calls=[first]),
                chunk(
                    tool_calls=[{"function": {"name": "", "arguments": 'th": "a.py"}'}, "index": 0}]
                ),
                chunk(
                    tool_calls=[
                        {
                            "id": "ZyXwVu987",
                            "function": {"name": "read", "arguments": {"path": "b.py"}},
                            "index": 1,
                        }
                    ]
                ),
                chunk(finish="tool_calls", usage=USAGE),
            ]
        ),
        req=request(tools=(READ,)),
    )
    assert events[0] == TextDelta("Reading. ")
    assert events[1:3] == [
        ToolCallEvent("AbCdEf123", "read", '{"path": "a.py"}'),
        ToolCallEvent("ZyXwVu987", "read", '{"path": "b.py"}'),
    ]
    assert isinstance(events[3], Finish)
    assert events[3].reason == "tool_calls"


async def test_parallel_whole_calls_with_default_index_are_kept_apart() -> None:
    # Mistral sends whole calls; the SDK's ToolCall.index defaults to 0 when absent.
    calls = [
        {"id": "aaaaaaaa1", "function": {"name": "read", "arguments": '{"path": "a"}'}},
        {"id": "bbbbbbbb2", "function": {"name": "read", "arguments": '{"path": "b"}'}},
    ]
    _, events = await run(
        Reply(events=[chunk(tool_calls=calls, finish="tool_calls")]),
        req=request(tools=(READ,)),
    )
    assert [e for e in events if isinstance(e, ToolCallEvent)] == [
        ToolCallEvent("aaaaaaaa1", "read", '{"path": "a"}'),
        ToolCallEvent("bbbbbbbb2", "read", '{"path": "b"}'),
    ]


async def test_history_from_another_provider_gets_consistent_9_char_ids() -> None:
    history = (
        UserTurn("look at both files"),
        AssistantTurn(
            "ok",
            tool_calls=(
                ToolCall("call_abc123xyz-long", "read", '{"path": "a.py"}'),
                ToolCall("toolu_01XyZ", "read", '{"path": "b.py"}'),
                ToolCall("Valid0009", "read", '{"path": "c.py"}'),
            ),
        ),
        ToolResult("call_abc123xyz-long", "read", "A"),
        ToolResult("toolu_01XyZ", "read", "B", is_error=True),
        ToolResult("Valid0009", "read", "C"),
        AssistantTurn("", tool_calls=(ToolCall("call_2", "read", ""),)),
        ToolResult("call_2", "read", "D"),
    )
    server, _ = await run(
        Reply(events=[chunk("done", finish="stop")]),
        req=request(*history, tools=(READ,), tool_choice="auto", max_tokens=100),
    )
    body = server.requests[0].json()
    assert body["parallel_tool_calls"] is True
    assert body["tool_choice"] == "auto"
    assert body["max_tokens"] == 100
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "read",
                "description": "Read a file",
                "parameters": READ.parameters,
            },
        }
    ]
    messages = body["messages"]
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "tool",
        "assistant",
        "tool",
    ]
    sent_ids = [c["id"] for c in messages[2]["tool_calls"]] + [
        c["id"] for c in messages[6]["tool_calls"]
    ]
    result_ids = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
    assert sent_ids == result_ids
    assert all(re.fullmatch(r"[A-Za-z0-9]{9}", i) for i in sent_ids)
    assert len(set(sent_ids)) == 4
    assert sent_ids[2] == "Valid0009"
    assert sent_ids[0] == mistral_tool_call_id("call_abc123xyz-long")
    assert messages[3]["name"] == "read"
    assert messages[3]["content"] == "A"
    assert messages[2]["content"] == "ok"
    # A tool-call-only turn sends no content, and empty arguments are sent as {}.
    assert "content" not in messages[6]
    assert messages[6]["tool_calls"][0]["function"]["arguments"] == "{}"


async def test_tool_choice_none_and_multiple_system_strings() -> None:
    server, _ = await run(
        Reply(events=[chunk("x", finish="stop")]),
        req=request(tools=(READ,), tool_choice="none", system=("one", "", "two")),
    )
    body = server.requests[0].json()
    assert body["tool_choice"] == "none"
    assert body["messages"][0] == {"role": "system", "content": "one\n\ntwo"}


def test_tool_call_id_normalization_is_deterministic() -> None:
    for raw in ("call_abc123xyz-long", "x", "", "toolu_01" * 10, "ünïcode"):
        out = mistral_tool_call_id(raw)
        assert re.fullmatch(r"[A-Za-z0-9]{9}", out)
        assert mistral_tool_call_id(raw) == out
    assert mistral_tool_call_id("abcDEF123") == "abcDEF123"
    assert mistral_tool_call_id("a") != mistral_tool_call_id("b")


def test_base_url_forms() -> None:
    assert chat_url(None) == "https://api.mistral.ai/v1/chat/completions"
    assert chat_url("http://h:1/") == "http://h:1/v1/chat/completions"
    assert chat_url("http://h:1/v1") == "http://h:1/v1/chat/completions"


# --- failures ----------------------------------------------------------------------------


def test_missing_key_fails_before_any_request() -> None:
    for key in (None, ""):
        with pytest.raises(AuthError, match="MISTRAL_API_KEY is not set"):
            MistralProvider("devstral-medium-latest", api_key=key)


async def test_missing_finish_is_truncated() -> None:
    with pytest.raises(TruncatedStreamError):
        await run(Reply(events=[chunk("partial")]))
    with pytest.raises(TruncatedStreamError):
        await run(Reply(events=[chunk("partial")], done=False))


async def test_truncation_after_text_reaches_caller_after_the_text() -> None:
    async with wire_server(Reply(events=[chunk("partial")])) as server:
        provider = MistralProvider("m", api_key="k", base_url=server.url)
        seen: list[StreamEvent] = []
        with pytest.raises(TruncatedStreamError):
            async with provider.stream(request()) as events:
                async for event in events:
                    seen.append(event)
        await provider.aclose()
    assert seen == [TextDelta("partial")]


async def test_malformed_chunk_is_a_provider_error() -> None:
    with pytest.raises(ProviderError, match="malformed") as info:
        await run(Reply(events=[chunk("a"), "{not json"]))
    assert not info.value.retryable
    with pytest.raises(ProviderError, match="malformed"):
        await run(Reply(events=[{"id": "x", "model": "m", "choices": [{"index": 0}]}]))


async def test_error_event_inside_stream() -> None:
    with pytest.raises(ContextOverflowError):
        await run(
            Reply(
                events=[
                    {
                        "object": "error",
                        "message": "Prompt contains 40000 tokens, too large for model "
                        "with 32768 maximum context length",
                    }
                ]
            )
        )


async def test_401_is_auth_error_with_clear_message() -> None:
    with pytest.raises(AuthError) as info:
        await run(Reply(status=401, body={"message": "Unauthorized", "request_id": "r"}))
    assert str(info.value) == "authentication failed: check MISTRAL_API_KEY"


async def test_400_surfaces_the_api_message() -> None:
    message = "Tool call id was call_1 but must be a-z, A-Z, 0-9, with a length of 9."
    with pytest.raises(BadRequestError) as info:
        await run(
            Reply(
                status=400,
                body={
                    "object": "error",
                    "message": message,
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "3280",
                },
            )
        )
    assert message in str(info.value)
    assert "HTTP 400" in str(info.value)


async def test_422_detail_list_is_readable() -> None:
    body = {"detail": [{"loc": ["body", "messages"], "msg": "Field required"}]}
    with pytest.raises(BadRequestError, match=r"body\.messages: Field required"):
        await run(Reply(status=422, body=body))


@pytest.mark.parametrize(
    "message",
    [
        "Prompt contains 140000 tokens and 0 draft tokens, too large for model with "
        "131072 maximum context length",
        "This model's maximum context length is 8192 tokens",
        "Input is too long for requested model.",
    ],
)
async def test_context_overflow_is_typed(message: str) -> None:
    with pytest.raises(ContextOverflowError, match="context overflow"):
        await run(Reply(status=400, body={"object": "error", "message": message}))


@pytest.mark.parametrize(
    ("status", "headers", "expected"),
    [
        (429, [("Retry-After", "1")], 1.0),
        (429, [("retry-after-ms", "250"), ("Retry-After", "9")], 0.25),
        (503, [], None),
        (500, [("Retry-After", "junk")], None),
    ],
)
async def test_retryable_statuses(
    status: int, headers: list[tuple[str, str]], expected: float | None
) -> None:
    with pytest.raises(RetryableError) as info:
        await run(Reply(status=status, headers=headers, body={"message": "slow down"}))
    assert info.value.retry_after == expected
    assert "slow down" in str(info.value)


def test_retry_after_http_date() -> None:
    headers = httpx.Headers({"Retry-After": "Wed, 21 Oct 2015 07:28:30 GMT"})
    assert retry_after(headers, now=1445412480.0) == pytest.approx(30.0)
    assert retry_after(headers, now=1445412600.0) == 0.0


async def test_connection_refused_is_retryable() -> None:
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()  # nothing listens on this port now
    provider = MistralProvider("m", api_key="k", base_url=f"http://127.0.0.1:{port}")
    with pytest.raises(RetryableError, match="connection failed"):
        await collect(provider, request())
    await provider.aclose()


async def test_disconnect_mid_stream_is_retryable() -> None:
    with pytest.raises(RetryableError):
        await run(Reply(events=[chunk("par")], abort=True))


async def test_cancel_mid_stream_closes_the_connection() -> None:
    async with wire_server(Reply(events=[chunk("first")], hang=True)) as server:
        provider = MistralProvider("m", api_key="k", base_url=server.url)
        got: list[StreamEvent] = []
        with trio.CancelScope() as scope:
            async with provider.stream(request()) as events:
                async for event in events:
                    got.append(event)
                    cancelled_at = trio.current_time()
                    scope.cancel()
                    await trio.sleep(10)  # the cancel lands here, inside the stream
        with trio.fail_after(2):
            await server.disconnected.wait()
        await provider.aclose()
    assert got == [TextDelta("first")]
    assert server.disconnected_at is not None
    assert server.disconnected_at - cancelled_at < 0.5


async def test_breaking_out_early_closes_the_connection() -> None:
    async with wire_server(Reply(events=[chunk("a"), chunk("b")], hang=True)) as server:
        provider = MistralProvider("m", api_key="k", base_url=server.url)
        async with provider.stream(request()) as events:
            async for _ in events:
                break
        with trio.fail_after(2):
            await server.disconnected.wait()
        await provider.aclose()


# --- SSE framing -------------------------------------------------------------------------


async def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def test_sse_framing() -> None:
    stream = _chunks(
        b": keep-alive\r\n\r\n",
        b'event: message\ndata: {"a":\n',
        b"data: 1}\r",
        b"\n\r\ndata:no-space\n\n",
        "data: line\u2028sep\n\n".encode(),
        b"data: [DONE]\n\n",
        b"data: after-done\n\n",
    )
    got = [d async for d in aiter_sse_data(stream)]
    assert got == ['{"a":\n1}', "no-space", "line\u2028sep"]


async def test_sse_cut_last_line_is_dropped() -> None:
    got = [d async for d in aiter_sse_data(_chunks(b"data: whole\n", b"data: {cut"))]
    assert got == ["whole"]


def _reference_sse(body: bytes) -> list[str]:
    """The data payloads of a whole body, read line by line as the SSE spec says (CRLF,
    CR or LF end a line); an unterminated last line is a cut, not data."""
    lines = re.split(rb"\r\n|\r|\n", body)[:-1]
    out: list[str] = []
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                payload, data = "\n".join(data), []
                if payload == "[DONE]":
                    return out
                out.append(payload)
            continue
        name, _, value = line.partition(b":")
        if name == b"data":  # a comment (":...") has no name
            data.append(value.removeprefix(b" ").decode("utf-8", "replace"))
    payload = "\n".join(data)
    if data and payload != "[DONE]":
        out.append(payload)
    return out


def _random_sse(rng: random.Random) -> bytes:
    values = [b'{"a": 1}', b"", b" two spaces", "caf\u00e9 \u2028 line".encode(), b"x: y",
              b"\xff\xfe", b"[DONE]", b"[DONE] not", b"data: nested"]  # fmt: skip
    lines: list[bytes] = []
    for _ in range(rng.randrange(0, 8)):
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            lines.append(rng.choice([b"data: ", b"data: ", b"data:", b"data"]) + rng.choice(values))
        if rng.random() < 0.2:
            lines.append(rng.choice([b": keep-alive", b"event: message", b"id: 7", b"retry: 1",
                                     b"dat: a", b"data : a", b"DATA: a"]))  # fmt: skip
        lines.append(b"")
    ends = [rng.choice([b"\n"] * 6 + [b"\r\n", b"\r"]) for _ in lines]
    body = b"".join(line + end for line, end in zip(lines, ends, strict=True))
    if rng.random() < 0.3:
        body += rng.choice([b"data: cut", b"data: [DONE]", b"data: last\r", b"\r"])
    return body


def test_sse_decoding_however_the_body_is_cut_is_the_spec_s() -> None:
    rng = random.Random(14)
    for _ in range(3000):
        body = _random_sse(rng)
        places = range(1, len(body))
        cuts = sorted(rng.sample(places, min(len(places), rng.randrange(0, 6))))
        decoder = SSEDecoder()
        got: list[str] = []
        for start, stop in itertools.pairwise([0, *cuts, len(body)]):
            got += decoder.feed(body[start:stop])
        got += decoder.end()
        assert got == _reference_sse(body), (body, cuts)


# --- the SDK surface this module relies on (mistralai pinned at 3.7.0) -------------------


def test_sdk_models_still_exist_with_the_fields_we_use() -> None:
    from mistralai.client import models

    expected = {
        "ChatCompletionStreamRequest": {
            "model",
            "messages",
            "tools",
            "tool_choice",
            "parallel_tool_calls",
            "max_tokens",
            "temperature",
            "stream",
        },
        "CompletionChunk": {"choices", "usage"},
        "CompletionResponseStreamChoice": {"index", "delta", "finish_reason"},
        "DeltaMessage": {"content", "tool_calls"},
        "ToolCall": {"id", "function", "index"},
        "FunctionCall": {"name", "arguments"},
        "UsageInfo": {"prompt_tokens", "completion_tokens"},
        "SystemMessage": {"content", "role"},
        "UserMessage": {"content", "role"},
        "AssistantMessage": {"content", "tool_calls", "role"},
        "ToolMessage": {"content", "tool_call_id", "name", "role"},
        "Tool": {"function", "type"},
        "Function": {"name", "description", "parameters"},
        "TextChunk": {"text"},
        "ThinkChunk": {"thinking"},
    }
    for name, fields in expected.items():
        model = getattr(models, name)
        assert fields <= set(model.model_fields), name


def test_the_unset_sentinel_is_its_own_copy_and_chunks_still_validate() -> None:
    import copy

    from mistralai.client.types import UNSET

    import harness.providers.mistral  # installs the copy

    assert copy.deepcopy(UNSET) is UNSET
    parsed = harness.providers.mistral.CompletionChunk.model_validate_json(
        '{"id": "c", "model": "m", "choices": [{"index": 0, "delta": {"content": "x"},'
        ' "finish_reason": null}]}'
    )
    assert parsed.choices[0].delta.content == "x"
    assert parsed.choices[0].delta.tool_calls is UNSET
    assert "tool_calls" not in parsed.model_dump(by_alias=True)["choices"][0]["delta"]


_NO_COPIES = """
from harness.providers import mistral  # first, as a run does: the SDK's models only
from mistralai.client.types import UNSET
copies = []
def counted(value, memo):
    copies.append(1)
    return value
type(UNSET).__deepcopy__ = counted  # whoever copies the sentinel is counted
model = mistral.chunk_model()  # built after the provider's import, as in a run
parsed = model.model_validate_json(
    '{"id": "c", "model": "m", "choices": [{"index": 0, "delta": {"role": "assistant",'
    ' "tool_calls": [{"id": "abcdefghi", "function": {"name": "read", "arguments": "{}"}}]},'
    ' "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": 3, "completion_tokens": 1,'
    ' "total_tokens": 4}}'
)
assert parsed.choices[0].delta.content is UNSET and parsed.usage.prompt_tokens == 3
assert type(UNSET)() == UNSET and hash(type(UNSET)()) == hash(UNSET)
print(len(copies))
"""


def test_validating_a_chunk_copies_no_default() -> None:
    """The SDK's ``UNSET`` defaults are taken as they are, not deep-copied per chunk."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _NO_COPIES], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"


# Texts a model or a tool may produce: JSON's escapes, controls, DEL, line and paragraph
# separators, astral characters; hypothesis adds the rest of Unicode (surrogates aside).
_AWKWARD = ["", '"', "\\", "\n\r\t\b\f", "\x00\x01\x1f\x7f", "\u2028\u2029", "é ✓ 😀", "</script>"]
_texts = st.one_of(st.sampled_from(_AWKWARD), st.text(max_size=40))
_calls = st.builds(
    ToolCall, st.one_of(st.sampled_from(["AbC123xYz", "call_1", ""]), _texts), _texts, _texts
)
_turns = st.one_of(
    st.builds(UserTurn, _texts),
    st.builds(SystemText, _texts),
    st.builds(ToolResult, _texts, _texts, _texts),
    st.builds(AssistantTurn, _texts, st.lists(_calls, max_size=3).map(tuple)),
)


@settings(max_examples=400, deadline=None)
@given(_turns)
def test_a_message_is_written_as_the_sdk_serializes_it(turn: Any) -> None:
    """``encode_message`` writes the JSON itself: it must be the SDK model's, byte for byte."""
    from harness.providers import mistral

    model = mistral.sdk_message(turn)
    expected = b"" if model is None else model.model_dump_json(by_alias=True).encode("utf-8")
    assert mistral.encode_message(turn) == expected


def test_a_lone_surrogate_goes_through_the_sdk_as_before() -> None:
    from harness.providers import mistral

    turn = ToolResult("call_1", "read", "bad \ud800 text")
    model = mistral.sdk_message(turn)
    assert model is not None
    try:
        expected: bytes | type[Exception] = model.model_dump_json(by_alias=True).encode("utf-8")
    except Exception as error:  # whatever the SDK does with it, encode_message does too
        expected = type(error)
    if isinstance(expected, bytes):
        assert mistral.encode_message(turn) == expected
    else:
        with pytest.raises(expected):
            mistral.encode_message(turn)
