"""The OpenAI-compatible provider against a local server speaking that wire format."""

from __future__ import annotations

from typing import Any

import pytest
import trio
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
from harness.providers.openai import OpenAIProvider
from harness.providers.pricing import Price, PriceTable

READ = ToolSpec("read", "Read a file", {"type": "object", "properties": {}})


def request(*messages: Any, tools: tuple[ToolSpec, ...] = (), **kw: Any) -> ProviderRequest:
    return ProviderRequest(
        model="qwen2.5-coder",
        system=("sys",),
        messages=messages or (UserTurn("hi"),),
        tools=tools,
        **kw,
    )


async def run(
    *replies: Reply, req: ProviderRequest | None = None, api_key: str | None = None, **kw: Any
) -> Any:
    async with wire_server(*replies) as server:
        provider = OpenAIProvider(
            "qwen2.5-coder", api_key=api_key, base_url=server.url + "/v1", **kw
        )
        try:
            async with provider.stream(req or request()) as events:
                got: list[StreamEvent] = [event async for event in events]
        finally:
            await provider.aclose()
        return server, got


def usage_chunk(prompt: int, completion: int) -> dict[str, Any]:
    out = chunk()
    out["choices"] = []
    out["usage"] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    return out


async def test_text_stream_with_usage_in_a_final_chunk() -> None:
    server, events = await run(
        Reply(
            events=[
                chunk("", extra_delta={"role": "assistant"}),
                chunk("Hi "),
                chunk("there"),
                chunk(None, finish="stop"),
                usage_chunk(10, 5),
            ]
        ),
        prices=PriceTable({"qwen2.5-coder": Price(1.0, 2.0)}),
    )
    assert events == [
        TextDelta("Hi "),
        TextDelta("there"),
        Finish("stop", Tokens(input=10, output=5), cost=(10 + 10) / 1e6),
    ]
    (received,) = server.requests
    assert received.path == "/v1/chat/completions"
    assert "authorization" not in received.headers
    body = received.json()
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi"},
    ]
    assert "tools" not in body


async def test_api_key_is_sent_when_given() -> None:
    server, _ = await run(Reply(events=[chunk("x", finish="stop")]), api_key="sk-1")
    assert server.requests[0].headers["authorization"] == "Bearer sk-1"


async def test_split_tool_call_arguments_and_ids_kept() -> None:
    history = (
        UserTurn("go"),
        AssistantTurn("", tool_calls=(ToolCall("AbCdEf123", "read", '{"p": 1}'),)),
        ToolResult("AbCdEf123", "read", "out"),
    )
    server, events = await run(
        Reply(
            events=[
                chunk(
                    extra_delta={"reasoning_content": "think"},
                ),
                chunk(
                    tool_calls=[
                        {
                            "index": 0,
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "read", "arguments": ""},
                        }
                    ]
                ),
                chunk(tool_calls=[{"index": 0, "function": {"arguments": '{"path":'}}]),
                chunk(
                    tool_calls=[
                        {"index": 1, "function": {"name": "read", "arguments": '{"path": "b"}'}}
                    ]
                ),
                chunk(tool_calls=[{"index": 0, "function": {"arguments": ' "a"}'}}]),
                chunk(None, finish="tool_calls"),
                usage_chunk(3, 4),
            ]
        ),
        req=request(*history, tools=(READ,)),
    )
    assert events[0] == ReasoningDelta("think")
    calls = [e for e in events if isinstance(e, ToolCallEvent)]
    assert calls[0] == ToolCallEvent("call_1", "read", '{"path": "a"}')
    # The server gave no id for the second call: one is made up.
    assert calls[1].name == "read"
    assert calls[1].arguments == '{"path": "b"}'
    assert calls[1].id.startswith("call_")
    assert events[-1] == Finish("tool_calls", Tokens(input=3, output=4))
    body = server.requests[0].json()
    assert body["parallel_tool_calls"] is True
    assert body["tool_choice"] == "auto"
    assert body["tools"][0]["function"]["name"] == "read"
    assistant = body["messages"][2]
    assert assistant["content"] is None
    assert assistant["tool_calls"] == [
        {
            "id": "AbCdEf123",
            "type": "function",
            "function": {"name": "read", "arguments": '{"p": 1}'},
        }
    ]
    assert body["messages"][3] == {"role": "tool", "tool_call_id": "AbCdEf123", "content": "out"}


