"""Python tools: ``@harness.tool`` turns a typed function into a tool (DESIGN §12).

The function's signature is the tool's parameter model (pydantic builds it, so its JSON
schema is what the model sees and the model's arguments are validated against it like
any tool's: they are untrusted input); its docstring is the description. A parameter
annotated ``ToolContext`` is the call's context, filled in by the executor and never
shown to the model. The permission is the tool's name, ``ask`` unless a rule or the
decorator's ``permission=`` says otherwise.

An ``async`` function runs in the call's cancel scope, so cancelling the session reaches
it mid-await; a plain one runs in a worker thread (blocking work must not stall every
session on the one Trio thread), abandoned on a cancel like a search: the call ends at
once and whatever the function returns later is dropped.

The return value is the output: a string as it is, anything else as JSON. An exception is
an error result the model reads, as one line (``ValueError: no such ticket``); its
traceback goes to the log only.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
import typing
from collections.abc import Callable
from typing import Any, Literal, get_type_hints

import structlog
import trio
from pydantic import create_model
from pydantic_core import PydanticSerializationError, to_json

from harness.config import ConfigError
from harness.messages.model import Rule
from harness.messages.permission import PermissionNeed
from harness.permissions.ruleset import permission_for_tool
from harness.tools.base import Tool, ToolContext, ToolFailure, ToolOutput, ToolParams

log = structlog.get_logger("harness.tools")

Action = Literal["allow", "ask", "deny"]

# What providers accept as a function name (OpenAI and Mistral alike).
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# How much of an exception's message the model reads; the rest is in the log.
MAX_ERROR_CHARS = 2000


class ToolDefinitionError(ConfigError):
    """A function cannot be a tool, or a tool cannot join the table: says which and why."""


class PythonTool(Tool[ToolParams]):
    """A Python function as a tool. Calling it calls the function, so it stays testable."""

    # Set per instance (a tool per function); the class attributes of ``Tool`` are what
    # built-in tools set once for all their calls.
    name = ""
    description = ""

    def __init__(
        self,
        function: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        permission: Action = "ask",
        replaces: bool = False,
    ) -> None:
        if inspect.isclass(function) or not callable(function):
            raise ToolDefinitionError(f"{function!r} is not a function")
        tool_name = name if name is not None else getattr(function, "__name__", "")
        if not _NAME.match(tool_name):
            raise ToolDefinitionError(
                f"tool name {tool_name!r}: 1 to 64 letters, digits, '_' or '-' (pass name=...)"
            )
        text = description if description is not None else inspect.getdoc(function)
        if not text or not text.strip():
            raise ToolDefinitionError(
                f"tool {tool_name!r}: no docstring; the model needs a description "
                "(write one, or pass description=...)"
            )
        if permission not in ("allow", "ask", "deny"):
            raise ToolDefinitionError(
                f"tool {tool_name!r}: permission must be 'allow', 'ask' or 'deny'"
            )
        if replaces and permission != "ask":
            raise ToolDefinitionError(
                f"tool {tool_name!r}: a replacement answers to the built-in's permission "
                f"{permission_for_tool(tool_name)!r}, set by rules; permission= cannot change it"
            )
        if inspect.isasyncgenfunction(function):
            raise ToolDefinitionError(f"tool {tool_name!r}: an async generator is not a tool")
        self.function = function
        # Instance attributes shadow the ClassVars: each function is its own tool.
        self.__dict__["name"] = tool_name
        self.__dict__["description"] = text.strip()
        self.permission = permission
        self.replaces = replaces
        self.is_async = _is_async(function)
        self.params, self._context_names = _params_model(function, tool_name)
        functools.update_wrapper(self, function)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.function(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<harness tool {self.name!r} of {self.function!r}>"

    def default_rule(self) -> Rule:
        """The decorator's ``permission=``, as a rule at the defaults' layer: config,
        agent and session rules come later and win."""
        return Rule(permission=permission_for_tool(self.name), pattern="*", action=self.permission)

    def permissions(self, args: ToolParams, ctx: ToolContext) -> list[PermissionNeed]:
        permission = permission_for_tool(self.name)
        return [PermissionNeed(permission, "*", "*", {"input": args.model_dump(mode="json")})]

    async def execute(self, args: ToolParams, ctx: ToolContext) -> ToolOutput:
        # The validated values, as the model's types: a nested model stays a model.
        kwargs = {field: getattr(args, field) for field in type(args).model_fields}
        kwargs.update(dict.fromkeys(self._context_names, ctx))
        call = functools.partial(self.function, **kwargs)
        try:
            if self.is_async:
                result = await call()
            else:
                result = await trio.to_thread.run_sync(call, abandon_on_cancel=True)
        except ToolFailure:
            raise
        except Exception as error:
            # Not the executor's generic handler: the model reads the exception, not the
            # harness's wording around it, and a long message is cut.
            log.warning("python tool raised", tool=self.name, exc_info=True)
            raise ToolFailure(_one_line(error)) from None
        return _output(self.name, result)


def _is_async(function: Callable[..., Any]) -> bool:
    """An ``async def``, also behind a partial or as an object's ``async __call__``."""
    target = function.func if isinstance(function, functools.partial) else function
    if inspect.iscoroutinefunction(target):
        return True
    return not inspect.isfunction(target) and inspect.iscoroutinefunction(type(target).__call__)


