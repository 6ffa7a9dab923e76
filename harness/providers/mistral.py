"""``mistral/<model>``: Mistral's chat completions, typed by the ``mistralai`` SDK (DESIGN §6).

The SDK supplies the request and chunk models only. Its own ``stream_async`` is
asyncio-only (it fails under Trio) and parses chunks about 14x slower, so the stream is
read over a Trio-native httpx client and each ``data:`` line is validated directly with
``CompletionChunk``. The registry imports this module lazily, and only the SDK's models
are loaded, not its client (``sdk_models``): ~0.1 s instead of ~0.2 s.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import secrets
import string
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pydantic
import pydantic_core

from harness import machine_cache
from harness.messages.model import Tokens
from harness.messages.provider import (
    AssistantTurn,
    ProviderRequest,
    ReasoningDelta,
    TextDelta,
    UserTurn,
)
from harness.providers.errors import AuthError, ProviderError
from harness.providers.pricing import PriceTable
from harness.providers.sdk_models import models_without_the_client
from harness.providers.sse import (
    CallingEvents,
    ChatStream,
    PostTemplate,
    SSEData,
    error_for_body,
    message_of,
    new_client,
)
from harness.providers.table import default_prices
from harness.providers.wire import SystemText, WireCache, WireMessage, system_text

with models_without_the_client():  # the models only: not the SDK's client (see there)
    # Each from the module that defines it: the models package's own body is not needed.
    from mistralai.client.models.assistantmessage import AssistantMessage
    from mistralai.client.models.functioncall import FunctionCall
    from mistralai.client.models.systemmessage import SystemMessage
    from mistralai.client.models.textchunk import TextChunk
    from mistralai.client.models.thinkchunk import ThinkChunk
    from mistralai.client.models.toolcall import ToolCall
    from mistralai.client.models.toolmessage import ToolMessage
    from mistralai.client.models.usermessage import UserMessage
    from mistralai.client.types import UNSET

if TYPE_CHECKING:
    from mistralai.client.models.chatcompletionstreamrequest import ChatCompletionStreamRequest
    from mistralai.client.models.completionchunk import CompletionChunk
    from mistralai.client.models.function import Function
    from mistralai.client.models.tool import Tool
    from mistralai.client.models.usageinfo import UsageInfo


@functools.cache
def chunk_model() -> type[CompletionChunk]:
    """The SDK's stream chunk model, imported when the first response begins (~8 ms).

    A run's first request does not need it, and a reply's headers come before its first
    token: imported then, it costs the wait for the model instead of the start-up.
    """
    with models_without_the_client():
        from mistralai.client.models.completionchunk import CompletionChunk
    return CompletionChunk


@functools.cache
def request_models() -> tuple[type[ChatCompletionStreamRequest], type[Tool], type[Function]]:
    """The SDK's request model and its tools' models, imported when a frame is made.

    ``ChatCompletionStreamRequest`` names every field of the API (guardrails, connectors,
    prediction…): 23 modules of models, ~25 ms and ~1 MB that only the request's frame
    (all but its messages) needs, and the CLI keeps the frames it made in the machine's
    cache (``harness.machine_cache``): a run whose tools and options were seen before
    sends its first request without them.
    """
    with models_without_the_client():
        from mistralai.client.models.chatcompletionstreamrequest import (
            ChatCompletionStreamRequest,
        )
        from mistralai.client.models.function import Function
        from mistralai.client.models.tool import Tool
    return ChatCompletionStreamRequest, Tool, Function


_REQUEST_MODELS = {"ChatCompletionStreamRequest": 0, "Tool": 1, "Function": 2}


def __getattr__(name: str) -> Any:
    if name in ("CompletionChunk", "UsageInfo"):  # the SDK's, as the rest of the models
        return getattr(sys.modules[chunk_model().__module__], name)
    if name in _REQUEST_MODELS:
        return request_models()[_REQUEST_MODELS[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


DEFAULT_BASE_URL = "https://api.mistral.ai"
KEY_ENV = "MISTRAL_API_KEY"
TIMEOUT = httpx.Timeout(connect=15.0, read=300.0, write=60.0, pool=30.0)

_ID_ALPHABET = string.ascii_letters + string.digits
_VALID_ID = re.compile(r"[A-Za-z0-9]{9}\Z")

ChatMessage = SystemMessage | UserMessage | AssistantMessage | ToolMessage


def _itself(value: object, memo: object) -> object:
    return value


# pydantic deep-copies every default it cannot prove immutable, and the SDK's ``UNSET``
# default is a model instance: validating one chunk made seven deep copies, about 15 of
# its 20 µs. The sentinel is a field-less singleton, so it may be its own copy.
if "__deepcopy__" not in type(UNSET).__dict__:
    setattr(type(UNSET), "__deepcopy__", _itself)  # noqa: B010 - a class attribute, on purpose


def _unset_hash(value: object) -> int:
    return 0  # every Unset equals every other (a model without fields): one hash for all


# Still, each of those defaults cost a call to ``copy.deepcopy`` per validation (seven a
# chunk, ~1 µs each): pydantic-core copies a default only when it is unhashable, and
# decides so when a model is built. The SDK's BaseModel defines ``__eq__``, so Unset has
# no hash; given one here, the models built from now on (the stream chunk's, loaded at
# the first response) take the sentinel as it is.
if type(UNSET).__hash__ is None:
    setattr(type(UNSET), "__hash__", _unset_hash)  # noqa: B010 - a class attribute, on purpose


def mistral_tool_call_id(raw: str) -> str:
    """The id Mistral accepts (exactly 9 of ``[A-Za-z0-9]``) for any id, deterministically.

    Valid ids are kept; others are hashed, so a call and its result map to the same id
    wherever they occur, including history written by another provider.
    """
    if _VALID_ID.match(raw):
        return raw
    number = int.from_bytes(hashlib.sha256(raw.encode("utf-8")).digest()[:8], "big")
    chars = []
    for _ in range(9):
        number, rest = divmod(number, len(_ID_ALPHABET))
        chars.append(_ID_ALPHABET[rest])
    return "".join(chars)


def new_tool_call_id() -> str:
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(9))


def chat_url(base_url: str | None) -> str:
    base = (base_url or DEFAULT_BASE_URL).rstrip("/")
    # The SDK's server_url is the root, but people paste the /v1 URL too: accept both.
    if base.endswith("/v1"):
        return f"{base}/chat/completions"
    return f"{base}/v1/chat/completions"


def sdk_message(turn: WireMessage) -> ChatMessage | None:
    """The SDK's model of one message (building it validates it); None for one never sent."""
    if isinstance(turn, SystemText):
        return SystemMessage(content=turn.text)
    if isinstance(turn, UserTurn):
        return UserMessage(content=turn.text)
    if isinstance(turn, AssistantTurn):
        if turn.tool_calls:
            calls = [
                ToolCall(
                    id=mistral_tool_call_id(call.id),
                    function=FunctionCall(name=call.name, arguments=call.arguments or "{}"),
                )
                for call in turn.tool_calls
            ]
            if turn.text:
                return AssistantMessage(content=turn.text, tool_calls=calls)
            return AssistantMessage(tool_calls=calls)
        if turn.text:
            return AssistantMessage(content=turn.text)
        # An empty assistant turn (cancelled before any output) says nothing and the
        # API rejects an assistant message with neither content nor tool calls.
        return None
    return ToolMessage(
        content=turn.content,
        tool_call_id=mistral_tool_call_id(turn.call_id),
        name=turn.name,
    )


