"""The error both ends of the daemon API share (DESIGN §9).

Standard library only: ``harness.client`` imports it and must stay free of Trio and
pydantic so the CLI's read commands start fast.
"""

from __future__ import annotations


class ApiError(Exception):
    """A request the daemon API refuses: its HTTP status, error code and message.

    The server raises it to answer ``{"error": {"code", "message"}}`` with ``status``;
    the client raises it when it reads such an answer.
    """

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
