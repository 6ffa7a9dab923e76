"""The ``Todos`` a session gives its tool calls: its task list, in the ledger."""

from __future__ import annotations

from harness.messages.events import NewEvent
from harness.messages.todo import Todo, TodoList
from harness.storage.port import LedgerPort


class SessionTodos:
    def __init__(self, session_id: str, ledger: LedgerPort) -> None:
        self._session_id = session_id
        self._ledger = ledger

    def read(self) -> list[Todo]:
        return self._ledger.todos(self._session_id)

    async def write(self, todos: list[Todo]) -> None:
        todo_list = TodoList(session_id=self._session_id, todos=todos)
        # Awaited: a todoread in the very next step must see it.
        await self._ledger.write([NewEvent.of("todo.updated", self._session_id, todo_list)])
