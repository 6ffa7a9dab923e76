"""Typed provider errors (DESIGN §6): the runner decides what to do from the type alone."""

from __future__ import annotations


class ProviderError(Exception):
    """A provider failed; ``str(error)`` is a message fit to show a user."""

    retryable: bool = False

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class RetryableError(ProviderError):
    """Rate limits, 5xx, dropped connections: worth another attempt after a wait."""

    retryable = True


class TruncatedStreamError(RetryableError):
    """The stream ended without a finish reason: a cut reply, never a success."""


class ContextOverflowError(ProviderError):
    """The request does not fit the model's context window (compaction may help)."""


class AuthError(ProviderError):
    """The provider refused the credentials."""


class BadRequestError(ProviderError):
    """The provider rejected the request itself; retrying it unchanged cannot help."""