def build_messages(request: ProviderRequest) -> list[ChatMessage]:
    system = system_text(request)
    turns: list[WireMessage] = [system] if system is not None else []
    turns.extend(request.messages)
    return [m for m in map(sdk_message, turns) if m is not None]


def build_request(request: ProviderRequest) -> ChatCompletionStreamRequest:
    """The whole request as one SDK model: the reference the cached encoding must equal."""
    return _request_model(request, build_messages(request))


def _request_model(
    request: ProviderRequest, messages: list[ChatMessage]
) -> ChatCompletionStreamRequest:
    request_model, tool_model, function_model = request_models()
    options: dict[str, Any] = {}
    if request.tools:
        options["tools"] = [
            tool_model(
                function=function_model(
                    name=spec.name, description=spec.description, parameters=spec.parameters
                )
            )
            for spec in request.tools
        ]
        options["tool_choice"] = request.tool_choice
        options["parallel_tool_calls"] = True
    if request.max_tokens is not None:
        options["max_tokens"] = request.max_tokens
    if request.temperature is not None:
        options["temperature"] = request.temperature
    return request_model(model=request.model, messages=messages, stream=True, **options)


def encode_request(request: ProviderRequest) -> bytes:
    """The body in one go, every message built and serialized again (the slow reference)."""
    return build_request(request).model_dump_json(by_alias=True).encode("utf-8")


