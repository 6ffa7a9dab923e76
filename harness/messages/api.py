"""Request bodies of the daemon API (DESIGN §9), validated at the socket.

Unknown fields are refused, so a typo (``"delivry"``) is a 422 naming the field rather
than a silently ignored setting. Every free-text field has a cap (the ``MAX_*`` below, in
README's API section): one client's 9 MB title would otherwise be in every answer of
``GET /v1/sessions`` from then on.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from harness.messages.model import Delivery, PermissionAction, RevertAction, Rule
from harness.messages.permission import Reply

MAX_TITLE = 200  # characters
MAX_PATH_BYTES = 4096  # PATH_MAX: the kernel refuses a longer path (ENAMETOOLONG)
MAX_MODEL = MAX_PATH_BYTES + 64  # a scripted:/replay: model carries a file path
MAX_NAME = 64  # an agent's name, a rule's permission
MAX_URL = 2048
MAX_PROMPT = 1_000_000  # characters: a pasted file fits; the body cap is 10 MB
MAX_ID = 200  # a client-chosen message id
MAX_RULES = 256
MAX_PATTERN = 4096
MAX_MESSAGE = 100_000  # feedback the model reads with a rejection
MAX_STEPS = 10_000
MAX_ANSWERS = 64  # questions in one set, and answers to one question
MAX_ANSWER = 10_000


def _path_fits(value: str) -> str:
    # PATH_MAX counts bytes, not characters; a lone surrogate cannot be a path at all.
    if len(value.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise ValueError(f"a directory is at most {MAX_PATH_BYTES} bytes (PATH_MAX)")
    if "\x00" in value:
        raise ValueError("a directory cannot hold a NUL character")
    return value


def _integral(value: object) -> object:
    # JSON has one number type: 10.0 is the integer 10 (JSON Schema agrees), but strict
    # mode refuses a float. Any other float, a string or a bool is still refused.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# The pattern documents the NUL rule in the OpenAPI document; _path_fits enforces it with
# a message that says why (a schema-valid request must never be refused as malformed).
Directory = Annotated[
    str,
    Field(min_length=1, json_schema_extra={"pattern": "^[^\\x00]*$"}),
    AfterValidator(_path_fits),
]
StepLimit = Annotated[int, Field(ge=1, le=MAX_STEPS), BeforeValidator(_integral)]
MessageId = Annotated[str, Field(min_length=1, max_length=MAX_ID, pattern=r"^[A-Za-z0-9_\-]+$")]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ApiRule(_Body):
    """A permission rule as a client sends it: ``Rule`` with sizes capped."""

    permission: str = Field(min_length=1, max_length=MAX_NAME)
    pattern: str = Field(default="*", min_length=1, max_length=MAX_PATTERN)
    action: PermissionAction

    def rule(self) -> Rule:
        return Rule.model_validate(self.model_dump())


class CreateSessionBody(_Body):
    directory: Directory | None = None
    model: str | None = Field(default=None, min_length=1, max_length=MAX_MODEL)
    base_url: str | None = Field(default=None, min_length=1, max_length=MAX_URL)
    agent: str | None = Field(default=None, min_length=1, max_length=MAX_NAME)
    title: str = Field(default="", max_length=MAX_TITLE)
    permission: list[ApiRule] = Field(default_factory=list, max_length=MAX_RULES)

    def rules(self) -> list[Rule]:
        return [rule.rule() for rule in self.permission]


class UpdateSessionBody(_Body):
    """``PATCH /v1/sessions/{id}``: the settings a later turn uses; omitted ones stay.

    ``permission`` adds rules after the session's own (the last matching rule wins, so
    they take precedence); ``base_url`` replaces the provider's server (null: back to
    the daemon's).
    """

    title: str | None = Field(default=None, max_length=MAX_TITLE)
    permission: list[ApiRule] = Field(default_factory=list, max_length=MAX_RULES)
    base_url: str | None = Field(default=None, min_length=1, max_length=MAX_URL)
    model: str | None = Field(default=None, min_length=1, max_length=MAX_MODEL)
    agent: str | None = Field(default=None, min_length=1, max_length=MAX_NAME)

    def rules(self) -> list[Rule]:
        return [rule.rule() for rule in self.permission]


class CompactBody(_Body):
    """``POST /v1/sessions/{id}/compact``: queue a compaction turn (chat's ``/compact``)."""

    message_id: MessageId | None = None


class RevertBody(_Body):
    """``POST /v1/sessions/{id}/revert``: put the workspace back as before this message."""

    message_id: str = Field(min_length=1, max_length=MAX_ID)


class PromptBody(_Body):
    text: str = Field(min_length=1, max_length=MAX_PROMPT)
    delivery: Delivery = "queue"
    message_id: MessageId | None = None
    # This turn only: stop after N model steps (reason max_steps), as `run --max-steps`.
    max_steps: StepLimit | None = None


class PermissionReplyBody(_Body):
    reply: Reply
    message: str | None = Field(default=None, max_length=MAX_MESSAGE)
    # A client with nobody to ask rejects on their behalf: the record then says so, with
    # the flag that would allow the call, as an embedded run's record does.
    no_terminal: bool = False


Answer = Annotated[str, Field(max_length=MAX_ANSWER)]


class QuestionReplyBody(_Body):
    """``{answers: [[label, ...], ...]}`` (one list per question) or ``{reject: true}``.

    A rejection with a ``message`` lets the model carry on with that message; a bare one
    stops the turn, like a rejected permission.
    """

    # The rule of ``_one_of``, in the document too: a schema-valid body is a valid one.
    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [
                {
                    "required": ["answers"],
                    "properties": {"answers": {"type": "array"}, "reject": {"const": False}},
                },
                {
                    "required": ["reject"],
                    "properties": {"answers": {"type": "null"}, "reject": {"const": True}},
                },
            ]
        }
    )

    answers: (
        list[Annotated[list[Answer], Field(max_length=MAX_ANSWERS)]] | None
    ) = Field(default=None, max_length=MAX_ANSWERS)
    reject: bool = False
    message: str | None = Field(default=None, max_length=MAX_MESSAGE)

    @model_validator(mode="after")
    def _one_of(self) -> QuestionReplyBody:
        if self.reject == (self.answers is not None):
            raise ValueError("give either answers (one list per question) or reject: true")
        return self


