"""harness.machine_cache: the CLI keeps the tools' JSON schemas and Mistral's request
frames per machine (issue 14), and a value found there is exactly what deriving it gives.

The end-to-end cases run the real ``harness run`` twice against the local wire server,
with a cache directory of their own; the others enable the cache in this process.
"""

from __future__ import annotations

import importlib
import json
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from mistralai.client.models import ChatCompletionStreamRequest
from pydantic import BaseModel, create_model
from test_lazy_imports import _FIRST_REQUEST_PROBE
from wire_server import Reply, chunk, wire_server

from harness import machine_cache
from harness.messages.provider import ProviderRequest, ToolSpec, UserTurn
from harness.providers import mistral
from harness.providers.wire import FRAME_CACHE
from harness.tools.registry import builtin_tools, params_schema, tool_specs
from harness.tools.schema_key import SCHEMA_CACHE, _Walk, schema_key

SDK_REQUEST_MODULE = "mistralai.client.models.chatcompletionstreamrequest"


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The cache enabled in this process, in a directory of the test's own."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    machine_cache.disable()
    machine_cache.enable()
    try:
        yield tmp_path / "xdg" / "harness"
    finally:
        machine_cache.disable()


async def _first_request(tmp_path: Path, project: Path, xdg: Path, run: int) -> dict[str, Any]:
    """One ``harness run --model mistral/…``: what it had loaded and built at its first
    request (as in test_lazy_imports), and the body it sent."""
    report = tmp_path / f"report-{run}.json"
    async with wire_server(Reply(events=[chunk("ok", finish="stop")])) as server:
        env = dict(os.environ)
        env |= {
            "HARNESS_HOME": str(tmp_path / f"home-{run}"),
            "HARNESS_SOCKET": str(tmp_path / "no.sock"),
            "MISTRAL_API_KEY": "test-key",
            "XDG_CACHE_HOME": str(xdg),
        }
        command = [sys.executable, "-c", _FIRST_REQUEST_PROBE, str(report), "run", "--embedded"]
        command += ["--model", "mistral/devstral-medium-latest", "--base-url", server.url]
        command += ["--dir", str(project), "hi"]
        done = await trio.run_process(command, env=env, capture_stdout=True, capture_stderr=True)
        assert len(server.requests) == 1, done.stderr
    result = json.loads(report.read_text())
    assert result["code"] in (0, None), done.stderr
    assert done.stdout.decode().strip() == "ok"
    return {**result, "body": server.requests[0].body}


async def test_a_second_run_sends_the_same_bytes_without_building_what_the_cache_holds(
    tmp_path: Path, project: Path
) -> None:
    xdg = tmp_path / "xdg"
    first = await _first_request(tmp_path, project, xdg, 1)
    second = await _first_request(tmp_path, project, xdg, 2)
    # The first run derived everything: the SDK's request model, the tools' models.
    assert SDK_REQUEST_MODULE in first["loaded"]
    assert "harness.tools.read.ReadParams" in first["built"]
    # The second took both from the cache, and its request is the same, byte for byte.
    assert SDK_REQUEST_MODULE not in second["loaded"]
    tool_models = [m for m in second["built"] if m.startswith("harness.tools.")]
    assert tool_models == []
    assert second["body"] == first["body"]
    request = ChatCompletionStreamRequest.model_validate_json(second["body"])
    assert request.tools and {t.function.name for t in request.tools} >= {"read", "bash"}
    # Kept as the user's own: 0700 directory, 0600 files.
    folder = xdg / "harness"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for name in (f"{SCHEMA_CACHE}.json", f"{FRAME_CACHE}.json"):
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600


async def test_a_cache_file_others_may_write_or_that_does_not_parse_is_ignored(
    tmp_path: Path, project: Path
) -> None:
    xdg = tmp_path / "xdg"
    reference = await _first_request(tmp_path, project, xdg, 1)
    folder = xdg / "harness"
    frames = folder / f"{FRAME_CACHE}.json"
    frames.chmod(0o666)  # anyone may write it: not trusted
    schemas = folder / f"{SCHEMA_CACHE}.json"
    schemas.write_text('{"format": 1, "entries": {')  # cut short
    second = await _first_request(tmp_path, project, xdg, 2)
    assert SDK_REQUEST_MODULE in second["loaded"]  # the frame was made again
    assert "harness.tools.read.ReadParams" in second["built"]  # and the schemas
    assert second["body"] == reference["body"]


READ_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}}
TOOLS = (
    ToolSpec("read", "Read a file.", READ_SCHEMA),
    ToolSpec("bash", "Run a command.", {"properties": {"command": {}}, "type": "object"}),
)


def _request(*, tools: tuple[ToolSpec, ...] = TOOLS, model: str = "devstral") -> ProviderRequest:
    return ProviderRequest(model, ("be brief",), (UserTurn("hi"),), tools, "auto")