def encode_message(turn: WireMessage) -> bytes:
    """One message's wire JSON, exactly as it appears inside a serialized request.

    Empty for a message that is never sent; ``WireCache`` skips those. The SDK's model is
    built (that is the check), and its JSON written by ``wire_json``: the SDK's own
    serializers run Python code per model (the assistant message, each call and its
    function: ~11 of an assistant message's 16 µs). A text ``wire_json`` cannot write as
    UTF-8 (a lone surrogate) goes through the SDK, as before.
    """
    message = sdk_message(turn)
    if message is None:
        return b""
    try:
        return wire_json(turn)
    except pydantic_core.PydanticSerializationError:
        return message.model_dump_json(by_alias=True).encode("utf-8")


def _text(value: str) -> bytes:
    # pydantic-core's own JSON for a string, the SDK's serializer's (", \, controls as
    # \b \f \n \r \t or \u00XX, the rest as UTF-8): a 900-character tool result in
    # 1.1 µs against 5.8 through json.dumps (tests/test_provider_mistral.py holds
    # wire_json to the SDK's bytes). A lone surrogate raises (encode_message).
    return pydantic_core.to_json(value)


def wire_json(turn: WireMessage) -> bytes:
    """The JSON the SDK's model of ``turn`` serializes to (field order, defaults and all).

    For a message ``sdk_message`` builds (not an empty assistant turn).
    """
    if isinstance(turn, SystemText):
        return b'{"content":%s,"role":"system"}' % _text(turn.text)
    if isinstance(turn, UserTurn):
        return b'{"content":%s,"role":"user"}' % _text(turn.text)
    if isinstance(turn, AssistantTurn):
        parts = [b'{"role":"assistant"']
        if turn.text:
            parts.append(b',"content":' + _text(turn.text))
        if turn.tool_calls:
            calls = [
                b'{"function":{"name":%s,"arguments":%s},"id":%s,"type":"function","index":0}'
                % (
                    _text(call.name),
                    _text(call.arguments or "{}"),
                    _text(mistral_tool_call_id(call.id)),
                )
                for call in turn.tool_calls
            ]
            parts.append(b',"tool_calls":[%s]' % b",".join(calls))
        parts.append(b',"prefix":false}')
        return b"".join(parts)
    return b'{"content":%s,"role":"tool","tool_call_id":%s,"name":%s}' % (
        _text(turn.content),
        _text(mistral_tool_call_id(turn.call_id)),
        _text(turn.name),
    )


def _encode_whole(request: ProviderRequest, messages: list[ChatMessage]) -> bytes:
    return _request_model(request, messages).model_dump_json(by_alias=True).encode("utf-8")


def request_cache() -> WireCache:
    """Bodies byte-identical to ``encode_request``, each message built and checked once."""
    return WireCache(
        encode_message,
        _encode_whole,
        lambda text: SystemMessage(content=text),
        frame_key=frame_key,
    )


def frame_key(request: ProviderRequest) -> str | None:
    """What a request's frame is kept under in the machine's cache (``WireCache``).

    The frame is a function of the request's options and tools, the SDK's request
    models and pydantic (their sources' size and time, and versions), and the code here
    that builds it: all of it is in the key, the tools' schemas as JSON in their own key
    order (the serialized body keeps it). None when the CLI keeps no cache.
    """
    if not machine_cache.enabled():
        return None
    models = Path(sys.modules[SystemMessage.__module__].__file__ or "").parent
    stamp = machine_cache.source_stamp(
        __file__,
        sys.modules[WireCache.__module__].__file__,
        str(models / "chatcompletionstreamrequest.py"),
        str(models / "tool.py"),
        str(models / "function.py"),
        str(models.parent / "_version.py"),
    )
    if stamp is None:
        return None
    tools = [[spec.name, spec.description, spec.parameters] for spec in request.tools]
    options = [request.model, request.tool_choice, request.max_tokens, request.temperature]
    versions = [sys.version, pydantic.VERSION]
    try:
        text = json.dumps([versions, stamp, options, tools], ensure_ascii=False)
    except (TypeError, ValueError):
        return None  # a schema JSON cannot hold: built each time, and the SDK says why
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return f"mistral:{digest}"


