"""The session's task list: what ``todowrite`` stores and ``todo.updated`` carries."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

TodoStatus = Literal["pending", "in_progress", "completed", "cancelled"]
TodoPriority = Literal["high", "medium", "low"]


class Todo(BaseModel):
    # Built on first use (defer_build): not needed before a run's first request.
    model_config = ConfigDict(extra="forbid", defer_build=True)

    content: str = Field(min_length=1, max_length=2000, description="What to do, briefly")
    status: TodoStatus = Field(
        description="pending, in_progress (one at a time), completed or cancelled"
    )
    priority: TodoPriority = Field(default="medium", description="high, medium or low")


class TodoList(BaseModel):
    """A session's whole task list: the payload of ``todo.updated``."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    session_id: str
    todos: list[Todo]