async def test_tool_call_finishing_with_stop_is_reported_as_tool_calls() -> None:
    call = {"index": 0, "id": "c1", "function": {"name": "read", "arguments": "{}"}}
    _, events = await run(Reply(events=[chunk(tool_calls=[call]), chunk(None, finish="stop")]))
    assert isinstance(events[-1], Finish)
    assert events[-1].reason == "tool_calls"


async def test_missing_finish_is_truncated() -> None:
    with pytest.raises(TruncatedStreamError):
        await run(Reply(events=[chunk("par")]))


async def test_malformed_chunk() -> None:
    with pytest.raises(ProviderError, match="malformed"):
        await run(Reply(events=["[1, 2"]))
    with pytest.raises(ProviderError, match="malformed"):
        await run(Reply(events=[{"choices": "nope"}]))


async def test_error_event_inside_stream() -> None:
    with pytest.raises(ProviderError, match="model crashed") as info:
        await run(Reply(events=[{"error": {"message": "model crashed", "code": 500}}]))
    assert not isinstance(info.value, ContextOverflowError)


async def test_401_names_the_openai_key() -> None:
    with pytest.raises(AuthError) as info:
        await run(Reply(status=401, body={"error": {"message": "Incorrect API key"}}))
    assert str(info.value) == "authentication failed: check OPENAI_API_KEY"


async def test_400_message_and_overflow() -> None:
    with pytest.raises(BadRequestError, match="unknown model"):
        await run(Reply(status=404, body={"error": {"message": "unknown model 'x'"}}))
    overflow = (
        "This model's maximum context length is 32768 tokens. However, you requested "
        "40000 tokens. Please reduce the length of the messages."
    )
    with pytest.raises(ContextOverflowError):
        await run(Reply(status=400, body={"error": {"message": overflow, "type": "x"}}))


async def test_429_is_retryable_with_retry_after() -> None:
    with pytest.raises(RetryableError) as info:
        await run(Reply(status=429, headers=[("Retry-After", "3")], body="busy"))
    assert info.value.retry_after == 3.0
    assert "busy" in str(info.value)


async def test_cancel_mid_stream_closes_the_connection() -> None:
    async with wire_server(Reply(events=[chunk("first")], hang=True)) as server:
        provider = OpenAIProvider("m", base_url=server.url)
        with trio.CancelScope() as scope:
            async with provider.stream(request()) as events:
                async for _ in events:
                    cancelled_at = trio.current_time()
                    scope.cancel()
                    await trio.sleep(10)
        with trio.fail_after(2):
            await server.disconnected.wait()
        await provider.aclose()
    # Prompt, not eventual: the connection is closed on the way out of the cancel (about a
    # millisecond; benchmarks/provider.py measures it). The bound is loose against CI jitter.
    assert server.disconnected_at is not None
    assert server.disconnected_at - cancelled_at < 0.5


async def test_disconnect_mid_stream_is_retryable() -> None:
    with pytest.raises(RetryableError):
        await run(Reply(events=[chunk("par")], abort=True))


async def test_500_is_retryable_and_names_the_status() -> None:
    with pytest.raises(RetryableError, match="HTTP 500: overloaded"):
        await run(Reply(status=500, body={"error": {"message": "overloaded"}}))


async def test_explicit_index_wins_over_changing_ids() -> None:
    # Some servers put a fresh id on every fragment of one call; the index says it is one.
    _, events = await run(
        Reply(
            events=[
                chunk(
                    tool_calls=[
                        {"index": 0, "id": "c1", "function": {"name": "read", "arguments": "{"}}
                    ]
                ),
                chunk(tool_calls=[{"index": 0, "id": "c2", "function": {"arguments": "}"}}]),
                chunk(None, finish="tool_calls"),
            ]
        )
    )
    assert [e for e in events if isinstance(e, ToolCallEvent)] == [
        ToolCallEvent("c1", "read", "{}")
    ]