# --- response bodies ---------------------------------------------------------------------
# What the daemon answers, as models: the server builds each answer through one of these
# (so a field added to an answer without its model fails loudly, in tests, rather than
# drifting from the document), and ``GET /v1/openapi.json`` is generated from them.

class _Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorDetail(_Answer):
    code: str = Field(description="A stable machine-readable code, e.g. not_found, invalid_body")
    message: str = Field(description="What went wrong, for a person")


class ErrorBody(_Answer):
    """Every 4xx and 5xx answer of the daemon: ``{"error": {"code", "message"}}``."""

    error: ErrorDetail


class Health(_Answer):
    ok: Literal[True] = True
    pid: int = Field(description="The daemon's process id")
    last_seq: int = Field(description="The ledger's last event seq (0: none yet)")
    sandbox: str = Field(description="What commands run under: workspace-write, read-only or off")


class McpServerStatus(_Answer):
    """One configured MCP server, as ``harness mcp`` prints it."""

    name: str
    transport: Literal["stdio", "http"] | str
    state: Literal["idle", "starting", "running", "failed", "exited", "disabled"]
    tools: int = Field(description="How many of its tools the model is offered")
    schema_tokens: int = Field(description="Estimated tokens its tools' schemas take")
    last_error: str | None
    prompts: list[str] = []
    resources: bool = False
    warnings: list[str] = []


class McpStatus(_Answer):
    """The daemon's MCP servers: idle until a turn first starts them (DESIGN §12)."""

    servers: list[McpServerStatus]
    schema_tokens: int
    search_threshold: int
    tool_search: bool = Field(description="Whether the model gets mcp_search instead")


class SessionDeleted(_Answer):
    id: str
    deleted: Literal[True] = True


class PromptAccepted(_Answer):
    """The input is durable; the turn runs after this answer (follow it on /v1/events)."""

    message_id: str


class CancelAnswer(_Answer):
    cancelled: bool = Field(description="Whether a turn was running or queued to cancel")


class DiffFile(_Answer):
    path: str
    added: int
    removed: int


class SessionDiff(_Answer):
    session_id: str
    files: list[DiffFile]
    diff: str = Field(description="A unified diff of every file the session changed")


class RevertedFile(_Answer):
    path: str = Field(description="The absolute path")
    shown: str = Field(description="The path as shown: relative to the session directory")
    action: RevertAction
    before: str | None = Field(description="The content hash before the revert (None: no file)")
    after: str | None = Field(description="The content hash after it (None: no file)")


class Reverted(_Answer):
    id: str = Field(description="The revert's id (rev_…)")
    session_id: str
    message_id: str
    files: list[RevertedFile]


class PermissionReplied(_Answer):
    id: str
    reply: Reply


class QuestionAnswered(_Answer):
    id: str
    answers: list[list[str]]


class QuestionRejected(_Answer):
    id: str
    rejected: Literal[True] = True
