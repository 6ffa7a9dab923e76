"""``openai/<model>``: any OpenAI-compatible chat-completions server (vLLM, llama.cpp, Ollama…).

Plain JSON by hand and no SDK: these servers differ in small ways (reasoning field name,
missing ids, usage only on request), so the parsing is deliberately lenient about shapes
and strict only about what we need.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from typing import Any

import httpx

from harness.messages.model import Tokens
from harness.messages.provider import (
    AssistantTurn,
    ProviderRequest,
    ReasoningDelta,
    TextDelta,
    UserTurn,
)
from harness.providers.errors import ProviderError
from harness.providers.pricing import PriceTable
from harness.providers.sse import (
    CallingEvents,
    ChatStream,
    PostTemplate,
    SSEData,
    error_for_body,
    message_of,
    new_client,
)
from harness.providers.wire import SystemText, WireCache, WireMessage, system_text

DEFAULT_BASE_URL = "https://api.openai.com/v1"
KEY_ENV = "OPENAI_API_KEY"
# Local servers may take minutes to load a model before the first byte.
TIMEOUT = httpx.Timeout(connect=15.0, read=600.0, write=60.0, pool=30.0)

# Where servers put reasoning text: vLLM, llama.cpp and DeepSeek say reasoning_content,
# Ollama and OpenRouter say reasoning.
_REASONING_KEYS = ("reasoning_content", "reasoning")


def new_tool_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def wire_message(turn: WireMessage) -> dict[str, Any] | None:
    """One message as the chat-completions API takes it; None for one never sent."""
    if isinstance(turn, SystemText):
        return {"role": "system", "content": turn.text}
    if isinstance(turn, UserTurn):
        return {"role": "user", "content": turn.text}
    if isinstance(turn, AssistantTurn):
        if not turn.text and not turn.tool_calls:
            return None
        message: dict[str, Any] = {"role": "assistant", "content": turn.text or None}
        if turn.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments or "{}"},
                }
                for call in turn.tool_calls
            ]
        return message
    return {"role": "tool", "tool_call_id": turn.call_id, "content": turn.content}


def build_body(request: ProviderRequest) -> dict[str, Any]:
    """The whole body as one dict: the reference the cached encoding must equal."""
    system = system_text(request)
    turns: list[WireMessage] = [system] if system is not None else []
    turns.extend(request.messages)
    return _body(request, [m for m in map(wire_message, turns) if m is not None])


def _body(request: ProviderRequest, messages: list[Any]) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": request.model,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": spec.name,
                    "description": spec.description,
                    "parameters": spec.parameters,
                },
            }
            for spec in request.tools
        ]
        body["tool_choice"] = request.tool_choice
        body["parallel_tool_calls"] = True
    if request.max_tokens is not None:
        body["max_tokens"] = request.max_tokens
    if request.temperature is not None:
        body["temperature"] = request.temperature
    return body


def _dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode("utf-8")


def encode_request(request: ProviderRequest) -> bytes:
    """The body in one go, every message converted and serialized again (the reference)."""
    return _dumps(build_body(request))


def encode_message(turn: WireMessage) -> bytes:
    message = wire_message(turn)
    return b"" if message is None else _dumps(message)


def request_cache() -> WireCache:
    """Bodies byte-identical to ``encode_request``, each message serialized once.

    ``json.dumps`` separates list items with ``", "``, so the fragments are joined so too.
    """
    return WireCache(
        encode_message,
        lambda request, messages: _dumps(_body(request, messages)),
        lambda text: {"role": "system", "content": text},
        separator=b", ",
    )


def tokens_of(usage: Any) -> Tokens:
    if not isinstance(usage, dict):
        return Tokens()
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens")
    return Tokens(
        input=prompt if isinstance(prompt, int) else 0,
        output=completion if isinstance(completion, int) else 0,
    )


def _parse_chunk(data: str) -> dict[str, Any]:
    try:
        chunk = json.loads(data)
    except ValueError:
        chunk = None
    if not isinstance(chunk, dict):
        raise ProviderError(f"openai: malformed stream chunk: {data[:200]!r}")
    if chunk.get("error") or chunk.get("object") == "error":
        raise error_for_body("openai", message_of(chunk) or data[:500])
    choices = chunk.get("choices") or []
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise ProviderError(f"openai: malformed stream chunk: {data[:200]!r}")
    return chunk


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


class OpenAIEvents(CallingEvents):
    """The events of one OpenAI-compatible reply: lenient about shapes (see the module)."""

    __slots__ = ()

    def __init__(self, data: SSEData, model: str, prices: PriceTable) -> None:
        super().__init__(data, "openai", model, prices)

    def take(self, payload: str) -> None:
        chunk = _parse_chunk(payload)
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        ready = self._ready
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta")
            if isinstance(delta, dict):
                for key in _REASONING_KEYS:
                    reasoning = delta.get(key)
                    if isinstance(reasoning, str) and reasoning:
                        ready.append(ReasoningDelta(reasoning))
                        break
                content = delta.get("content")
                if isinstance(content, str) and content:
                    ready.append(TextDelta(content))
                tool_calls = delta.get("tool_calls")
                if isinstance(tool_calls, list):
                    for position, call in enumerate(tool_calls):
                        if not isinstance(call, dict):
                            raise ProviderError(
                                f"openai: malformed tool call in chunk: {payload[:200]!r}"
                            )
                        function = call.get("function")
                        if not isinstance(function, dict):
                            function = {}
                        index = call.get("index")
                        arguments = function.get("arguments")
                        has_index = isinstance(index, int)
                        self._calls.add(
                            index if isinstance(index, int) else position,
                            _str(call.get("id")),
                            _str(function.get("name")),
                            arguments if isinstance(arguments, dict) else _str(arguments),
                            new_id_starts_call=not has_index,
                        )
            reason = choice.get("finish_reason")
            if isinstance(reason, str) and reason:
                self._finish = reason

    def tokens(self) -> Tokens:
        return tokens_of(self._usage)

    def new_call_id(self) -> str:
        return new_tool_call_id()


class OpenAIProvider:
    name = "openai"

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        http_client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        prices: PriceTable | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.model = model
        self.url = f"{(base_url or DEFAULT_BASE_URL).rstrip('/')}/chat/completions"
        # A named provider's own headers first: the ones the protocol needs win.
        self._headers = dict(headers or {})
        self._headers.update({"Content-Type": "application/json", "Accept": "text/event-stream"})
        # Local servers usually want no key at all; sending an empty Bearer upsets some.
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._owns_client = http_client is None
        self._client = (
            http_client
            if http_client is not None
            else new_client(self.url, TIMEOUT, transport)
        )
        self._prices = prices if prices is not None else PriceTable()
        self._post = PostTemplate(self._client, self.url, self._headers)
        self._requests = request_cache()

    def stream(self, request: ProviderRequest) -> ChatStream:
        return ChatStream(self._post, self._requests, request, self.name, KEY_ENV, self._events)

    def _events(self, data: SSEData, request: ProviderRequest) -> OpenAIEvents:
        return OpenAIEvents(data, request.model or self.model, self._prices)

    def forget_requests(self) -> None:
        """Drop the cached wire forms (the session calls this when a turn ends)."""
        self._requests.clear()

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()