def tokens_of(usage: UsageInfo | None) -> Tokens:
    if usage is None:
        return Tokens()
    return Tokens(input=usage.prompt_tokens or 0, output=usage.completion_tokens or 0)


def _parse_chunk(data: str) -> CompletionChunk:
    try:
        # The model's own validator, called as ``model_validate_json`` calls it (every
        # option at its default), without that method's frame around it.
        chunk: CompletionChunk = chunk_model().__pydantic_validator__.validate_json(data)
        return chunk
    except pydantic.ValidationError as exc:
        err = _stream_error(data)
        if err is not None:
            raise err from None
        raise ProviderError(f"mistral: malformed stream chunk: {data[:200]!r}") from exc


def _stream_error(data: str) -> ProviderError | None:
    try:
        parsed = json.loads(data)
    except ValueError:
        return None
    if not isinstance(parsed, dict):
        return None
    if parsed.get("error") or parsed.get("object") == "error":
        message = message_of(parsed) or data[:500]
        return error_for_body("mistral", message)
    return None


class MistralEvents(CallingEvents):
    """The events of one Mistral reply: each chunk validated by the SDK's ``CompletionChunk``,
    its text and reasoning as they come, the tool calls and the finish at the end."""

    __slots__ = ()

    def __init__(self, data: SSEData, model: str, prices: PriceTable) -> None:
        super().__init__(data, "mistral", model, prices)

    def take(self, payload: str) -> None:
        chunk = _parse_chunk(payload)
        if chunk.usage is not None:
            self._usage = chunk.usage
        ready = self._ready
        for choice in chunk.choices:
            delta = choice.delta
            content = delta.content
            if isinstance(content, str):
                if content:
                    ready.append(TextDelta(content))
            elif isinstance(content, list):
                for part in content:
                    if isinstance(part, TextChunk):
                        if part.text:
                            ready.append(TextDelta(part.text))
                    elif isinstance(part, ThinkChunk):
                        for thought in part.thinking:
                            if isinstance(thought, TextChunk) and thought.text:
                                ready.append(ReasoningDelta(thought.text))
            tool_calls = delta.tool_calls
            if isinstance(tool_calls, list):
                for call in tool_calls:
                    call_id = call.id if call.id and call.id != "null" else ""
                    self._calls.add(
                        call.index or 0, call_id, call.function.name, call.function.arguments
                    )
            if choice.finish_reason is not None:
                self._finish = str(choice.finish_reason)

    def tokens(self) -> Tokens:
        usage: UsageInfo | None = self._usage
        return tokens_of(usage)

    def new_call_id(self) -> str:
        return new_tool_call_id()


class MistralProvider:
    name = "mistral"

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None,
        base_url: str | None = None,
        http_client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        prices: PriceTable | None = None,
    ) -> None:
        if not api_key:
            raise AuthError(
                f"{KEY_ENV} is not set: export {KEY_ENV}=<your key> "
                "(https://console.mistral.ai/api-keys)"
            )
        self.model = model
        self.url = chat_url(base_url)
        self._headers = {
            "Authorization": f"Bearer {api_key}",
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
        }
        self._owns_client = http_client is None
        self._client = (
            http_client if http_client is not None else new_client(self.url, TIMEOUT, transport)
        )
        self._prices = prices if prices is not None else default_prices("mistral")
        self._post = PostTemplate(self._client, self.url, self._headers)
        self._requests = request_cache()

    def stream(self, request: ProviderRequest) -> ChatStream:
        return ChatStream(self._post, self._requests, request, self.name, KEY_ENV, self._events)

    def _events(self, data: SSEData, request: ProviderRequest) -> MistralEvents:
        chunk_model()  # the reply has begun: its first token is still to come
        return MistralEvents(data, request.model or self.model, self._prices)

    def forget_requests(self) -> None:
        """Drop the cached wire forms (the session calls this when a turn ends)."""
        self._requests.clear()

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()