def _one_line(error: Exception) -> str:
    message = " ".join(str(error).split())
    text = f"{type(error).__name__}: {message}" if message else type(error).__name__
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "…"


def _output(name: str, result: Any) -> ToolOutput:
    if isinstance(result, ToolOutput):
        return result
    if isinstance(result, str):
        return ToolOutput(result)
    if result is None:
        return ToolOutput("")
    try:
        return ToolOutput(to_json(result).decode("utf-8"))
    except PydanticSerializationError:
        raise ToolFailure(
            f"tool {name!r} returned a {type(result).__name__}, which is not JSON-able: "
            "return a str, or data JSON can carry"
        ) from None


def _is_context(annotation: Any) -> bool:
    if annotation is ToolContext:
        return True
    # Optional[ToolContext] and Annotated[ToolContext, ...] are the context too.
    return typing.get_origin(annotation) is not None and any(
        _is_context(arg) for arg in typing.get_args(annotation) if arg is not type(None)
    )


def _params_model(
    function: Callable[..., Any], name: str
) -> tuple[type[ToolParams], tuple[str, ...]]:
    """The parameter model of ``function`` and the names its context is passed under."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError) as error:
        raise ToolDefinitionError(f"tool {name!r}: no readable signature: {error}") from None
    try:
        hints = get_type_hints(function, include_extras=True)
    except Exception as error:
        # A string annotation naming what the module does not define.
        raise ToolDefinitionError(
            f"tool {name!r}: its annotations cannot be resolved: {type(error).__name__}: {error}"
        ) from None
    fields: dict[str, Any] = {}
    context: list[str] = []
    for parameter in signature.parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise ToolDefinitionError(
                f"tool {name!r}: *{parameter.name} has no schema; name every parameter"
            )
        if parameter.kind is parameter.POSITIONAL_ONLY:
            raise ToolDefinitionError(
                f"tool {name!r}: {parameter.name} is positional-only; arguments are passed by name"
            )
        annotation = hints.get(parameter.name, Any)
        if _is_context(annotation):
            context.append(parameter.name)
            continue
        default = ... if parameter.default is parameter.empty else parameter.default
        fields[parameter.name] = (annotation, default)
    try:
        model = create_model(
            f"{_camel(name)}Params", __base__=ToolParams, __module__=__name__, **fields
        )
        model.model_json_schema()  # a type pydantic cannot describe fails here, not later
    except Exception as error:
        raise ToolDefinitionError(
            f"tool {name!r}: its parameters have no JSON schema: {type(error).__name__}: "
            f"{' '.join(str(error).split())[:300]}"
        ) from None
    return model, tuple(context)


def _camel(name: str) -> str:
    return "".join(piece.capitalize() for piece in re.split(r"[_-]", name)) or "Tool"


def tool(
    function: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    permission: Action = "ask",
    replaces: bool = False,
) -> Any:
    """Make ``function`` a tool: ``@harness.tool`` or ``@harness.tool(permission="allow")``.

    ``name`` defaults to the function's name and ``description`` to its docstring;
    ``permission`` is the tool's default action (rules still win); ``replaces=True`` lets
    it take the place of the built-in tool of the same name. Raises
    ``ToolDefinitionError`` (a ``harness.ConfigError``) at once for a function that
    cannot be a tool.
    """

    def wrap(target: Callable[..., Any]) -> PythonTool:
        return PythonTool(
            target, name=name, description=description, permission=permission, replaces=replaces
        )

    return wrap if function is None else wrap(function)


def as_tool(entry: object, where: str) -> Tool[Any]:
    """A ``Config.tools`` entry as a tool: a tool, a plain function (made a tool with the
    defaults), or ``"module:attribute"`` naming one. ``where`` starts the error."""
    if isinstance(entry, str):
        entry = _import(entry, where)
        where = f"{where}: {entry!r}"
    if isinstance(entry, Tool):
        return entry
    if inspect.isclass(entry) or not callable(entry):
        raise ToolDefinitionError(
            f"{where}: not a tool or a function, but a {type(entry).__name__}"
        )
    try:
        return PythonTool(entry)
    except ToolDefinitionError as error:
        raise ToolDefinitionError(f"{where}: {error}") from None


def _import(entry: str, where: str) -> object:
    module_name, colon, attribute = entry.partition(":")
    if not colon or not module_name or not attribute:
        raise ToolDefinitionError(f"{where}: {entry!r}: expected 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:
        # Whatever the module raised on import: one line, the entry named.
        raise ToolDefinitionError(
            f"{where}: {entry!r}: cannot import {module_name}: {_one_line(error)}"
        ) from None
    value: object = module
    for piece in attribute.split("."):
        try:
            value = getattr(value, piece)
        except AttributeError:
            raise ToolDefinitionError(
                f"{where}: {entry!r}: {module_name} has no attribute {attribute!r}"
            ) from None
    return value


__all__ = ["PythonTool", "ToolDefinitionError", "as_tool", "tool"]