def test_a_kept_frame_gives_the_bytes_the_sdk_model_gives(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = _request()
    assert mistral.request_cache().body(request) == mistral.encode_request(request)
    machine_cache.save()
    machine_cache.disable()
    machine_cache.enable()  # a new process, as far as the cache can tell: read from the file

    def no_models() -> None:
        raise AssertionError("the frame should come from the cache")

    with monkeypatch.context() as patched:
        patched.setattr(mistral, "request_models", no_models)
        body = mistral.request_cache().body(request)
    assert body == mistral.encode_request(request)
    ChatCompletionStreamRequest.model_validate_json(body)


def test_each_input_of_a_frame_is_in_its_key(cache_dir: Path) -> None:
    base = _request()
    schema = {"type": "object", "properties": {"command": {}}}
    reordered = ToolSpec("bash", "Run a command.", schema)
    variants = [
        _request(model="other"),
        _request(tools=TOOLS[:1]),
        _request(tools=(TOOLS[0], reordered)),  # the same schema, its keys in another order
        ProviderRequest("devstral", (), (), TOOLS, "none"),
        ProviderRequest("devstral", (), (), TOOLS, "auto", max_tokens=10),
        ProviderRequest("devstral", (), (), TOOLS, "auto", temperature=0.5),
    ]
    keys = {mistral.frame_key(r) for r in [base, *variants]}
    assert None not in keys and len(keys) == 1 + len(variants)
    for variant in variants:  # and each key's frame is its own request's
        assert mistral.request_cache().body(variant) == mistral.encode_request(variant)
    # The system prompt and the messages are not part of the frame.
    assert mistral.frame_key(ProviderRequest("devstral", ("x",), (), TOOLS)) == mistral.frame_key(
        ProviderRequest("devstral", ("y",), (UserTurn("z"),), TOOLS)
    )


def test_a_kept_value_of_the_wrong_shape_is_derived_again(cache_dir: Path) -> None:
    request = _request()
    key = mistral.frame_key(request)
    assert key is not None
    for wrong in ({"head": "{"}, ["{", 1], "{", ["a", "b", "c"]):
        machine_cache.store(FRAME_CACHE, key, wrong)
        assert mistral.request_cache().body(request) == mistral.encode_request(request)
    read = builtin_tools()["read"].params
    schema_of_read = schema_key(read)
    assert schema_of_read is not None
    machine_cache.store(SCHEMA_CACHE, schema_of_read, ["not", "a", "schema"])
    assert params_schema(read) == read.model_json_schema()


def test_tool_specs_from_the_cache_are_the_models_schemas(cache_dir: Path) -> None:
    tools = builtin_tools()
    fresh = {name: tool.params.model_json_schema() for name, tool in tools.items()}
    assert {n: s.parameters for n, s in tool_specs(tools).items()} == fresh  # stored
    machine_cache.save()
    machine_cache.disable()
    machine_cache.enable()
    kept = json.loads((cache_dir / f"{SCHEMA_CACHE}.json").read_text())["entries"]
    assert len(kept) == len(tools)
    assert {n: s.parameters for n, s in tool_specs(tools).items()} == fresh  # looked up


_MODULE = '''
from enum import Enum
from pydantic import BaseModel, Field
from {pkg}.limits import LIMIT

class Colour(Enum):
    RED = "red"
    BLUE = "{blue}"

class Inner(BaseModel):
    depth: int = Field(default=1, description="{inner}")

class Params(BaseModel):
    """{doc}"""
    name: str = Field(description="the name; at most " + str(LIMIT))
    inner: Inner
    colour: Colour = Colour.RED
'''


def _params(root: Path, pkg: str, *, limit: int = 5, **text: str) -> type[BaseModel]:
    """``Params`` of a package written to ``root``, imported."""
    values = {"blue": "blue", "inner": "depth", "doc": "Params."} | text
    package = root / pkg
    package.mkdir(exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "limits.py").write_text(f"LIMIT = {limit}\n")
    (package / "model.py").write_text(_MODULE.format(pkg=pkg, **values))
    importlib.invalidate_caches()
    module = importlib.import_module(f"{pkg}.model")
    params: type[BaseModel] = module.Params
    return params


def _described(model: type[BaseModel], pkg: str) -> str:
    """What the key says of the model itself, its package's name left out."""
    return repr(_Walk().model(model)).replace(pkg, "PKG")


def test_the_schema_key_follows_everything_that_shapes_the_schema(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    reference = _described(_params(tmp_path, "schema_a"), "schema_a")
    assert _described(_params(tmp_path, "schema_b"), "schema_b") == reference  # same source
    changes: list[dict[str, Any]] = [
        {"doc": "Other."},  # the docstring (the schema's description)
        {"inner": "how deep"},  # a nested model's field
        {"blue": "navy"},  # an enum's value
        {"limit": 7},  # a constant another module puts in a description
    ]
    for index, change in enumerate(changes):
        pkg = f"schema_c{index}"
        assert _described(_params(tmp_path, pkg, **change), pkg) != reference, change
    # The files of the model's modules are in the key: touching one changes it.
    model = _params(tmp_path, "schema_d")
    key = schema_key(model)
    assert key is not None and key == schema_key(model)
    source = Path(sys.modules["schema_d.model"].__file__ or "")
    info = source.stat()
    os.utime(source, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000))
    assert schema_key(model) not in (None, key)
    # A model create_model made has no file of its own: no key, built each time.
    assert schema_key(create_model("Made", __base__=BaseModel, x=(int, 1))) is None


def test_what_a_caller_does_with_a_value_is_not_kept(cache_dir: Path) -> None:
    value = {"a": [1, 2]}
    machine_cache.store("kind", "k", value)
    value["a"].append(3)  # after it was stored
    machine_cache.save()
    machine_cache.disable()
    machine_cache.enable()
    found = machine_cache.lookup("kind", "k")
    assert found == {"a": [1, 2]}
    found["a"].clear()  # a looked-up value changed in place, then another entry stored
    machine_cache.store("kind", "other", 1)
    machine_cache.save()
    machine_cache.disable()
    machine_cache.enable()
    assert machine_cache.lookup("kind", "k") == {"a": [1, 2]}
    assert machine_cache.lookup("kind", "other") == 1
    machine_cache.store("kind", "not json", {1j})
    assert machine_cache.lookup("kind", "not json") is None
